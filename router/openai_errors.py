"""OpenAI's error body, as both public HTTP layers send it (`router.http_api`, and the API-key
middleware of `router.public_auth`). Light on purpose: the router imports it before its gRPC port
is bound, and nothing here may import vLLM."""

from __future__ import annotations

from pdserve.errors import ServeError, http_status, http_type


def error_body(error: ServeError) -> dict:
    """OpenAI's error body. Message and param may echo the client's text: an unpaired surrogate in it
    is sent escaped ("\\ud800"), as no UTF-8 body can carry it (found by fuzzing: the 400 became a 500)."""
    return {"error": {"message": _sendable(error.message), "type": http_type(error), "param": _sendable(error.field),
                      "code": http_status(error)}}


def _sendable(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")
