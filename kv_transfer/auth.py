"""Who may use a KV connection: a mutual challenge-response keyed by the cluster secret.

Every consumer connection to a producer's KV port starts with it, before any HELLO, PULL, COPIED
or RELEASE (`kv_transfer.wire` has the rest of the exchanges):

    consumer -> AUTH {identity, fingerprint, nonce, encryption}
                                       producer -> CHALLENGE {identity, fingerprint, nonce, sealed, proof}
                                                   (or REFUSED {error}, then it closes)
    consumer -> PROOF {proof}, pipelined with its next message (HELLO, or a one-shot RELEASE)
                                       producer -> that message's answer, or REFUSED {error} + close

`nonce`s are `NONCE_BYTES` fresh random bytes (hex), one from each side. A `proof` is
HMAC-SHA256(cluster secret, role + `Transcript`): the role ("producer" or "consumer"), both
identities, both model fingerprints (each side's claim, sent in clear) and both nonces, checked
with `hmac.compare_digest`. The secret never travels. The consumer proves itself only after the
producer did, so it is never an oracle for a fake producer; a recorded PROOF fails on a new
connection (the producer's nonce is fresh), and a producer's proof never passes for a consumer's
(the role is inside the MAC). The cost is one round trip per connection, not per pull.

`encryption` is the consumer's `kv_encryption` setting ("off" when absent), `sealed` the
producer's decision (`kv_transfer.encryption.agree`); both are in the transcript, so nobody on the
path can switch encryption off unnoticed. On a sealed connection everything after the PROOF (HELLO
or RELEASE on) travels in AES-256-GCM records under keys derived from the secret, both nonces and
the transcript (`kv_transfer.sealed_socket`); the PROOF itself and what precedes it stay in clear.

`identity` is the worker's id on the KV plane: a producer binds each transfer to the first
consumer identity that uses it (`LeaseTable.claim`), and `authorize` says who else may. With one
secret shared by the cluster, an identity is a claim made by a holder of the secret: the
handshake keeps out whoever lacks the secret; it does not make one member unable to pose as
another. Unsealed, it authenticates a connection at its start and does not encrypt or sign the
messages that follow (see SECURITY.md).

No secret on a side (`Credentials.secret is None`: tests, tools, launchers that pass none) means
proofs are "" and the plane is unauthenticated; `warn_if_unauthenticated` says so once per process.
A side with a secret refuses a peer that proves none.

Before a peer is authenticated, a message may be at most `MAX_PREAUTH_MESSAGE_BYTES` and every
read waits at most `AUTH_TIMEOUT_S` (see `TransferServer`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from typing import Literal

from kv_transfer.encryption import (DEFAULT_ENCRYPTION, ENCRYPTION_MODES, EncryptionMismatch, EncryptionMode,
                                    SessionKeys, agree, derive_session_keys, effective_mode, is_cross_host,
                                    setting_problem)
from kv_transfer.errors import IncompatiblePeer, PeerClosed, TransferError
from kv_transfer.secret_file import (MIN_SECRET_BYTES, SECRET_FILE_ENV, SecretFileError, create_secret_file,
                                     load_secret, readable_by_others)
from kv_transfer.wire import encode, recv_message, send_message

logger = logging.getLogger(__name__)

Role = Literal["producer", "consumer"]
PROTOCOL = "pdserve-kv-auth-v2"   # v2: the encryption setting and decision are signed
NONCE_BYTES = 32
MAX_IDENTITY_CHARS = 128
MAX_FINGERPRINT_CHARS = 256
MAX_PREAUTH_MESSAGE_BYTES = 1024   # AUTH, PROOF, GRANT_HELLO: everything read from a stranger
AUTH_TIMEOUT_S = 5.0               # each read before the peer proved itself


class AuthFailed(TransferError):
    """A peer did not prove knowledge of the cluster secret, or broke the handshake's rules."""



