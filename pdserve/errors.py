"""pdserve's typed errors and the one table that maps them to gRPC and HTTP status codes.

Raise a `ServeError` subclass anywhere on the request path; the service edges (gRPC servicers,
the HTTP app, the SDK) translate with `grpc_code`, `http_status` and `from_grpc_code`.
"""

from __future__ import annotations

import math

import grpc


class ServeError(Exception):
    """Base: `message` is safe to show to the client; `field` names the offending input, if any."""

    kind = "internal_error"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidRequest(ServeError):
    kind = "invalid_request_error"


class NotFound(ServeError):
    """What the request names does not exist here (a model this cluster does not serve). The kind
    is vLLM's own type for it, as its OpenAI server sends it."""

    kind = "NotFoundError"


class Overloaded(ServeError):
    """The cluster refuses work now (admission control, the router's in-flight limit).
    `retry_after_s`, when known, is the predicted time until a request like this one would be
    admitted: HTTP sends it as `Retry-After` (whole seconds, rounded up), gRPC as the trailing
    metadata `retry-after-s`, and the SDK's `Overloaded` carries it back."""

    kind = "overloaded"

    def __init__(self, message: str, field: str | None = None, retry_after_s: float | None = None):
        super().__init__(message, field)
        self.retry_after_s = retry_after_s


class NoHealthyWorker(ServeError):
    kind = "service_unavailable"


class Cancelled(ServeError):
    kind = "cancelled"


class DeadlineExceeded(ServeError):
    kind = "timeout"


class InternalError(ServeError):
    kind = "internal_error"


# error type -> (gRPC status, HTTP status). 499 is the de facto "client closed request".
STATUS_TABLE: dict[type[ServeError], tuple[grpc.StatusCode, int]] = {
    InvalidRequest: (grpc.StatusCode.INVALID_ARGUMENT, 400),
    NotFound: (grpc.StatusCode.NOT_FOUND, 404),
    Overloaded: (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    NoHealthyWorker: (grpc.StatusCode.UNAVAILABLE, 503),
    Cancelled: (grpc.StatusCode.CANCELLED, 499),
    DeadlineExceeded: (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    InternalError: (grpc.StatusCode.INTERNAL, 500),
    ServeError: (grpc.StatusCode.INTERNAL, 500),
}


def grpc_code(error: ServeError) -> grpc.StatusCode:
    return STATUS_TABLE[_entry(error)][0]


def http_status(error: ServeError) -> int:
    return STATUS_TABLE[_entry(error)][1]


RETRY_AFTER_METADATA = "retry-after-s"  # gRPC trailing metadata of RESOURCE_EXHAUSTED: seconds, a float


def retry_after_header(error: ServeError) -> dict[str, str]:
    """The HTTP headers an error's response carries: `Retry-After` in whole seconds (RFC 9110),
    rounded up so a client that waits it is not refused again for the same reason."""
    retry_after_s = getattr(error, "retry_after_s", None)
    return {} if retry_after_s is None else {"Retry-After": str(max(1, math.ceil(retry_after_s)))}


def grpc_trailing_metadata(error: ServeError) -> tuple[tuple[str, str], ...]:
    retry_after_s = getattr(error, "retry_after_s", None)
    return () if retry_after_s is None else ((RETRY_AFTER_METADATA, f"{retry_after_s:.3f}"),)


def from_grpc_code(code: grpc.StatusCode, message: str) -> ServeError:
    """The typed error for a status received from a peer (a worker, or the router in the SDK)."""
    for error_type, (status, _) in STATUS_TABLE.items():
        if status == code and error_type is not ServeError:
            return error_type(message)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return InvalidRequest(message)
    return InternalError(message) if code != grpc.StatusCode.UNKNOWN else InternalError(message or "unknown error")


def _entry(error: ServeError) -> type[ServeError]:
    for error_type in type(error).__mro__:
        if error_type in STATUS_TABLE:
            return error_type
    return ServeError
