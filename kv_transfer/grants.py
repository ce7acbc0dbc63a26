"""Lease grants that do not wait for the next engine step.

A prefilled request's blocks are pinned by the scheduler half when the request finishes
(`PDScheduler.request_finished`); the worker half, whose transfer server answers consumers, learns
of the lease from the connector metadata of a later step. With vLLM's scheduling, that metadata
reaches the model runner only after the following forward: under load a consumer's PULL waited one
whole prefill for a grant (measured: a KV "transfer" of ~140 ms that was 139 ms of waiting and
1 ms of copying, with 1,500-token prompts queued on the tiny model).

So the scheduler half also sends each grant straight to its own transfer server, over one local
connection opened with the engine's `grant_token` (a secret only the worker process that built the
engine, and so both connector halves, know): `GRANT_HELLO` then one `GRANT` per lease, no replies.
The metadata grant still follows and is ignored as a duplicate (`LeaseTable.grant`); if the direct
path fails, the metadata grant is the lease, as before. Nothing here blocks the scheduler for long:
a send that cannot complete within `SEND_TIMEOUT_S` drops the connection (reopened for the next).
GRANT_HELLO is the one first message a producer takes instead of the cluster-secret handshake of
`kv_transfer.auth`: the per-engine token (compared in constant time) is its credential, sent in
clear on a connection to the engine's own port.
"""

from __future__ import annotations

import hmac
import logging
import socket

from kv_transfer.records import LeaseGrant
from kv_transfer.wire import send_message

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 0.2


def grant_message(grant: LeaseGrant) -> dict:
    return {"op": "GRANT", "transfer_id": grant.transfer_id, "request_id": grant.request_id,
            "block_ids": list(grant.block_ids), "num_tokens": grant.num_tokens, "lease_s": grant.lease_s}


def grant_from_message(message: dict) -> LeaseGrant:
    """The LeaseGrant a GRANT carries; ValueError when a field is missing or of the wrong type."""
    try:
        grant = LeaseGrant(str(message["transfer_id"]), str(message["request_id"]),
                           tuple(int(block) for block in message["block_ids"]), int(message["num_tokens"]),
                           float(message["lease_s"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"a bad GRANT: {error}") from error
    if not grant.block_ids or grant.lease_s <= 0:
        raise ValueError("a GRANT needs block ids and a positive lease")
    return grant


def token_matches(offered: object, expected: str) -> bool:
    """Constant-time; an empty expected token (early grants off) matches nothing."""
    return bool(expected) and isinstance(offered, str) and hmac.compare_digest(offered.encode(), expected.encode())


class EarlyGranter:
    """The scheduler half's connection to its own transfer server (`address`, "host:port")."""

    def __init__(self, address: str, token: str):
        self.address, self.token = address, token
        self._sock: socket.socket | None = None

    def send(self, grant: LeaseGrant) -> bool:
        """Best effort: True when the grant was handed to the transfer server's connection."""
        if not self.token:
            return False
        try:
            if self._sock is None:
                self._sock = self._connect()
            send_message(self._sock, grant_message(grant))
            return True
        except OSError as error:
            logger.debug("early KV grant to %s failed (the next step grants it): %s", self.address, error)
            self.close()
            return False

    def _connect(self) -> socket.socket:
        host, port = self.address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=SEND_TIMEOUT_S)
        sock.settimeout(SEND_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send_message(sock, {"op": "GRANT_HELLO", "token": self.token})
        return sock

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
