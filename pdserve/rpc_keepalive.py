"""HTTP/2 keepalive on the router <-> worker gRPC plane, so a peer that vanished without a word
is noticed in seconds.

A host whose link is cut, or a machine that loses power, sends no RST and no FIN: without pings
a call to it waits until TCP gives up (about 15 minutes) or the request's own deadline (the
router's is 10 minutes): a hang. With these options:

- the router (`client_options`) pings every `PING_EVERY_S` while it has calls open on a
  connection, and closes the connection when a ping goes unanswered for `PING_TIMEOUT_S`: the calls
  on it fail UNAVAILABLE, which the router takes as the worker's failure (quarantine; retry the
  phase elsewhere, a decode resumed from the tokens already sent). A silent stream to a vanished
  worker costs at most `PING_EVERY_S + PING_TIMEOUT_S`;
- the worker (`server_options`) accepts those pings even while it sends nothing (a long prefill
  produces no bytes for seconds), and pings the router in turn, so a stream whose router vanished
  is cancelled and its engine request aborted (its KV blocks freed) instead of decoding into the void.

Pings are HTTP/2 frames answered by gRPC's own I/O threads, not by the engine: a busy worker still
answers them.
"""

from __future__ import annotations

PING_EVERY_S = 5.0
PING_TIMEOUT_S = 5.0
SERVER_PING_EVERY_S = 10.0   # the worker's pings to the router: calls live longer than a router's outage matters


def client_options() -> list[tuple[str, int]]:
    """Channel options of a client of the worker plane (the router)."""
    return [("grpc.keepalive_time_ms", int(PING_EVERY_S * 1000)),
            ("grpc.keepalive_timeout_ms", int(PING_TIMEOUT_S * 1000)),
            ("grpc.keepalive_permit_without_calls", 0),   # idle connections are not pinged
            ("grpc.http2.max_pings_without_data", 0)]     # a silent stream is pinged for as long as it is silent


def server_options() -> list[tuple[str, int]]:
    """Server options of a worker: clients' pings allowed every half `PING_EVERY_S` (no GOAWAY for
    "too many pings"), and its own pings to its clients."""
    return [("grpc.keepalive_time_ms", int(SERVER_PING_EVERY_S * 1000)),
            ("grpc.keepalive_timeout_ms", int(PING_TIMEOUT_S * 1000)),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", int(PING_EVERY_S * 1000 / 2)),
            ("grpc.http2.max_ping_strikes", 0)]   # 0: never GOAWAY a client for pinging (the plane is authenticated)
