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
    How a choice's tokens are cut into events depends on timing (vLLM's server sends the tokens of
    several engine steps in one event when it falls behind the engine), so a run of events that
    carry only text, token ids and logprobs is read as one, joined onto the next event
    (`coalesced`)."""
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
    """One choice's events with each run of piece events (`_is_piece`: text, token ids, logprobs,
    a tool call's next argument characters, and nothing else) joined onto the event after it
    (`_joined`: strings and lists concatenated in order, tool calls by their index), or kept as
    one event at the end. How many tokens an event carries depends on timing: an
    OpenAI server sends the tokens of several engine steps in one event when it falls behind its
    engine (vLLM's output collector merges their deltas), so two servers that send the same tokens
    read the same here however they cut them."""
    out: list[dict] = []
    pending: dict | None = None
    for event in events:
        if pending is not None:   # the event's own fields (id, created, ...) kept, the choice joined
            event = event | {"choices": [_joined(pending["choices"][0], event["choices"][0])]}
            pending = None
        if _is_piece(event):
            pending = event
        else:
            out.append(event)
    return out + ([pending] if pending is not None else [])


PIECE_FIELDS = ("index", "text", "delta", "logprobs", "token_ids")   # what a piece event's choice may carry


def _is_piece(event: dict) -> bool:
    """The event's choice carries only a piece of the answer: text (a chat's `delta.content`), its
    token ids and their logprobs, or more characters of a tool call's arguments (the call's index
    and `function.arguments` only); no role, new tool call, finish reason or prompt field."""
    choice = event["choices"][0]
    delta = choice.get("delta")
    carried = {key for key, value in choice.items() if _carries(value)}
    delta_carried = {key for key, value in delta.items() if _carries(value)} if isinstance(delta, dict) else set()
    calls = delta.get("tool_calls") if isinstance(delta, dict) else None
    return (carried <= set(PIECE_FIELDS) and delta_carried <= {"content", "tool_calls"}
            and all(_arguments_only(call) for call in calls or ()))


def _arguments_only(call: Any) -> bool:
    """A streamed tool call's delta that only continues its arguments (no id, type or name)."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return False
    function = {key for key, value in call["function"].items() if _carries(value)}
    return {key for key, value in call.items() if _carries(value)} <= {"index", "function"} and function <= {"arguments"}


def _joined(earlier: Any, later: Any, key: str = "") -> Any:
    """Two consecutive pieces of one stream as one: strings and lists concatenated (tool calls,
    `key` "tool_calls", joined call by call on their index), objects joined field by field, a null or
    absent side giving way to the other, any other value the later one's."""
    if isinstance(earlier, dict) and isinstance(later, dict):
        keys = [*earlier, *(k for k in later if k not in earlier)]
        return {k: _joined(earlier.get(k), later.get(k), k) for k in keys}
    if key == "tool_calls" and isinstance(earlier, list) and isinstance(later, list):
        by_index: dict[Any, Any] = {}
        for call in [*earlier, *later]:
            at = call.get("index") if isinstance(call, dict) else id(call)
            by_index[at] = _joined(by_index[at], call) if at in by_index else call
        return list(by_index.values())
    if isinstance(earlier, (str, list)) and type(earlier) is type(later):
        return earlier + later
    return earlier if later is None else later


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
