"""The compatibility suite's comparison (issue 16 item 2): vLLM's OpenAI server's answer to a
request is the spec, pdserve's answer to the same request is compared with it field by field, and
every difference is listed with its JSON path. Pure: answers in, differences out
(tests/unit/router/test_openai_compat_diff.py checks it on plain values;
tests/integration/test_openai_vllm_server.py runs it against both servers).

What is not a difference, everywhere:
- `VARIES`: values that differ between any two responses of one server (ids, timestamps); their
  presence still counts.
- A field null on one side and absent on the other: OpenAI's clients read both as None (vLLM sends
  many null-valued fields of its own, e.g. `kv_transfer_params`, `choices.*.token_ids`).
- Floats within `FLOAT_TOLERANCE` (logprobs: the prefill and decode engines compute the same
  float32 math in other batches).
- An error's `message`: free text; its presence and type count (the issue asks for status and
  shape), `type`, `param` and `code` are compared.

What is a difference but intended is `INTENDED`: one list, each entry with its reason. Anything
else pdserve answers differently is a bug in pdserve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

FLOAT_TOLERANCE = 1e-3
# Paths within one response object (a body, or one event of a stream), `*` one segment.
VARIES = ("id", "created", "data.*.created", "data.*.permission.*.id",
          "data.*.permission.*.created", "choices.*.message.tool_calls.*.id",   # a tool call's id is random
          "choices.*.delta.tool_calls.*.id")
FREE_TEXT = ("error.message",)
ABSENT = object()   # a field one side does not send


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status and JSON body; a stream's body is its events (each a parsed
    `data:` line, without the final [DONE])."""
    status: int
    body: Any
    streamed: bool = False


@dataclass(frozen=True)
class Difference:
    path: str          # dotted JSON path: "status", "body.choices.0.text", "events.choice 1.3.text"
    expected: Any      # vLLM's value (ABSENT: vLLM does not send it)
    actual: Any        # pdserve's

    def __str__(self) -> str:
        show = lambda value: "(absent)" if value is ABSENT else repr(value)[:200]  # noqa: E731
        return f"{self.path}: vLLM {show(self.expected)}, pdserve {show(self.actual)}"


ANY = object()


@dataclass(frozen=True)
class Intended:
    """A difference pdserve means: `path` and `case` are fnmatch patterns (`*` spans dots too);
    with `vllm_value`, only where vLLM's value is that."""
    path: str
    reason: str
    case: str = "*"
    vllm_value: Any = ANY

    def covers(self, case: str, difference: Difference) -> bool:
        return (fnmatchcase(difference.path, self.path) and fnmatchcase(case, self.case)
                and (self.vllm_value is ANY or difference.expected == self.vllm_value))


# Every difference pdserve means, with its reason (docs/openai-api.md says the same).
INTENDED: tuple[Intended, ...] = (
    Intended("*pdserve_timings", "pdserve's own field: where the request's time went (queue, prefill, KV "
                                 "transfer, decode) and which workers served it; OpenAI's clients ignore it"),
    Intended("*system_fingerprint", "pdserve sends no build fingerprint (OpenAI's field is optional; vLLM's "
                                    "names its own build)"),
    Intended("body.data.*.owned_by", "/v1/models names pdserve as the model's owner, where vLLM names itself"),
    Intended("*error.param", "pdserve names the offending field where vLLM's `param` is null (n, messages); "
                             "a client reading vLLM's null learns less, never something else", vllm_value=None),
    Intended("body.*", "every error pdserve answers has OpenAI's error body, a path it does not serve too "
                       "(404 NotFoundError); vLLM leaves FastAPI's {\"detail\": \"Not Found\"} there",
             case="unknown_route"),
)


def compare(expected: Answer, actual: Answer) -> list[Difference]:
    """Every difference between vLLM's answer and pdserve's, by JSON path."""
    found = [] if expected.status == actual.status else [Difference("status", expected.status, actual.status)]
    if expected.streamed and actual.streamed:
        return found + differences(stream_view(expected.body), stream_view(actual.body), "events")
    return found + differences(expected.body, actual.body, "body")


