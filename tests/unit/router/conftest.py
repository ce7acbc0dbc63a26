"""Fixtures of the router's unit tests."""

import pytest

from router.tokenizer import RouterTokenizer


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    """The tiny model's tokenizer, as the router loads it."""
    return RouterTokenizer(str(tiny_model))
