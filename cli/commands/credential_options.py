"""The flags naming a cluster's credential files, shared by `pdserve worker`, `router` and `planner`.

Only paths travel on command lines (every user can read a process's command line); the entry point
reads the files. Both default to an environment variable naming the file, for containers.
"""

from __future__ import annotations

import argparse
import os

from kv_transfer.auth import SECRET_FILE_ENV
from pdserve.redis_auth import PASSWORD_FILE_ENV


def add_cluster_secret_option(parser, uses: str) -> None:
    parser.add_argument("--cluster-secret-file", default=os.environ.get(SECRET_FILE_ENV, ""),
                        help=f"file holding the cluster secret, which {uses} (the path, never the secret; env "
                             f"{SECRET_FILE_ENV}; `pdserve up` writes <log dir>/cluster-secret; default: none, "
                             "unauthenticated, with a warning)")


def add_redis_password_option(parser) -> None:
    parser.add_argument("--redis-password-file", default=os.environ.get(PASSWORD_FILE_ENV, ""),
                        help=f"file holding the Redis password (keep it out of --redis-url; env {PASSWORD_FILE_ENV}; "
                             "`pdserve up` writes <log dir>/redis-password; default: none)")


def redis_connection_url(args: argparse.Namespace, command: str) -> str:
    """--redis-url with the password of --redis-password-file in it, for this process only;
    SystemExit saying what to fix if the file cannot be used."""
    from pdserve.redis_auth import RedisPasswordError, connection_url, warn_if_unauthenticated

    warn_if_unauthenticated(args.redis_password_file, args.redis_url, command)
    try:
        return connection_url(args.redis_url, args.redis_password_file)
    except RedisPasswordError as bad:
        raise SystemExit(f"pdserve {command}: {bad}") from None
