"""Who may use a KV connection: a mutual challenge-response keyed by the cluster secret.

Every consumer connection to a producer's KV port starts with it, before any HELLO, PULL, COPIED
or RELEASE (`kv_transfer.wire` has the rest of the exchanges):

    consumer -> AUTH {identity, fingerprint, nonce}
                                       producer -> CHALLENGE {identity, fingerprint, nonce, proof}
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

`identity` is the worker's id on the KV plane: a producer binds each transfer to the first
consumer identity that uses it (`LeaseTable.claim`), and `authorize` says who else may. With one
secret shared by the cluster, an identity is a claim made by a holder of the secret: the
handshake keeps out whoever lacks the secret; it does not make one member unable to pose as
another. It authenticates a connection at its start; it does not encrypt or sign the messages that
follow (see SECURITY.md).

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
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kv_transfer.errors import IncompatiblePeer, PeerClosed, TransferError
from kv_transfer.wire import encode, recv_message, send_message

logger = logging.getLogger(__name__)

Role = Literal["producer", "consumer"]
PROTOCOL = "pdserve-kv-auth-v1"
NONCE_BYTES = 32
MIN_SECRET_BYTES = 16
MAX_IDENTITY_CHARS = 128
MAX_FINGERPRINT_CHARS = 256
MAX_PREAUTH_MESSAGE_BYTES = 1024   # AUTH, PROOF, GRANT_HELLO: everything read from a stranger
AUTH_TIMEOUT_S = 5.0               # each read before the peer proved itself
SECRET_FILE_ENV = "PDSERVE_CLUSTER_SECRET_FILE"   # read by the worker's entry point only


class AuthFailed(TransferError):
    """A peer did not prove knowledge of the cluster secret, or broke the handshake's rules."""


class SecretFileError(ValueError):
    """The cluster secret file cannot be used; the message says how to fix it."""


@dataclass(frozen=True)
class Credentials:
    """This side's name on the KV plane and the cluster secret (None: unauthenticated)."""

    identity: str
    secret: bytes | None = None

    def __post_init__(self) -> None:
        if why := identity_problem(self.identity):
            raise ValueError(why)
        if self.secret is not None and len(self.secret) < MIN_SECRET_BYTES:
            raise SecretFileError(f"a cluster secret needs at least {MIN_SECRET_BYTES} bytes, got "
                                  f"{len(self.secret)}: generate one with `head -c 32 /dev/urandom | xxd -p -c 64`")

    @property
    def authenticated(self) -> bool:
        return self.secret is not None

    @classmethod
    def from_file(cls, path: str | os.PathLike | None, identity: str) -> "Credentials":
        """With the secret in `path`; unauthenticated when `path` is empty or None."""
        return cls(identity, load_secret(path) if path else None)


@dataclass(frozen=True)
class Transcript:
    """What both proofs cover: the two sides' claims and nonces (hex), as sent."""

    consumer_identity: str
    consumer_fingerprint: str
    consumer_nonce: str
    producer_identity: str
    producer_fingerprint: str
    producer_nonce: str

    def signed_bytes(self, role: Role) -> bytes:
        """Unambiguous (a JSON list), so no two transcripts sign alike."""
        return json.dumps([PROTOCOL, role, self.consumer_identity, self.consumer_fingerprint, self.consumer_nonce,
                           self.producer_identity, self.producer_fingerprint, self.producer_nonce]).encode()


@dataclass(frozen=True)
class Peer:
    """The other side of an authenticated (or, without a secret, merely introduced) connection."""

    identity: str
    fingerprint: str
    authenticated: bool


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
    PROOF, which the caller sends together with its next message (no extra round trip). Raises
    IncompatiblePeer when the producer refuses us or cannot prove the secret."""
    nonce = new_nonce()
    send_message(sock, {"op": "AUTH", "identity": credentials.identity, "fingerprint": fingerprint, "nonce": nonce})
    reply = recv_message(sock, MAX_PREAUTH_MESSAGE_BYTES)
    if reply["op"] == "REFUSED":
        raise IncompatiblePeer(f"the KV producer refused us: {reply.get('error', '')}")
    if reply["op"] != "CHALLENGE":
        raise IncompatiblePeer(f"the KV producer does not authenticate (it answered {reply['op']!r:.40}): "
                               "an older pdserve, or not a KV port")
    identity, their_fingerprint, their_nonce = introduction(reply)
    transcript = Transcript(credentials.identity, fingerprint, nonce, identity, their_fingerprint, their_nonce)
    if not proof_matches(credentials.secret, "producer", transcript, reply.get("proof")):
        raise IncompatiblePeer(f"the KV producer {identity!r} did not prove the cluster secret: "
                               "not a member of this cluster, or started with another secret file")
    peer = Peer(identity, their_fingerprint, credentials.authenticated)
    return peer, encode({"op": "PROOF", "proof": proof(credentials.secret, "consumer", transcript)})


def authenticate_consumer(sock: socket.socket, credentials: Credentials, fingerprint: str, auth: dict) -> Peer:
    """Producer: answers the consumer's AUTH (already read) with a CHALLENGE and checks its PROOF.
    Raises AuthFailed, after a REFUSED, when it fails; the caller then closes the connection."""
    try:
        identity, their_fingerprint, their_nonce = introduction(auth)
    except AuthFailed as error:
        refuse(sock, f"malformed AUTH: {error}")
        raise
    nonce = new_nonce()
    transcript = Transcript(identity, their_fingerprint, their_nonce, credentials.identity, fingerprint, nonce)
    send_message(sock, {"op": "CHALLENGE", "identity": credentials.identity, "fingerprint": fingerprint,
                        "nonce": nonce, "proof": proof(credentials.secret, "producer", transcript)})
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
    return Peer(identity, their_fingerprint, credentials.authenticated)


def refuse(sock: socket.socket, error: str) -> None:
    """Best effort: tells the peer why before the caller closes the connection."""
    try:
        send_message(sock, {"op": "REFUSED", "error": error})
    except (OSError, TransferError) as failure:  # the peer is gone already: closing is all that is left
        logger.debug("could not tell a refused KV peer why: %s", failure)


# ---- the secret ------------------------------------------------------------------------------------
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
           "readable_by_others", "refuse", "set_process_credentials", "warn_if_unauthenticated"]
