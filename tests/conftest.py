"""Fixtures every test directory may use: the repository root, the tiny model, a private Redis, the
reference prompts, one colocated vLLM engine and its greedy answers to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(session, config, items):
    """The order of a run: the unit tests, then the tests marked `judges_latency` (an SLO's
    attainment, a 50 ms refusal), then every other test, each group in its collected order. The
    session-scoped clusters and reference engines the integration modules start stay up to the
    end, and on a 2-core host their processes are load: the unit tests ran at half speed beside
    them, and a clean-clone run failed the latency tests under that load (they passed alone)."""
    items.sort(key=run_order)   # stable: the collected order within each group


def run_order(item) -> int:
    """0: a unit test; 1: a test that judges latency; 2: the rest (clusters, engines, chaos)."""
    if "/tests/unit/" in str(item.path):
        return 0
    return 1 if item.get_closest_marker("judges_latency") is not None else 2


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The `tiny` checkpoint `make demo` uses; built once, reused while its recipe is unchanged."""
    from pdserve.make_model import build_model

    return build_model("tiny", REPO / "models" / "tiny")


@pytest.fixture(scope="session")
def redis_server():
    from launch.redis_server import start_redis

    server = start_redis()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def prompts(tiny_model) -> list[dict]:
    import cluster_helpers

    vocab_size = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    return cluster_helpers.make_prompts(vocab_size)


@pytest.fixture(scope="session")
def reference(tiny_model, tmp_path_factory):
    """One colocated vLLM engine with the clusters' engine settings (integration/reference_engine.py,
    asked one request at a time): what the clusters' tokens and the OpenAI API tests' answers are
    compared with. One for the session: each start imports vLLM (seconds of CPU, 13 s on an
    AVX2-only EPYC)."""
    import cluster_helpers
    from openai_reference import reference_engine

    with reference_engine(cluster_helpers.engine_settings(tiny_model), tmp_path_factory.mktemp("reference-engine")) as engine:
        yield engine


@pytest.fixture(scope="session")
def reference_outputs(reference, prompts) -> list[list[int]]:
    """The reference engine's greedy tokens for `prompts`, one prompt at a time as the cluster tests
    send them (so each batch holds one request, as theirs do)."""
    return [reference.answer(entry["token_ids"], max_tokens=entry["max_tokens"], temperature=0.0,
                             ignore_eos=True)["token_ids"] for entry in prompts]
