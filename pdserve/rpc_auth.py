"""Who may call a worker's gRPC: a per-call proof of the cluster secret, checked before any work.

Every call to a worker's `Worker` service (Prefill, Decode, Abort, GetLoad) carries one metadata
entry, `HEADER`, whose value is a token

    v1.<at_ms>.<nonce>.<mac>

made by the caller: `at_ms` its wall clock in milliseconds, `nonce` `NONCE_BYTES` fresh random
bytes (hex), `mac` HMAC-SHA256(cluster secret, [PROTOCOL, audience, method, at_ms, nonce]) in hex.
`audience` is the worker's gRPC address as the registry advertises it (what the router dials),
`method` the full gRPC method name. The worker accepts a call only if (`check`, pure):

- the token is well formed and its `mac` matches (`hmac.compare_digest`): the caller holds the
  secret, and made this proof for this worker and this method;
- `at_ms` is within `FRESHNESS_S` of the worker's clock either way (hosts' clocks may differ);
- its nonce was not used before within that window (`ReplayCache`, bounded; only proofs that
  passed the MAC check are remembered, so a stranger cannot fill it).

The secret never travels. A recorded token is worthless at another worker or for another method,
after the window, or a second time. It does not sign the request body: someone who can *modify*
traffic between a router and a worker (not merely read it) could race a fresh token with a body of
their own; across untrusted networks, run the internal plane under TLS/WireGuard (SECURITY.md).

Health checks (`EXEMPT_METHODS`) need no proof: Kubernetes' gRPC probes cannot send metadata, and
they reveal only SERVING or not. Without a secret (`secret is None`) nothing is signed or checked,
as before, and each side warns once (`pdserve.rpc_auth_grpc`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections import OrderedDict
from dataclasses import dataclass

HEADER = "x-pdserve-rpc-auth"        # gRPC metadata keys are lower case
PROTOCOL = "pdserve-rpc-auth-v1"
VERSION = "v1"
NONCE_BYTES = 16
FRESHNESS_S = 60.0                  # either way: a token from up to 60 s ago or ahead is fresh
REPLAY_CAPACITY = 200_000           # nonces remembered at most (~30 MiB); the oldest go first
MAX_TOKEN_CHARS = 160               # longer values are refused before they are parsed
EXEMPT_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


@dataclass(frozen=True)
class Verdict:
    """What `check` decided. `why` says, for a log line, why a call was refused ("" if accepted);
    an accepted call's `nonce` must still pass the `ReplayCache` until `expires_at_s`."""

    accepted: bool
    why: str = ""
    nonce: str = ""
    expires_at_s: float = 0.0


def mac(secret: bytes, audience: str, method: str, at_ms: int, nonce: str) -> str:
    """HMAC-SHA256 hex of the call's claims under `secret`. Unambiguous (a JSON list)."""
    signed = json.dumps([PROTOCOL, audience, method, at_ms, nonce]).encode()
    return hmac.new(secret, signed, hashlib.sha256).hexdigest()


def make_token(secret: bytes, audience: str, method: str, now_s: float, nonce: str | None = None) -> str:
    """A fresh token for one call of `method` to the worker at `audience`."""
    at_ms = int(now_s * 1000)
    nonce = nonce or secrets.token_hex(NONCE_BYTES)
    return f"{VERSION}.{at_ms}.{nonce}.{mac(secret, audience, method, at_ms, nonce)}"


def check(secret: bytes, audiences: frozenset[str], method: str, offered: object, now_s: float,
          freshness_s: float = FRESHNESS_S) -> Verdict:
    """Does `offered` (the call's `HEADER` value; None if absent) prove the secret for `method` at
    one of this worker's `audiences`, fresh at `now_s`? Constant-time in the MAC; pure."""
    if offered is None or offered == "":
        return Verdict(False, "the call carries no proof of the cluster secret (metadata "
                              f"{HEADER}): start the router with --cluster-secret-file")
    parts = offered.split(".") if isinstance(offered, str) and len(offered) <= MAX_TOKEN_CHARS else []
    if len(parts) != 4 or parts[0] != VERSION or not parts[1].isdigit() or not _is_hex(parts[2], 2 * NONCE_BYTES):
        return Verdict(False, "malformed proof of the cluster secret")
    _, at_text, nonce, offered_mac = parts
    at_ms = int(at_text)
    if not any(hmac.compare_digest(offered_mac.encode(), mac(secret, audience, method, at_ms, nonce).encode())
               for audience in sorted(audiences)):
        return Verdict(False, "the proof does not match this worker's cluster secret (another secret file, or a "
                              "proof made for another worker or method)")
    skew_s = now_s - at_ms / 1000
    if abs(skew_s) > freshness_s:
        return Verdict(False, f"stale proof: made {skew_s:+.1f} s from this worker's clock, more than "
                              f"{freshness_s:g} s (are the hosts' clocks synchronised?)")
    return Verdict(True, nonce=nonce, expires_at_s=at_ms / 1000 + freshness_s)


class ReplayCache:
    """The nonces of accepted calls until their tokens go stale, at most `capacity` of them.

    `first_use` is True once per nonce within its freshness. When full, the oldest entry is dropped:
    only holders of the secret can fill the cache (it keeps nothing before the MAC check), so
    bounding memory never lets a stranger replay. Not thread-safe: one event loop."""

    def __init__(self, capacity: int = REPLAY_CAPACITY):
        if capacity < 1:
            raise ValueError(f"a replay cache holds at least one nonce, got capacity {capacity}")
        self.capacity = capacity
        self._expiry: OrderedDict[str, float] = OrderedDict()   # nonce -> expires_at_s, oldest first

    def __len__(self) -> int:
        return len(self._expiry)

    def first_use(self, nonce: str, expires_at_s: float, now_s: float) -> bool:
        while self._expiry and next(iter(self._expiry.values())) < now_s:
            self._expiry.popitem(last=False)
        if nonce in self._expiry:
            return False
        while len(self._expiry) >= self.capacity:
            self._expiry.popitem(last=False)
        self._expiry[nonce] = expires_at_s
        return True


def _is_hex(value: str, length: int) -> bool:
    return len(value) == length and all(c in "0123456789abcdef" for c in value)


__all__ = ["EXEMPT_METHODS", "FRESHNESS_S", "HEADER", "ReplayCache", "Verdict", "check", "mac", "make_token"]
