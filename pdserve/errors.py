"""pdserve's typed errors and the one table that maps them to gRPC and HTTP status codes.

Raise a `ServeError` subclass anywhere on the request path; the service edges (gRPC servicers,
the HTTP app, the SDK) translate with `grpc_code`, `http_status`, `http_type` and `from_grpc_code`.
An error's `kind` is what the SDK and gRPC clients name it; HTTP's `error.type` is vLLM's
(`STATUS_TABLE`), so an OpenAI client sees what vLLM's server would send.
"""

from __future__ import annotations

import math
from typing import NamedTuple

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


class MalformedBody(InvalidRequest):
    """A body that does not match the API's schema (a wrong type, a missing field, JSON that does
    not parse): vLLM answers it from FastAPI's validation, with its own error `type`."""


class Unauthenticated(ServeError):
    """The caller did not prove it may use the API (no API key, or a wrong one): refused before any
    work. The kind is OpenAI's for a bad key."""

    kind = "invalid_request_error"


class NotFound(ServeError):
    """What the request names does not exist here (a model this cluster does not serve). The kind
    is vLLM's own type for it, as its OpenAI server sends it."""

    kind = "NotFoundError"


# what a router's admission refused a request on (`router.policies.admission.Refuse.by`, the label
# `by` of `pdserve_router_admission_refusals_total`): its TTFT SLO, its TPOT SLO, or no path at all
ADMISSION_REFUSED_BY = ("ttft", "tpot", "no_worker")


def refused_by_kinds(by: dict[str, int]) -> str:
    """"ttft 3, tpot 2": refusal counts by kind in `ADMISSION_REFUSED_BY` order, kinds with none left out."""
    return ", ".join(f"{kind} {by[kind]}" for kind in ADMISSION_REFUSED_BY if by.get(kind))


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


class Status(NamedTuple):
    grpc_code: grpc.StatusCode
    http_status: int
    http_type: str   # `error.type` of the HTTP body: vLLM's OpenAI server's name where it answers the status


# error type -> its statuses. 499 is the de facto "client closed request". The HTTP `type` is the one
# vLLM's server sends (a value it refuses: BadRequestError; a body that fails its schema: "Bad
# Request"; 503: ServiceUnavailableError), pdserve's `kind` where vLLM has no such answer (429, 504).
STATUS_TABLE: dict[type[ServeError], Status] = {
    InvalidRequest: Status(grpc.StatusCode.INVALID_ARGUMENT, 400, "BadRequestError"),
    MalformedBody: Status(grpc.StatusCode.INVALID_ARGUMENT, 400, "Bad Request"),
    Unauthenticated: Status(grpc.StatusCode.UNAUTHENTICATED, 401, Unauthenticated.kind),
    NotFound: Status(grpc.StatusCode.NOT_FOUND, 404, "NotFoundError"),
    Overloaded: Status(grpc.StatusCode.RESOURCE_EXHAUSTED, 429, Overloaded.kind),
    NoHealthyWorker: Status(grpc.StatusCode.UNAVAILABLE, 503, "ServiceUnavailableError"),
    Cancelled: Status(grpc.StatusCode.CANCELLED, 499, Cancelled.kind),
    DeadlineExceeded: Status(grpc.StatusCode.DEADLINE_EXCEEDED, 504, DeadlineExceeded.kind),
    InternalError: Status(grpc.StatusCode.INTERNAL, 500, "InternalServerError"),
    ServeError: Status(grpc.StatusCode.INTERNAL, 500, "InternalServerError"),
}


def grpc_code(error: ServeError) -> grpc.StatusCode:
    return STATUS_TABLE[_entry(error)][0]


def http_status(error: ServeError) -> int:
    return STATUS_TABLE[_entry(error)][1]


def http_type(error: ServeError) -> str:
    return STATUS_TABLE[_entry(error)].http_type


RETRY_AFTER_METADATA = "retry-after-s"  # gRPC trailing metadata of RESOURCE_EXHAUSTED: seconds, a float
ANSWERED_METADATA = "pdserve-error"   # on every error the router answers with: the error type's name


def retry_after_header(error: ServeError) -> dict[str, str]:
    """The HTTP headers an error's response carries: `Retry-After` in whole seconds (RFC 9110),
    rounded up so a client that waits it is not refused again for the same reason."""
    retry_after_s = getattr(error, "retry_after_s", None)
    return {} if retry_after_s is None else {"Retry-After": str(max(1, math.ceil(retry_after_s)))}


def grpc_trailing_metadata(error: ServeError) -> tuple[tuple[str, str], ...]:
    """What an error's call carries besides its status: which pdserve error it is (so a client can
    tell the router's answer from a transport's failure of the same code: `ANSWERED_METADATA`),
    and an Overloaded's retry-after."""
    retry_after_s = getattr(error, "retry_after_s", None)
    answered = ((ANSWERED_METADATA, type(error).__name__),)
    return answered if retry_after_s is None else (*answered, (RETRY_AFTER_METADATA, f"{retry_after_s:.3f}"))


def from_grpc_code(code: grpc.StatusCode, message: str) -> ServeError:
    """The typed error for a status received from a peer (a worker, or the router in the SDK)."""
    for error_type, status in STATUS_TABLE.items():
        if status.grpc_code == code and error_type not in (ServeError, MalformedBody):
            return error_type(message)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return InvalidRequest(message)
    return InternalError(message) if code != grpc.StatusCode.UNKNOWN else InternalError(message or "unknown error")


def _entry(error: ServeError) -> type[ServeError]:
    for error_type in type(error).__mro__:
        if error_type in STATUS_TABLE:
            return error_type
    return ServeError