@dataclass(frozen=True)
class Credentials:
    """This side's name on the KV plane, the cluster secret (None: unauthenticated) and its
    `kv_encryption` setting (`kv_transfer.encryption`; `on` needs the secret, the keys come from it)."""

    identity: str
    secret: bytes | None = None
    encryption: EncryptionMode = DEFAULT_ENCRYPTION

    def __post_init__(self) -> None:
        if why := identity_problem(self.identity):
            raise ValueError(why)
        if why := setting_problem(self.encryption, "", self.secret is not None):
            raise ValueError(why)
        if self.secret is not None and len(self.secret) < MIN_SECRET_BYTES:
            raise SecretFileError(f"a cluster secret needs at least {MIN_SECRET_BYTES} bytes, got "
                                  f"{len(self.secret)}: generate one with `head -c 32 /dev/urandom | xxd -p -c 64`")

    @property
    def authenticated(self) -> bool:
        return self.secret is not None

    @property
    def effective_encryption(self) -> EncryptionMode:
        return effective_mode(self.encryption, self.authenticated)

    @classmethod
    def from_file(cls, path: str | os.PathLike | None, identity: str,
                  encryption: EncryptionMode = DEFAULT_ENCRYPTION) -> "Credentials":
        """With the secret in `path`; unauthenticated when `path` is empty or None."""
        return cls(identity, load_secret(path) if path else None, encryption)


@dataclass(frozen=True)
class Transcript:
    """What both proofs cover: the two sides' claims and nonces (hex), as sent."""

    consumer_identity: str
    consumer_fingerprint: str
    consumer_nonce: str
    producer_identity: str
    producer_fingerprint: str
    producer_nonce: str
    consumer_encryption: str = "off"   # the consumer's setting, as its AUTH said
    sealed: bool = False               # the producer's decision, as its CHALLENGE said

    def signed_bytes(self, role: str) -> bytes:
        """Unambiguous (a JSON list), so no two transcripts sign alike. `role`: "producer" or
        "consumer" for a proof, "keys" for `derive_session_keys`'s info."""
        return json.dumps([PROTOCOL, role, self.consumer_identity, self.consumer_fingerprint, self.consumer_nonce,
                           self.producer_identity, self.producer_fingerprint, self.producer_nonce,
                           self.consumer_encryption, self.sealed]).encode()

    def session_keys(self, secret: bytes | None) -> SessionKeys | None:
        """The connection's keys when it is sealed (and there is a secret), else None."""
        if not self.sealed or secret is None:
            return None
        return derive_session_keys(secret, self.consumer_nonce, self.producer_nonce, self.signed_bytes("keys"))


@dataclass(frozen=True)
class Peer:
    """The other side of an authenticated (or, without a secret, merely introduced) connection;
    `keys` are the connection's when it is sealed (`kv_transfer.sealed_socket.seal`), else None."""

    identity: str
    fingerprint: str
    authenticated: bool
    encryption: str = "off"            # the peer's kv_encryption setting, as it said (a consumer's)
    keys: SessionKeys | None = field(default=None, repr=False)


# ---- pure decisions ------------------------------------------------------------------------------
def proof(secret: bytes | None, role: Role, transcript: Transcript) -> str:
    """HMAC-SHA256 hex of `role` and `transcript` under `secret`; "" without a secret."""
    if secret is None:
        return ""
    return hmac.new(secret, transcript.signed_bytes(role), hashlib.sha256).hexdigest()


def proof_matches(secret: bytes | None, role: Role, transcript: Transcript, offered: object) -> bool:
    """Constant-time. Without a secret here nothing is checked (True); with one, only the right
    proof of `role` matches (an empty or non-string proof never does)."""
    if secret is None:
        return True
    return isinstance(offered, str) and hmac.compare_digest(offered.encode(), proof(secret, role, transcript).encode())


def identity_problem(identity: object) -> str:
    """Why `identity` cannot name a worker on the KV plane ("" if it can)."""
    if not isinstance(identity, str) or not 0 < len(identity) <= MAX_IDENTITY_CHARS:
        return f"a KV identity is a string of 1 to {MAX_IDENTITY_CHARS} characters, got {identity!r:.60}"
    if not identity.isprintable():
        return f"a KV identity is printable, got {identity!r:.60}"
    return ""


