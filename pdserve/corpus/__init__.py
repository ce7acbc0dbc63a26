"""The English text that `pdserve make-model` trains its tokenizer on, shipped with the package.

Contract: `read_corpus()` returns the same documents, in the same order, on every machine: the
`*.txt` files beside this module sorted by name, decoded as UTF-8 with line endings normalised to
"\\n" (so a checkout that rewrote them to CRLF still trains the same tokenizer). Adding, removing or
editing a file changes `corpus_sha256()`, and so every model built from the corpus.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent


def corpus_paths() -> list[Path]:
    """The corpus files, sorted by name; raises FileNotFoundError if the package shipped none."""
    paths = sorted(CORPUS_DIR.glob("*.txt"), key=lambda path: path.name)
    if not paths:
        raise FileNotFoundError(
            f"no *.txt corpus files in {CORPUS_DIR}: reinstall pdserve so its package data "
            "(pdserve/corpus/*.txt) is included"
        )
    return paths


def read_corpus() -> list[str]:
    """One string per corpus file, in `corpus_paths()` order, with "\\n" line endings."""
    return [_normalise(path.read_bytes().decode("utf-8")) for path in corpus_paths()]


def corpus_sha256() -> str:
    """A digest of the names and normalised contents of every corpus file."""
    digest = hashlib.sha256()
    for path, text in zip(corpus_paths(), read_corpus(), strict=True):
        digest.update(path.name.encode("utf-8") + b"\0")
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")
