"""A cluster's credentials as values, and how a launcher puts them on a node: 0600 files whose
paths (never contents) go on the command lines of the processes it starts.

`LocalCluster` writes its files once, in its run directory. Ray spans hosts, so its controller
makes one `ClusterCredentials` per cluster and hands it to every member actor (through Ray, whose
token authentication guards it), and each member writes its own files on its node
(`write_member_files`). Kubernetes mounts a Secret instead (deploy/k8s).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from launch.commands import credential_argv, redis_config_text


@dataclass(frozen=True)
class ClusterCredentials:
    """The cluster secret (worker gRPC and the KV plane) and the Redis password; hidden from repr."""

    cluster_secret: str = field(repr=False)
    redis_password: str = field(default="", repr=False)   # "": the cluster's Redis has none

    def __post_init__(self) -> None:
        if len(self.cluster_secret.encode()) < 16:
            raise ValueError("a cluster secret needs at least 16 bytes: use ClusterCredentials.generate()")

    @classmethod
    def generate(cls, redis_password: str | None = None) -> "ClusterCredentials":
        """Fresh random ones (256 bits each, hex); `redis_password` keeps a Redis's own (an existing
        Redis the cluster is given)."""
        return cls(secrets.token_hex(32), secrets.token_hex(32) if redis_password is None else redis_password)


def write_private_file(path: Path, text: str) -> Path:
    """`text` in a new file at `path` readable by this user only (0600); one already there is replaced."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    return path


def write_member_files(credentials: ClusterCredentials, folder: Path, member: str) -> list[str]:
    """Writes `member`'s credential files into `folder` and returns the `pdserve` flags naming them."""
    secret = write_private_file(folder / f".{member}.cluster-secret", credentials.cluster_secret + "\n")
    password = (write_private_file(folder / f".{member}.redis-password", credentials.redis_password + "\n")
                if credentials.redis_password else None)
    return credential_argv(str(secret), str(password) if password else "")


def write_redis_config(folder: Path, password: str, name: str = "redis.conf") -> str:
    """`folder`/`name` (0600) making redis-server require `password`; returns its path."""
    return str(write_private_file(folder / name, redis_config_text(password)))