def introduction(message: dict) -> tuple[str, str, str]:
    """(identity, fingerprint, nonce) of an AUTH or CHALLENGE; AuthFailed if any is malformed."""
    identity, fingerprint, nonce = message.get("identity"), message.get("fingerprint"), message.get("nonce")
    if why := identity_problem(identity):
        raise AuthFailed(why)
    if not isinstance(fingerprint, str) or len(fingerprint) > MAX_FINGERPRINT_CHARS:
        raise AuthFailed(f"a model fingerprint is a string of at most {MAX_FINGERPRINT_CHARS} characters")
    if not _is_nonce(nonce):
        raise AuthFailed(f"a nonce is {NONCE_BYTES} bytes in hex")
    return identity, fingerprint, nonce


def requested_encryption(auth: dict) -> EncryptionMode:
    """The consumer's `kv_encryption` in its AUTH ("off" when it says nothing); AuthFailed if malformed."""
    value = auth.get("encryption", "off")
    if value not in ENCRYPTION_MODES:
        raise AuthFailed(f"encryption is one of {', '.join(ENCRYPTION_MODES)}, not {value!r:.40}")
    return value


def authorize(bound_to: str | None, peer: str, owner: str) -> bool:
    """May `peer` pull or release a transfer bound to `bound_to` (None: nobody yet) at a producer
    whose own identity is `owner`? Its consumer may, the producer's own worker may (the router's
    aborts go through it), and anyone authenticated may take an unbound one (and so bind it)."""
    return peer == owner or bound_to is None or bound_to == peer


