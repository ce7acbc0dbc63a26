"""The cluster's Redis password: where it is kept, and how a process connects with it.

Redis holds the registry: whoever can write to it can register a worker that routers then send
prompts to. Every launcher that starts a redis-server (`pdserve up`, Ray, Kubernetes) starts it
with `requirepass`, and every process gets the password from a file (`--redis-password-file`, or
the variable `PASSWORD_FILE_ENV` naming it), never on a command line: the `--redis-url` flags stay
password-free. The entry point reads the file once and connects with `url_with_password(url,
password)`, a URL that lives in that process's memory only; `redacted` is what may be printed.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from kv_transfer.auth import create_secret_file, readable_by_others

logger = logging.getLogger(__name__)

PASSWORD_FILE_ENV = "PDSERVE_REDIS_PASSWORD_FILE"   # read by entry points only
MAX_PASSWORD_BYTES = 512


class RedisPasswordError(ValueError):
    """The Redis password (file or URL) cannot be used; the message says how to fix it."""


def load_password(path: str | os.PathLike) -> str:
    """The password in the file at `path`, surrounding whitespace stripped. RedisPasswordError if it
    is missing, empty or too long; a file others may read is used, with a warning."""
    path = Path(path)
    try:
        info = path.stat()
        password = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise RedisPasswordError(f"cannot read the Redis password file {path}: {error}; pass the file "
                                 "`pdserve up` wrote (its run directory's redis-password) or one you made") from None
    if not password or len(password.encode()) > MAX_PASSWORD_BYTES or "\n" in password:
        raise RedisPasswordError(f"the Redis password file {path} must hold one line of 1 to {MAX_PASSWORD_BYTES} "
                                 "bytes, e.g. 64 hex digits")
    if readable_by_others(info):
        logger.warning("the Redis password file %s may be read by other users (mode %o): chmod 600 it",
                       path, stat.S_IMODE(info.st_mode))
    return password


def create_password_file(path: str | os.PathLike) -> Path:
    """Writes a fresh random password (256 bits, hex) to `path`, readable by this user only (0600);
    a file already there is replaced. Returns the path."""
    return create_secret_file(path)   # the same 0600 file of 64 hex digits as the cluster secret


def has_password(url: str) -> bool:
    return bool(urlsplit(url).password)


def url_with_password(url: str, password: str | None) -> str:
    """`url` with `password` in it (for this process's own connections; never print it or put it
    on a command line). `url` unchanged without a password; RedisPasswordError if `url` has one
    already (give it once: in the file)."""
    if not password:
        return url
    parts = urlsplit(url)
    if parts.password:
        raise RedisPasswordError(f"{redacted(url)} holds a password and a password file was given too: keep the "
                                 "password in the file only, so it stays off command lines")
    if parts.scheme not in ("redis", "rediss"):
        raise RedisPasswordError(f"a password file works with redis:// and rediss:// URLs, not {parts.scheme}://")
    userinfo = f"{quote(parts.username or '', safe='')}:{quote(password, safe='')}@"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=userinfo + host))


def connection_url(url: str, password_file: str | os.PathLike | None) -> str:
    """What an entry point connects with: `url` plus the password in `password_file` (if given)."""
    return url_with_password(url, load_password(password_file) if password_file else None)


def redacted(url: str) -> str:
    """`url` with its password, if any, replaced by `***`: safe to print."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{parts.netloc.rpartition('@')[2]}"))


def warn_if_unauthenticated(password_file: str | os.PathLike | None, url: str, side: str) -> None:
    """Logs that a process connects to Redis without a password (unless its URL holds one)."""
    if not password_file and not has_password(url):
        logger.warning("the %s connects to Redis without a password: anyone who can reach %s can register a worker; "
                       "pass --redis-password-file (pdserve up does)", side, redacted(url))


__all__ = ["PASSWORD_FILE_ENV", "RedisPasswordError", "connection_url", "create_password_file", "has_password",
           "load_password", "redacted", "url_with_password", "warn_if_unauthenticated"]
