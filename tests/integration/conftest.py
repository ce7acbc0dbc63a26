"""Fixtures for the integration tests (helpers live in cluster_helpers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from cluster_helpers import HERE, engine_settings, make_prompts, start_cluster

@pytest.fixture(scope="session")
def prompts(tiny_model) -> list[dict]:
    vocab_size = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    return make_prompts(vocab_size)


@pytest.fixture(scope="session")
def reference_outputs(tiny_model, prompts, tmp_path_factory) -> list[list[int]]:
    folder = tmp_path_factory.mktemp("reference")
    (folder / "settings.json").write_text(json.dumps(asdict(engine_settings(tiny_model))))
    (folder / "prompts.json").write_text(json.dumps(prompts))
    subprocess.run([sys.executable, str(HERE / "colocated_reference.py"), str(folder / "settings.json"),
                    str(folder / "prompts.json"), str(folder / "out.json")], check=True, timeout=600,
                   stdout=subprocess.DEVNULL)
    return json.loads((folder / "out.json").read_text())


@pytest.fixture(scope="session")
def tcp_cluster(tiny_model, tmp_path_factory):
    """One prefill + one decode worker over the tcp transport, shared by the integration modules."""
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("cluster-tcp"), "tcp")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def torch_cluster(tiny_model, tmp_path_factory):
    """The same cluster over the torch (gloo) transport."""
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("cluster-torch"), "torch")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def shm_cluster(tiny_model, tmp_path_factory):
    """The same cluster over the one-sided shared-memory transport."""
    cluster = start_cluster(tiny_model, tmp_path_factory.mktemp("cluster-shm"), "shm")
    yield cluster
    cluster.stop()


@pytest.fixture(params=["tcp", "torch", "shm"])
def cluster(request):
    """Each transport's cluster in turn."""
    return request.getfixturevalue(f"{request.param}_cluster")
