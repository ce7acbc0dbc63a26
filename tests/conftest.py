"""Fixtures every test directory may use: the repository root, the tiny model, a private Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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
