"""What the HTTP API's OpenAPI schema (`/openapi.json`) says each route answers, taken from the
one status table in `pdserve.errors`: a route names the error types it can raise, and
`responses_for` turns them into FastAPI `responses=` entries with the status from that table,
OpenAI's error body (`ErrorBody`, as `router.openai_errors.error_body` builds it) and, for a refusal
under load, the `Retry-After` header.

The contract: every status a route can answer is in its entry, and no other. FastAPI's own 422
is not (pdserve answers a body that fails validation with 400, as vLLM does), so `openapi_schema`
drops it and its schemas from the generated document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from pdserve.errors import (
    STATUS_TABLE, DeadlineExceeded, InternalError, InvalidRequest, NoHealthyWorker, NotFound, Overloaded, ServeError,
    Unauthenticated,
)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(BaseModel):
    """OpenAI's (and vLLM's) error body: `type` is the error's kind, `param` the offending field
    (None when no one field is at fault), `code` the HTTP status."""
    error: ErrorDetail


WHEN: dict[type[ServeError], str] = {
    InvalidRequest: "The request's own input is refused: a field of vLLM's API pdserve does not serve, a wrong "
                    "type, a value out of vLLM's range, a prompt too long for the model. `error.param` names the "
                    "field, as vLLM names it (`body.<field>` for a body that fails the schema).",
    Unauthenticated: "No API key, or a wrong one, when the router requires keys (`router.public_auth`: every "
                     "path but /health and /metrics).",
    NotFound: "The request names a model this cluster does not serve.",
    Overloaded: "Refused for load (admission control, the router's in-flight limit): retry after `Retry-After`.",
    NoHealthyWorker: "No worker can take the request now (none alive, or every one failed it).",
    DeadlineExceeded: "The request's deadline passed before it was served.",
    InternalError: "A bug in pdserve (its log has the traceback); never the request's fault.",
}

RETRY_AFTER = {"Retry-After": {"description": "Seconds until a request like this one would be admitted "
                                              "(whole seconds, rounded up)",
                               "schema": {"type": "integer", "minimum": 1}}}

WWW_AUTHENTICATE = {"WWW-Authenticate": {"description": "How to authenticate: `Bearer`", "schema": {"type": "string"}}}

# The errors each kind of route can answer with.
GENERATION_ERRORS = (InvalidRequest, Unauthenticated, NotFound, Overloaded, NoHealthyWorker, DeadlineExceeded,
                     InternalError)
TOKENIZE_ERRORS = (InvalidRequest, Unauthenticated, NotFound, InternalError)   # /tokenize, /detokenize
KEYED_ERRORS = (Unauthenticated, InternalError)   # GET routes without input behind the API key (/v1/models)
PLAIN_ERRORS = (InternalError,)   # GET routes without input nor key (/health, /metrics): only a bug fails them

SSE_200 = {200: {"description": "The completion: a JSON object, or with `\"stream\": true` server-sent events "
                                "(`data: {chunk}` lines, an error as a last event, then `data: [DONE]`)",
                 "content": {"application/json": {"schema": {"type": "object"}},
                             # OpenAPI before 3.2: the schema of each event (as SSE parsers read one)
                             "text/event-stream": {"schema": {
                                 "type": "object", "required": ["data"],
                                 "properties": {"data": {"type": "string", "description": "a chunk or an error "
                                                         "body as JSON, or [DONE]"}}}}}}}


def responses_for(errors: tuple[type[ServeError], ...]) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses=` for a route that can raise `errors`: one entry per HTTP status."""
    responses: dict[int | str, dict[str, Any]] = {}
    for error_type in errors:
        status = STATUS_TABLE[error_type][1]
        entry = responses.setdefault(status, {"model": ErrorBody, "description": ""})
        entry["description"] = " ".join(filter(None, [entry["description"], WHEN[error_type]]))
        if error_type is Overloaded:
            entry["headers"] = RETRY_AFTER
        if error_type is Unauthenticated:
            entry["headers"] = WWW_AUTHENTICATE
    return responses


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document for `app` without the 422 it adds to every route that takes input."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                             description=app.description)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(unused, None)
        app.openapi_schema = schema
    return app.openapi_schema
