"""The layering contracts of pyproject.toml ([tool.importlinter]) hold, and they can fail.

The layers, bottom up: kv_transfer -> pdserve core -> router | prefill_worker | decode_worker |
loadgen -> launch -> planner -> cli. `lint-imports` (import-linter) reads every import of the
installed packages, lazy ones inside functions included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("kv_transfer", "pdserve", "router", "prefill_worker", "decode_worker", "loadgen", "launch", "planner",
            "cli")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)


def test_no_import_runs_upward_and_protobuf_stays_at_the_edges():
    run = _lint(REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "BROKEN" not in run.stdout and "Contracts: 2 kept, 0 broken." in run.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    errors = tmp_path / "pdserve" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _upward():\n    from cli.main import main  # noqa: F401\n")
    run = _lint(tmp_path)
    assert run.returncode != 0
    assert "pdserve.errors -> cli.main" in run.stdout
