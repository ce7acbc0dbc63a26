"""The contract between the runner and a serving system under test.

A target turns one `Prompt` into a stream of `Delta`s. The runner owns the clock: it timestamps
each delta as it arrives, so TTFT, ITL and E2E latency are measured the same way for every
target. A target never swallows a failure: it raises `TargetError` (or lets a transport error
propagate) and the runner records it against the request; a refusal at admission is `Refused`,
which the runner records apart from errors (an overloaded server that says no at once is doing its
job; one that fails requests is not).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from loadgen.prompts import Prompt


@dataclass(frozen=True)
class PhaseTimings:
    """Per-phase breakdown a pdserve response carries on its final message (`pdserve.timings.Timings`).
    disaggregated: False when the router ran the request on a decode worker alone (no transfer)."""

    queued_s: float
    prefill_s: float
    kv_transfer_s: float
    kv_transfer_bytes: int
    decode_s: float
    disaggregated: bool = True


@dataclass(frozen=True)
class Delta:
    """One streamed message from the target.

    content: True when it carries generated output (even empty text, e.g. a special token);
      only content deltas count for TTFT / ITL / E2E latency, as in `vllm bench serve`.
    num_tokens: tokens in this delta when the target knows it (gRPC), else None.
    completion_tokens / prompt_tokens: totals the server reports (OpenAI `usage`), if any.
    phases: pdserve's per-phase timings (final message only).
    """

    content: bool
    text: str = ""
    num_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    phases: PhaseTimings | None = None


class TargetError(Exception):
    """The server answered with an error (HTTP status, gRPC status, error event in the stream)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Refused(TargetError):
    """The server refused the request at admission (HTTP 429, gRPC RESOURCE_EXHAUSTED): it did no
    work for it and says so at once. `retry_after_s`: when it suggests trying again, if it said."""

    def __init__(self, status: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(status, message)
        self.retry_after_s = retry_after_s


@runtime_checkable
class Target(Protocol):
    """A system under test. `open` before the first `generate`, `close` after the last;
    `generate` may be called concurrently by many tasks."""

    name: str  # backend label in reports, e.g. "openai" or "pdserve"

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def generate(self, prompt: Prompt) -> AsyncIterator[Delta]: ...
