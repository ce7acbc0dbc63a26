"""Long fuzzing of both public APIs on a real cluster (issue 18 item 6): the benchmark form of
tests/integration/test_api_fuzz.py, with the same inputs (tests/api_fuzz_inputs.py) and the same
invariants after every input (tests/api_fuzz.FuzzTarget): no 5xx / INTERNAL / UNKNOWN, no hang, no
process down, no worker quarantined or charged, a valid request right after each bad one served.

Unlike the test, a broken invariant does not stop the run: it is recorded with the input that
broke it (unshrunk) and the run goes on. Prints progress, then the statuses seen and the failures;
`--out` writes them as JSON. Exit code 1 when any invariant broke.

    flock /tmp/pdserve-integration.lock .venv/bin/python bench/fuzz_api.py --examples 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the fuzzing inputs and target live with the tests

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from api_fuzz import VALID_GRPC, FuzzFailure, FuzzTarget  # noqa: E402
from api_fuzz_inputs import (  # noqa: E402
    chat_bodies, completion_bodies, encode_json, generate_requests, mutated_messages, raw_bodies,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=500,
                        help="inputs per fuzzer (4 fuzzers: HTTP JSON, raw HTTP, gRPC messages, raw gRPC bytes; "
                             "the raw ones get a quarter); default 500")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (a run is reproducible); default 0")
    parser.add_argument("--model", default=str(REPO / "models" / "tiny"), help="model folder (default: the tiny model, "
                                                                              "built if missing)")
    parser.add_argument("--out", help="write the statuses and failures here as JSON")
    return parser.parse_args(argv)


class Run:
    """Sends inputs through a FuzzTarget, records failures instead of raising, prints progress."""

    def __init__(self, target: FuzzTarget):
        self.target = target
        self.failures: list[dict] = []
        self.sent = Counter()
        self.started_s = time.monotonic()

    def send(self, fuzzer: str, send, *args) -> None:
        self.sent[fuzzer] += 1
        try:
            send(*args)
        except FuzzFailure as failure:
            self.failures.append({"fuzzer": fuzzer, "input": repr(args)[:2000], "failure": str(failure)})
            print(f"  FAILURE ({fuzzer}): {str(failure)[:300]}", flush=True)
        if sum(self.sent.values()) % 25 == 0:
            print(f"  {dict(self.sent)} sent in {time.monotonic() - self.started_s:.0f} s, "
                  f"{len(self.failures)} failures", flush=True)

    def fuzz(self, name: str, strategy, send, examples: int, seed_value: int) -> None:
        print(f"{name}: {examples} inputs", flush=True)

        @seed(seed_value)
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(value=strategy)
        def one(value):
            send(*value) if isinstance(value, tuple) else send(value)

        one()


def run(target: FuzzTarget, examples: int, seed_value: int) -> Run:
    fuzz = Run(target)
    bodies = completion_bodies.map(lambda b: ("/v1/completions", b)) | chat_bodies.map(lambda b: ("/v1/chat/completions", b))
    fuzz.fuzz("HTTP JSON", bodies, lambda path, body: fuzz.send("http-json", target.send_http, path, encode_json(body)),
              examples, seed_value)
    raw = st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), raw_bodies,
                    st.sampled_from(["application/json", "text/plain"]))
    fuzz.fuzz("raw HTTP bodies", raw, lambda *a: fuzz.send("http-raw", target.send_http, *a), max(1, examples // 4),
              seed_value)
    fuzz.fuzz("gRPC GenerateRequest", generate_requests(), lambda m: fuzz.send("grpc-message", target.send_grpc, m),
              examples, seed_value)
    fuzz.fuzz("raw gRPC bytes", mutated_messages(VALID_GRPC.SerializeToString()),
              lambda raw: fuzz.send("grpc-raw", target.send_grpc, raw), max(1, examples // 4), seed_value)
    return fuzz


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cluster_helpers import start_cluster
    from pdserve.make_model import build_model

    model = build_model("tiny", Path(args.model)) if args.model == str(REPO / "models" / "tiny") else Path(args.model)
    print("starting a cluster: 1 prefill + 1 decode worker (tcp), the tiny model", flush=True)
    cluster = start_cluster(model, Path(tempfile.mkdtemp(prefix="pdserve-fuzz-")), "tcp")
    target = FuzzTarget(cluster)
    try:
        fuzz = run(target, args.examples, args.seed)
    finally:
        target.close()
        cluster.stop()
    elapsed_s = time.monotonic() - fuzz.started_s
    result = {"examples": args.examples, "seed": args.seed, "elapsed_s": round(elapsed_s, 1), "sent": dict(fuzz.sent),
              "statuses": dict(sorted(target.statuses.items())), "failures": fuzz.failures}
    print(f"\nsent {sum(fuzz.sent.values())} inputs in {elapsed_s:.0f} s (each followed by a valid request per API)")
    print("statuses:", ", ".join(f"{status} x{n}" for status, n in sorted(target.statuses.items())))
    print(f"failures: {len(fuzz.failures)}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 1 if fuzz.failures else 0


if __name__ == "__main__":
    sys.exit(main())
