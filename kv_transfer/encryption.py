"""Whether a KV connection is encrypted, and its keys: pure decisions and derivations, no I/O.

`kv_encryption` is each worker's setting (`--kv-encryption`, `ConnectorConfig.kv_encryption`):

    off   never: every byte after the handshake travels in clear (a trusted or already encrypted network)
    auto  (the default) encrypt a connection that leaves the host, not one that stays on it
    on    always; a peer set to `off` is refused at the handshake

`auto` is the default because it is what protects an operator who did nothing: KV bytes are the
users' prompts, recoverable, and a link between hosts crosses a network others may read or write,
while a link that stays on one host (loopback, or the host's own address) only crosses the kernel,
whose readers could read the processes' memory anyway; there encryption would cost throughput for
nothing. Whether a link leaves the host is decided from its two socket addresses (`is_cross_host`),
which both ends see alike.

The two ends must agree (`agree`): the consumer states its setting in AUTH, the producer decides
and states the outcome in CHALLENGE, and both are inside the handshake's MACs (`kv_transfer.auth`),
so nobody on the path can switch encryption off. `on` against `off` is refused with an error that
names both settings; `auto` against `auto` follows the hosts; an explicit `on` or `off` at one end
wins over an `auto` at the other (the `off` end's operator chose a network they trust; the `auto`
end logs nothing more: it is configuration, not an attack). Without a cluster secret there is
nothing to derive keys from: such a side is `off` (and `on` without a secret is refused when its
`Credentials` are built).

Keys (`derive_session_keys`): HKDF-SHA256 with the cluster secret as input key material, both
handshake nonces as salt, and the handshake transcript plus the direction as info: one 256-bit
AES-GCM key per direction per connection, never reused by another connection (fresh nonces) or by
the other direction. `kv_transfer.sealed_socket` uses them.

Transports: what `tcp` sends rides the control socket, so a sealed session covers the KV bytes. `shm`
and `cuda_ipc` move no KV byte over any network (same host). `torch` moves them over gloo/NCCL,
which pdserve cannot encrypt: `on` refuses it, `auto` leaves its blocks in clear (the control
messages are still sealed) and says so once (`warn_if_blocks_in_clear`).
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Literal, get_args

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kv_transfer.errors import IncompatiblePeer

logger = logging.getLogger(__name__)

EncryptionMode = Literal["off", "auto", "on"]
ENCRYPTION_MODES: tuple[str, ...] = get_args(EncryptionMode)
DEFAULT_ENCRYPTION: EncryptionMode = "auto"
KEY_BYTES = 32                      # AES-256
KEY_LABEL = "pdserve-kv-seal-v1"    # HKDF info prefix; a new record format takes a new label
_warned_blocks_in_clear: set[str] = set()


class EncryptionMismatch(IncompatiblePeer):
    """The two ends' `kv_encryption` settings contradict each other; the handshake is refused."""


def setting_problem(mode: object, transport: str, has_secret: bool | None = None) -> str:
    """Why a worker cannot run with `kv_encryption=mode` and `transport` ("" if it can);
    `has_secret` None: not known yet (a connector's config names only the secret's file)."""
    if mode not in ENCRYPTION_MODES:
        return f"kv_encryption must be one of {', '.join(ENCRYPTION_MODES)}, not {mode!r:.40}"
    if mode == "on" and transport == "torch":
        return ("kv_encryption=on cannot hold with the torch transport (gloo/NCCL move the KV bytes, which pdserve "
                "cannot encrypt): use --transport tcp, or --kv-encryption auto or off")
    if mode == "on" and has_secret is False:
        return "kv_encryption=on needs the cluster secret (--cluster-secret-file): the connections' keys come from it"
    return ""


