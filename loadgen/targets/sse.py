"""Server-sent events and OpenAI (chat) completion chunks, decoded without I/O (tested on plain strings)."""

from __future__ import annotations

import json

from loadgen.targets.base import Delta, TargetError


class SSEDecoder:
    """Feed lines (without their line ending) of an SSE stream; `feed` returns an event's data
    when a blank line completes it. Comment lines (`:ping`) and non-data fields are skipped;
    several `data:` lines in one event are joined with newlines, per the SSE specification."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if line == "":
            return self.flush()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """The pending event's data (at end of stream a last event may lack its blank line)."""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


def parse_completion_chunk(data: str) -> Delta | None:
    """One `/v1/completions` stream event -> a Delta, or None when it carries nothing we use.

    A chunk with `choices` is content (its text may be empty: a special token); a chunk with only
    `usage` is the final accounting (`stream_options.include_usage`). An `error` object raises
    TargetError.
    """
    chunk = _decode(data)
    usage = _usage(chunk)
    if choices := chunk.get("choices"):
        return Delta(content=True, text=choices[0].get("text") or "", **usage)
    return Delta(content=False, **usage) if usage else None


def parse_chat_chunk(data: str) -> Delta | None:
    """One `/v1/chat/completions` stream event -> a Delta, or None when it carries nothing we use.

    A choice whose `delta` has `content` (or `reasoning_content`) is content, even empty, except
    the opening role-only chunk (`{"role": "assistant", "content": ""}`), which carries no token;
    a finish chunk with an empty delta is not content either. `usage` and `error` as for
    completions.
    """
    chunk = _decode(data)
    usage = _usage(chunk)
    if choices := chunk.get("choices"):
        delta = choices[0].get("delta") or {}
        text = delta.get("content")
        role_only = "role" in delta and not text and not delta.get("reasoning_content")
        if not role_only and (text is not None or delta.get("reasoning_content") is not None):
            return Delta(content=True, text=text or "", **usage)
    return Delta(content=False, **usage) if usage else None


def _decode(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as bad:
        raise TargetError("bad stream", f"event is not JSON ({bad}): {data[:200]!r}") from bad
    if not isinstance(chunk, dict):
        raise TargetError("bad stream", f"event is not a JSON object: {data[:200]!r}")
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        raise TargetError("stream error", message)
    return chunk


def _usage(chunk: dict) -> dict[str, int]:
    """{"completion_tokens": .., "prompt_tokens": ..} as Delta keyword arguments; {} without usage."""
    usage = chunk.get("usage") or {}
    return {k: usage[k] for k in ("completion_tokens", "prompt_tokens") if usage.get(k) is not None}


def error_message(body: str) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}` or vLLM's
    `{"message": ...}`), else the body's first 300 characters."""
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return body[:300]
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
    return body[:300]