def _is_nonce(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 2 * NONCE_BYTES:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


# ---- the exchange over a socket --------------------------------------------------------------------
def authenticate_to_producer(sock: socket.socket, credentials: Credentials, fingerprint: str) -> tuple[Peer, bytes]:
    """Consumer: AUTH, then the producer's CHALLENGE, checked. Returns the producer and the framed
    PROOF, which the caller sends together with its next message (no extra round trip; on a sealed
    connection, `peer.keys` set, that message is the first sealed one: `sealed_socket.send_after_proof`).
    Raises IncompatiblePeer when the producer refuses us (`EncryptionMismatch` among its reasons),
    cannot prove the secret, or decided on encryption against our setting."""
    nonce, encryption = new_nonce(), credentials.effective_encryption
    send_message(sock, {"op": "AUTH", "identity": credentials.identity, "fingerprint": fingerprint, "nonce": nonce,
                        "encryption": encryption})
    reply = recv_message(sock, MAX_PREAUTH_MESSAGE_BYTES)
    if reply["op"] == "REFUSED":
        raise IncompatiblePeer(f"the KV producer refused us: {reply.get('error', '')}")
    if reply["op"] != "CHALLENGE":
        raise IncompatiblePeer(f"the KV producer does not authenticate (it answered {reply['op']!r:.40}): "
                               "an older pdserve, or not a KV port")
    identity, their_fingerprint, their_nonce = introduction(reply)
    sealed = reply.get("sealed", False)
    if not isinstance(sealed, bool):
        raise IncompatiblePeer(f"the KV producer {identity!r} sent a malformed CHALLENGE (sealed={sealed!r:.20})")
    transcript = Transcript(credentials.identity, fingerprint, nonce, identity, their_fingerprint, their_nonce,
                            encryption, sealed)
    if not proof_matches(credentials.secret, "producer", transcript, reply.get("proof")):
        raise IncompatiblePeer(f"the KV producer {identity!r} did not prove the cluster secret: "
                               "not a member of this cluster, or started with another secret file")
    if encryption != "auto" and sealed != (encryption == "on"):
        raise EncryptionMismatch(f"the KV producer {identity!r} chose a connection {'sealed' if sealed else 'in clear'} "
                                 f"though this consumer is set to kv_encryption={encryption!r}")
    peer = Peer(identity, their_fingerprint, credentials.authenticated, keys=transcript.session_keys(credentials.secret))
    return peer, encode({"op": "PROOF", "proof": proof(credentials.secret, "consumer", transcript)})


def authenticate_consumer(sock: socket.socket, credentials: Credentials, fingerprint: str, auth: dict) -> Peer:
    """Producer: answers the consumer's AUTH (already read) with a CHALLENGE and checks its PROOF.
    Decides whether the connection is sealed (`kv_transfer.encryption.agree`, from both settings
    and the socket's two addresses). Raises AuthFailed, after a REFUSED, when it fails (an
    encryption mismatch included); the caller then closes the connection."""
    try:
        identity, their_fingerprint, their_nonce = introduction(auth)
        their_encryption = requested_encryption(auth)
    except AuthFailed as error:
        refuse(sock, f"malformed AUTH: {error}")
        raise
    try:
        sealed = agree(their_encryption, credentials.effective_encryption,
                       is_cross_host(sock.getsockname()[0], sock.getpeername()[0]))
    except EncryptionMismatch as error:
        refuse(sock, str(error))
        raise AuthFailed(f"consumer {identity!r}: {error}") from None
    nonce = new_nonce()
    transcript = Transcript(identity, their_fingerprint, their_nonce, credentials.identity, fingerprint, nonce,
                            their_encryption, sealed)
    send_message(sock, {"op": "CHALLENGE", "identity": credentials.identity, "fingerprint": fingerprint,
                        "nonce": nonce, "sealed": sealed, "proof": proof(credentials.secret, "producer", transcript)})
    try:
        answer = recv_message(sock, MAX_PREAUTH_MESSAGE_BYTES)
    except PeerClosed:
        raise AuthFailed(f"consumer {identity!r} left without a proof: it could not verify ours "
                         "(another cluster secret?)") from None
    if answer["op"] != "PROOF" or not proof_matches(credentials.secret, "consumer", transcript, answer.get("proof")):
        why = (f"consumer {identity!r} did not prove the cluster secret"
               if answer["op"] == "PROOF" else f"expected PROOF, got {answer['op']!r:.40}")
        refuse(sock, "authentication failed")
        raise AuthFailed(why)
    return Peer(identity, their_fingerprint, credentials.authenticated, their_encryption,
                transcript.session_keys(credentials.secret))


def refuse(sock: socket.socket, error: str) -> None:
    """Best effort: tells the peer why before the caller closes the connection."""
    try:
        send_message(sock, {"op": "REFUSED", "error": error})
    except (OSError, TransferError) as failure:  # the peer is gone already: closing is all that is left
        logger.debug("could not tell a refused KV peer why: %s", failure)


# ---- this process's defaults -----------------------------------------------------------------------
_process = Credentials(f"kv-{socket.gethostname()[:64]}-{os.getpid()}")
_warned: set[str] = set()
_lock = threading.Lock()


def process_credentials() -> Credentials:
    """What `TransferServer`, `PullClient` and `release_transfer` use when given none: the worker's,
    once its entry point called `set_process_credentials`; else unauthenticated, one identity per
    process (so a process's own one-shot releases count as its producer's own)."""
    return _process


def set_process_credentials(credentials: Credentials) -> None:
    """Called once by a worker's entry point, before any KV connection."""
    global _process
    _process = credentials


def warn_if_unauthenticated(credentials: Credentials, side: str) -> None:
    """Logs once per process and side that the KV plane runs without a cluster secret."""
    if credentials.authenticated:
        return
    with _lock:
        if side in _warned:
            return
        _warned.add(side)
    logger.warning("the KV plane is unauthenticated (%s %s has no cluster secret): anyone who can reach a KV "
                   "port can pull or release KV; start workers with --cluster-secret-file (pdserve up does)",
                   side, credentials.identity)


__all__ = ["AUTH_TIMEOUT_S", "AuthFailed", "Credentials", "MAX_PREAUTH_MESSAGE_BYTES", "Peer", "SECRET_FILE_ENV",
           "SecretFileError", "Transcript", "authenticate_consumer", "authenticate_to_producer", "authorize",
           "create_secret_file", "introduction", "load_secret", "process_credentials", "proof", "proof_matches",
           "readable_by_others", "refuse", "requested_encryption", "set_process_credentials",
           "warn_if_unauthenticated"]
