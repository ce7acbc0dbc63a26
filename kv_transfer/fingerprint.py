"""A model checkpoint's fingerprint: what the KV handshake compares instead of the model's path.

Two workers may move KV between them only if they run the same weights. Paths say nothing about
that (the same checkpoint is mounted at different paths; two fine-tunes share a directory name),
and hashing every weight byte costs seconds per GiB at startup. The fingerprint hashes what
identifies a checkpoint's contents cheaply:

- `config.json`, parsed, minus the keys that name where or by what it was saved;
- every `*.safetensors` file's header (tensor names, dtypes, shapes, offsets);
- a sample of every tensor's bytes: its first and last `SAMPLE_BYTES` (a fine-tune, a merged
  adapter or a different seed changes essentially every element of the tensors it touches);
- for checkpoints without safetensors (`*.bin`, `*.pt`), each weight file's size and the same
  sample of its first and last bytes.

It is identical for byte-identical checkpoints wherever they live, reads well under a MiB per
tensor-heavy file, and different for any two checkpoints a user could confuse.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

SAMPLE_BYTES = 4096
_IGNORED_CONFIG_KEYS = ("_name_or_path", "transformers_version")
_OTHER_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".gguf")


class FingerprintError(ValueError):
    """The model path is not a checkpoint directory this module can fingerprint."""


def model_fingerprint(model: str | os.PathLike) -> str:
    """`sha256:<hex>` of the checkpoint directory `model` (see the module docstring).

    A name that is not a local directory (a hub id) resolves through the local Hugging Face cache;
    without one, `FingerprintError`."""
    directory = _resolve(model)
    digest = hashlib.sha256()
    _hash_config(directory, digest)
    weights = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix == ".safetensors")
    for path in weights:
        digest.update(path.name.encode())
        _hash_safetensors(path, digest)
    if not weights:
        others = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in _OTHER_WEIGHT_SUFFIXES)
        if not others:
            raise FingerprintError(f"{directory} holds no weight files (*.safetensors, *.bin, *.pt)")
        for path in others:
            digest.update(path.name.encode())
            _hash_sampled_file(path, digest)
    return "sha256:" + digest.hexdigest()


def _resolve(model: str | os.PathLike) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), local_files_only=True))
    except (ImportError, OSError, ValueError) as error:  # the hub's "not cached" errors are both
        raise FingerprintError(f"model {str(model)!r} is neither a directory nor in the local "
                               f"Hugging Face cache: {error}") from error


def _hash_config(directory: Path, digest) -> None:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FingerprintError(f"{directory} has no config.json")
    config = json.loads(config_path.read_text())
    for key in _IGNORED_CONFIG_KEYS:
        config.pop(key, None)
    digest.update(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())


def _hash_safetensors(path: Path, digest) -> None:
    """The header as stored, then a sample of every tensor's bytes, in header order."""
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) != 8:
            raise FingerprintError(f"{path} is too short to be a safetensors file")
        (header_size,) = struct.unpack("<Q", prefix)
        header_bytes = file.read(header_size)
        if len(header_bytes) != header_size:
            raise FingerprintError(f"{path} ends inside its safetensors header")
        digest.update(header_bytes)
        header = json.loads(header_bytes)
        data_start = 8 + header_size
        for name in sorted(k for k in header if k != "__metadata__"):
            begin, end = header[name]["data_offsets"]
            _hash_range(file, data_start + begin, data_start + end, digest)


def _hash_sampled_file(path: Path, digest) -> None:
    size = path.stat().st_size
    digest.update(str(size).encode())
    with path.open("rb") as file:
        _hash_range(file, 0, size, digest)


def _hash_range(file, begin: int, end: int, digest) -> None:
    """The first and last `SAMPLE_BYTES` of [begin, end) (all of it when shorter than two samples)."""
    if end - begin <= 2 * SAMPLE_BYTES:
        file.seek(begin)
        digest.update(file.read(end - begin))
        return
    file.seek(begin)
    digest.update(file.read(SAMPLE_BYTES))
    file.seek(end - SAMPLE_BYTES)
    digest.update(file.read(SAMPLE_BYTES))