def is_cross_host(local_host: str, peer_host: str) -> bool:
    """Does a connection between `local_host` (this end's address) and `peer_host` leave this host?
    Not when the peer is a loopback address (127.0.0.0/8, ::1, an IPv4-mapped loopback,
    "localhost") or this end's own address; anything else does. Both ends of one TCP connection see
    the same pair of addresses, so they decide alike (a NAT in between is the exception)."""
    local, peer = _ip(local_host), _ip(peer_host)
    if peer is None:   # a name, not an address
        return peer_host.strip().lower() != "localhost" and peer_host != local_host
    return not (peer.is_loopback or peer == local)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def agree(consumer_mode: EncryptionMode, producer_mode: EncryptionMode, cross_host: bool) -> bool:
    """Whether a connection is sealed, given each end's effective setting (`effective_mode`) and
    whether it leaves the host. Raises `EncryptionMismatch` for `on` against `off`."""
    modes = {consumer_mode, producer_mode}
    if modes == {"on", "off"}:
        raise EncryptionMismatch(f"KV encryption mismatch: the consumer is set to {consumer_mode!r} and the "
                                 f"producer to {producer_mode!r}; give both workers the same --kv-encryption "
                                 "(and both the cluster secret)")
    if "on" in modes:
        return True
    if "off" in modes:
        return False
    return cross_host


def effective_mode(mode: EncryptionMode, has_secret: bool) -> EncryptionMode:
    """What a side asks for: its setting, or `off` without a cluster secret (no key to derive)."""
    return mode if has_secret else "off"


@dataclass(frozen=True)
class SessionKeys:
    """One connection's two AES-256-GCM keys, one per direction."""

    consumer_to_producer: bytes = field(repr=False)
    producer_to_consumer: bytes = field(repr=False)

    def for_role(self, role: Literal["producer", "consumer"]) -> tuple[bytes, bytes]:
        """(the key this side seals with, the key it opens with)."""
        if role == "consumer":
            return self.consumer_to_producer, self.producer_to_consumer
        return self.producer_to_consumer, self.consumer_to_producer


def derive_session_keys(secret: bytes, consumer_nonce: str, producer_nonce: str, transcript: bytes) -> SessionKeys:
    """HKDF-SHA256(ikm = `secret`, salt = both nonces' bytes, info = `KEY_LABEL`, the direction and
    `transcript`), once per direction. Deterministic: both ends derive the same pair; a change in
    any input (another connection's nonces, another secret, another transcript) changes both keys."""
    salt = bytes.fromhex(consumer_nonce) + bytes.fromhex(producer_nonce)

    def key(direction: str) -> bytes:
        info = f"{KEY_LABEL} {direction} ".encode() + transcript
        return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(secret)

    return SessionKeys(key("consumer->producer"), key("producer->consumer"))


def next_key(key: bytes) -> bytes:
    """The key that follows `key` in one direction after `kv_transfer.sealed_socket.REKEY_AFTER_BYTES`
    (HKDF-SHA256 of it, a fixed label): both ends step alike, and an old key cannot be recovered
    from a newer one."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                info=f"{KEY_LABEL} next".encode()).derive(key)


def warn_if_blocks_in_clear(mode: EncryptionMode, transport: str, sealable: bool, has_secret: bool) -> None:
    """Logs once per transport and process when `auto` cannot cover a transport's KV bytes (torch)."""
    if mode != "auto" or sealable or not has_secret or transport in _warned_blocks_in_clear:
        return
    _warned_blocks_in_clear.add(transport)
    logger.warning("kv_encryption=auto does not cover the %s transport: between hosts its KV blocks travel in "
                   "clear over gloo/NCCL (the control messages are encrypted); use --transport tcp to encrypt "
                   "them, or --kv-encryption on to refuse such links", transport)


__all__ = ["DEFAULT_ENCRYPTION", "ENCRYPTION_MODES", "EncryptionMismatch", "EncryptionMode", "SessionKeys", "agree",
           "derive_session_keys", "effective_mode", "is_cross_host", "next_key", "setting_problem",
           "warn_if_blocks_in_clear"]
