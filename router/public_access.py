"""Who may use the public API, decided with plain values: no sockets, no frameworks.

- API keys: `parse_api_keys` reads a key file's text (one key a line; blank lines and `#` comments
  ignored; several keys let a rotation overlap), `load_api_keys` a file and the environment's key,
  and `ApiKeys.accepts` checks a presented key against every configured one in constant time.
- `bearer_token` takes the key out of an `Authorization: Bearer <key>` value (HTTP header or gRPC
  metadata alike).
- `exposure_problem`: may the public API listen on `host` as configured? None, or what to fix.

The adapters (the ASGI middleware and the gRPC interceptor) are `router.public_auth`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

API_KEYS_FILE_ENV = "PDSERVE_API_KEYS_FILE"   # names a key file (`pdserve router --api-key-file`'s default)
API_KEY_ENV = "PDSERVE_API_KEY"               # holds one key itself (as vLLM's VLLM_API_KEY)
MIN_KEY_CHARS = 16
MAKE_KEY_HINT = "make one with `openssl rand -hex 32`"


class ApiKeyError(ValueError):
    """A key file or key that cannot be used; the message says what to fix."""


def parse_api_keys(text: str, source: str = "the key file") -> tuple[str, ...]:
    """The keys of a key file's `text`, in order, each once. A key is printable ASCII without
    spaces (it travels in an HTTP header) and has at least MIN_KEY_CHARS characters."""
    keys: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        check_key(key, f"{source}, line {number}")
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def check_key(key: str, where: str) -> None:
    if any(not 0x21 <= ord(c) <= 0x7e for c in key):
        raise ApiKeyError(f"{where}: an API key is printable ASCII without spaces (it travels in an HTTP header); "
                          f"{MAKE_KEY_HINT}")
    if len(key) < MIN_KEY_CHARS:
        raise ApiKeyError(f"{where}: an API key needs at least {MIN_KEY_CHARS} characters, this one has {len(key)}; "
                          f"{MAKE_KEY_HINT}")


def load_api_keys(path: str = "", env_key: str = "") -> tuple[str, ...]:
    """The keys of the file at `path` ("" for none) followed by `env_key` (the value of
    PDSERVE_API_KEY; "" for none). A file that is named must exist and hold at least one key."""
    keys: tuple[str, ...] = ()
    if path:
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as unreadable:
            raise ApiKeyError(f"cannot read the API key file {path}: {unreadable}") from None
        keys = parse_api_keys(text, path)
        if not keys:
            raise ApiKeyError(f"the API key file {path} holds no key: put one key a line ({MAKE_KEY_HINT})")
    if env_key:
        check_key(env_key.strip(), API_KEY_ENV)
        keys = keys if env_key.strip() in keys else (*keys, env_key.strip())
    return keys


class ApiKeys:
    """The configured keys, kept as SHA-256 digests. `accepts` hashes the presented key (so every
    comparison is of 32 bytes, whatever the lengths) and compares it with every digest with
    `hmac.compare_digest`, without stopping at a match: its time says neither whether nor which
    key matched."""

    def __init__(self, keys: tuple[str, ...] | list[str]):
        if not keys:
            raise ApiKeyError("ApiKeys needs at least one key; without keys the API is open (do not build ApiKeys)")
        self._digests = tuple(hashlib.sha256(key.encode()).digest() for key in keys)

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, presented: str | None) -> bool:
        offered = hashlib.sha256((presented or "").encode("utf-8", "surrogateescape")).digest()
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(offered, digest)
        return matched and presented is not None


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Bearer <token>` (the scheme in any case, RFC 9110); None for anything else."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only: `localhost` or a loopback address.
    A wildcard (`0.0.0.0`, `::`, "") or any other name is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, *, tls: bool, api_keys: bool, insecure: bool) -> str | None:
    """None when the public API may listen on `host`: a loopback address, or both TLS and API
    keys, or `insecure` (the operator says something in front does their work: a gateway that
    terminates TLS and authenticates, a mesh). Otherwise what is missing and how to fix it."""
    if is_loopback(host) or insecure or (tls and api_keys):
        return None
    missing = [what for what, present in (("TLS", tls), ("API keys", api_keys)) if not present]
    risk = ("anyone who can reach it could run prompts on the cluster" if not api_keys else
            "keys and prompts would cross the network in clear")
    return (f"the public API would listen on {host or 'every interface'} without {' and '.join(missing)}: {risk}. "
            "Give --tls-cert-file and --tls-key-file (TLS) and --api-key-file (or the PDSERVE_API_KEY environment "
            "variable), or listen on 127.0.0.1, or pass --insecure if a gateway or mesh in front of the router "
            "does this")
