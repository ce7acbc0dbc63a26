"""router/policies is the router's pure decision layer: no I/O, no engine, no upper layer in it.

import-linter's layers contract keeps router below launch/planner/cli; this adds what is specific to
the policies: nothing from the router's I/O modules, asyncio, Redis, gRPC, protobuf or vLLM."""

import ast
from pathlib import Path

POLICIES = Path(__file__).resolve().parents[4] / "router" / "policies"
FORBIDDEN_ROOTS = {"asyncio", "redis", "grpc", "google", "vllm", "torch", "launch", "planner", "cli", "loadgen",
                   "prefill_worker", "decode_worker", "kv_transfer", "socket", "subprocess", "httpx", "fastapi"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def test_policies_import_nothing_that_does_io():
    files = sorted(POLICIES.rglob("*.py"))
    assert len(files) >= 14
    offending = {}
    for path in files:
        bad = {name for name in _imports(path)
               if name.split(".")[0] in FORBIDDEN_ROOTS or name.startswith("pdserve.v1")
               or (name.split(".")[0] == "router" and not name.startswith("router.policies"))}
        if bad:
            offending[str(path.relative_to(POLICIES))] = sorted(bad)
    assert offending == {}