def stream_view(events: list[dict]) -> dict:
    """A stream as the events of each choice, in order ("choice 0": [...], ...), then the events
    without a choice ("no choice": the usage event, an error event): choices of a request with
    `n` > 1 or several prompts stream interleaved in any order, each choice's own order is kept.
    How a choice's text is cut into events depends on timing (vLLM's server sends the tokens of
    several engine steps in one event when it falls behind the engine), so a run of events that
    carry only text is read as one, its text joined onto the next event's (`coalesced`)."""
    view: dict[str, list] = {}
    for event in events:
        choices = event.get("choices") if isinstance(event, dict) else None
        if not choices:
            view.setdefault("no choice", []).append(event)
            continue
        for choice in choices:
            view.setdefault(f"choice {choice.get('index')}", []).append(event | {"choices": [choice]})
    return {key: stream if key == "no choice" else coalesced(stream) for key, stream in view.items()}


def coalesced(events: list[dict]) -> list[dict]:
    """One choice's events with each run of text-only events (`_text_only`) joined onto the event
    after it: its text first, then that event's (or, before an event without text or at the end,
    the run as one event)."""
    out: list[dict] = []
    pending: dict | None = None
    for event in events:
        text = _text_only(event)
        if text is not None:
            pending = event if pending is None else _with_text(pending, _text_of(pending) + text)
            continue
        if pending is not None:
            own = _text_of(event)
            if own is None:
                out.append(pending)
            else:
                event = _with_text(event, _text_of(pending) + own)
            pending = None
        out.append(event)
    return out + ([pending] if pending is not None else [])


def _text_of(event: dict) -> str | None:
    choice = event["choices"][0]
    text = choice["delta"].get("content") if isinstance(choice.get("delta"), dict) else choice.get("text")
    return text if isinstance(text, str) else None


def _with_text(event: dict, text: str) -> dict:
    choice = dict(event["choices"][0])
    if isinstance(choice.get("delta"), dict):
        choice["delta"] = choice["delta"] | {"content": text}
    else:
        choice["text"] = text
    return event | {"choices": [choice]}


def _text_only(event: dict) -> str | None:
    """The text of an event whose choice carries text and nothing else (no role, tool call,
    logprobs, token ids or finish reason), else None."""
    choice = event["choices"][0]
    carried = {key for key, value in choice.items() if _carries(value) and key not in ("index", "text", "delta")}
    delta = choice.get("delta")
    if carried or (isinstance(delta, dict) and {key for key, value in delta.items() if _carries(value)} != {"content"}):
        return None
    return _text_of(event)


def _carries(value) -> bool:
    """A field's value says something: not None and not empty (vLLM's chat deltas carry `tool_calls: []`)."""
    return value is not None and value != [] and value != {}


def differences(expected: Any, actual: Any, path: str) -> list[Difference]:
    """The differences between two JSON values under the rules of this module's docstring."""
    if _matches(path, VARIES):
        return [] if (expected is ABSENT) == (actual is ABSENT) else [Difference(path, expected, actual)]
    if _matches(path, FREE_TEXT):
        return [] if type(expected) is type(actual) else [Difference(path, expected, actual)]
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = []
        for key in [*expected, *(k for k in actual if k not in expected)]:
            left, right = expected.get(key, ABSENT), actual.get(key, ABSENT)
            if {_kind(left), _kind(right)} == {"absent", "null"}:
                continue
            found += differences(left, right, f"{path}.{key}")
        return found
    if isinstance(expected, list) and isinstance(actual, list):
        found = [d for i, (left, right) in enumerate(zip(expected, actual))
                 for d in differences(left, right, f"{path}.{i}")]
        if len(expected) != len(actual):
            found.append(Difference(f"{path}.length", len(expected), len(actual)))
        return found
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        same = math.isclose(expected, actual, rel_tol=0.0, abs_tol=FLOAT_TOLERANCE) or expected == actual
        return [] if same else [Difference(path, expected, actual)]
    same = type(expected) is type(actual) and expected == actual
    return [] if same else [Difference(path, expected, actual)]


def unexplained(case: str, found: list[Difference], intended: tuple[Intended, ...] = INTENDED) -> list[Difference]:
    """The differences no `intended` entry covers: pdserve's bugs."""
    return [d for d in found if not any(entry.covers(case, d) for entry in intended)]


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    """`path` within its response object (without "body." or "events.<choice>.<n>.") is one of
    `patterns`."""
    segments = path.split(".")[3 if path.startswith("events.") else 1:]
    return any(_segments_match(segments, pattern.split(".")) for pattern in patterns)


def _segments_match(segments: list[str], pattern: list[str]) -> bool:
    return len(segments) == len(pattern) and all(p == "*" or p == s for s, p in zip(segments, pattern))


def _kind(value: Any) -> str:
    return "absent" if value is ABSENT else "null" if value is None else "value"
