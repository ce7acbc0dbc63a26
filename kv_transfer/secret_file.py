"""The cluster secret's file: read it (with a warning when others may), and write a fresh one.

Worker gRPC (`pdserve.rpc_auth`) and the KV plane (`kv_transfer.auth`) are keyed by it; only its
path goes on command lines and into configs (`SECRET_FILE_ENV` names it for entry points)."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

logger = logging.getLogger("kv_transfer.auth")   # where operators have always found its warnings

MIN_SECRET_BYTES = 16
SECRET_FILE_ENV = "PDSERVE_CLUSTER_SECRET_FILE"   # read by the worker's entry point only


class SecretFileError(ValueError):
    """The cluster secret file cannot be used; the message says how to fix it."""


def load_secret(path: str | os.PathLike) -> bytes:
    """The secret in the file at `path`: its bytes, surrounding whitespace stripped. SecretFileError
    if it is missing or too short; a file others may read is used, with a warning."""
    path = Path(path)
    try:
        info = path.stat()
        secret = path.read_bytes().strip()
    except OSError as error:
        raise SecretFileError(f"cannot read the cluster secret file {path}: {error.strerror}; pass the file "
                              f"`pdserve up` wrote (its run directory's cluster-secret) or one you made") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretFileError(f"the cluster secret file {path} holds {len(secret)} bytes, fewer than "
                              f"{MIN_SECRET_BYTES}: write at least 16 random bytes (e.g. 64 hex digits) into it")
    if readable_by_others(info):
        logger.warning("the cluster secret file %s may be read by other users (mode %o): chmod 600 it",
                       path, stat.S_IMODE(info.st_mode))
    return secret


def readable_by_others(info: os.stat_result) -> bool:
    """May users other than this process's read a file with `info`? Group read counts unless the
    group is this process's own (a Kubernetes Secret volume: 0440, group fsGroup = the pod's group)."""
    mode = stat.S_IMODE(info.st_mode)
    own_group = info.st_gid == os.getgid() or info.st_gid in os.getgroups()
    return bool(mode & 0o007) or bool(mode & 0o070 and not own_group)


def create_secret_file(path: str | os.PathLike) -> Path:
    """Writes a fresh random secret (256 bits, hex) to `path`, readable by this user only (0600);
    a file already there is replaced. Returns the path."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(32) + "\n")
    return path


__all__ = ["MIN_SECRET_BYTES", "SECRET_FILE_ENV", "SecretFileError", "create_secret_file", "load_secret",
           "readable_by_others"]
