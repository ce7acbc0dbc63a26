"""What a prompt step loses beside decode streams, measured on a running 1P+1D cluster whose
engines trace their steps (`planner.profiler.serving_probe` starts it): lone prompts of a few
lengths (`ServingPlan.prompt_loss_lengths`), one at a time, first with the decode worker idle and
then while `batch` requests stream from it, for each of `ServingPlan.prompt_loss_batches`; each
prompt's step is read from the prefill engine's trace and set against the engine table's step,
bucketed by the batch the decode engine was stepping as it began (`planner.validation_steps.
prompt_stretch_by_decode_batch`), and kept as the increase over idle
(`prompt_loss_fit.loss_over_idle`). The same windows hold the other side: the streams' decode
steps beside those prompts and between them (`prompt_loss_fit.served_decode_corun`). The fitting
is pure and lives there; this module only sends requests and reads traces.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from planner.perf_model import PerfModel
from planner.profiler.prompt_loss_fit import loss_over_idle
from planner.profiler.serving_fit import ServingPlan
from planner.profiler.stream_fit import BATCH_PROMPT_TOKENS

if TYPE_CHECKING:
    from planner.validation_steps import CorunRow

PROBE_OUTPUT = 2             # tokens of a probe: its first, and the handoff that frees the prefill side
PROBE_PAUSE_S = 0.3          # between probes: both engines idle again (past vLLM's polling, and the 0.2 s
                             # within which a decode step counts as still running, `prompt_stretch_by_decode_batch`)
STREAM_MARGIN = 2.0          # streams' outputs sized to last this many times the probes' expected time
STREAMS_START_S = 120.0      # at most this long for every stream to be decoding
PROBE_TIMEOUT_S = 120.0      # at most this long for one probe


def stream_output_tokens(model: PerfModel, batch: int, lengths: Sequence[int], repeats: int,
                         max_output_tokens: int) -> int:
    """How many tokens each of `batch` streams decodes so that they outlast the probes'
    expected time (`STREAM_MARGIN` over it), at most `max_output_tokens` (0 for no streams)."""
    if batch == 0:
        return 0
    probes_s = repeats * sum(model.prefill_s(n, n) + PROBE_PAUSE_S + 3 * model.decode_step_s(batch + 1, n)
                             for n in lengths)
    step_s = model.decode_step_s(batch, BATCH_PROMPT_TOKENS + 64)
    return min(max_output_tokens, max(16, int(STREAM_MARGIN * probes_s / step_s) + 16))


async def probes_beside_streams(target: str, batch: int, lengths: Sequence[int], repeats: int, vocab_size: int,
                                output_tokens: int, seed: int) -> tuple[float, float]:
    """Starts `batch` streams of `output_tokens` (none: the decode worker idle), waits until every
    one has its second token (decoding), then sends each of `lengths` `repeats` times, one at a
    time, `PROBE_PAUSE_S` apart; cancels the streams after. Returns the probes' window (monotonic
    seconds, the trace's clock). A stream that fails, before the probes or during them, raises
    its error; streams not all decoding within `STREAMS_START_S` raise TimeoutError: the probes
    would share the prefill engine with their prompts."""
    import numpy as np

    from pdserve.client import AsyncClient

    rng = np.random.default_rng(seed)
    decoding = asyncio.Event()
    streaming = 0

    async def stream(client, ids: list[int]) -> None:
        nonlocal streaming
        received = 0
        async for chunk in client.generate(token_ids=ids, max_tokens=output_tokens, ignore_eos=True, temperature=0.0):
            had, received = received, received + len(chunk.token_ids)
            if had < 2 <= received:
                streaming += 1
                if streaming == batch:
                    decoding.set()

    async with AsyncClient(target) as client:
        tasks = [asyncio.create_task(stream(client, [int(i) for i in rng.integers(10, vocab_size, size=BATCH_PROMPT_TOKENS)]))
                 for _ in range(batch)]
        try:
            if tasks:
                waiter = asyncio.create_task(decoding.wait())
                done, _ = await asyncio.wait([waiter, *tasks], timeout=STREAMS_START_S,
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not decoding.is_set():
                    if failed := next((t.exception() for t in done if t is not waiter and t.exception()), None):
                        raise failed
                    raise TimeoutError(f"{streaming} of {batch} streams decoding after {STREAMS_START_S:g} s")
            start_s = time.monotonic()
            for _ in range(repeats):
                for n in lengths:
                    await asyncio.sleep(PROBE_PAUSE_S)
                    ids = [int(i) for i in rng.integers(10, vocab_size, size=n)]
                    async for _chunk in client.generate(token_ids=ids, max_tokens=PROBE_OUTPUT, ignore_eos=True,
                                                        temperature=0.0, timeout_s=PROBE_TIMEOUT_S):
                        pass
            end_s = time.monotonic()
        finally:
            for task in tasks:
                task.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
        if broken := next((e for e in ended if isinstance(e, Exception)), None):   # not a cancel: it broke
            raise broken
    await asyncio.sleep(1.0)   # the cancelled streams leave the decode worker; its trace flushes idle
    return start_s, end_s


def measure_prompt_loss(target: str, trace_dir: Path, prefill_id: str, decode_id: str, model: PerfModel,
                        plan: ServingPlan, vocab_size: int, advance: Callable[..., None], label: str = "serving"
                        ) -> tuple[dict, tuple[tuple[int, float, float], ...], list[CorunRow]]:
    """The probes beside each of `plan.prompt_loss_batches` streams: the rows by decode batch
    bucket (`prompt_stretch_by_decode_batch` over every probe's window), their increase over
    idle (`loss_over_idle`), and the decode side of the same windows where streams ran: the
    decode engine's steps the probes' prompt steps covered against those they left alone, by
    batch bucket (`corun_by_batch`; `prompt_loss_fit.served_decode_corun` reads the stretch)."""
    from pdserve.engine_step_trace import engine_steps
    from planner.validation_steps import corun_by_batch, prompt_stretch_by_decode_batch

    lengths, repeats, windows = plan.prompt_loss_lengths, plan.prompt_loss_repeats, []
    for index, batch in enumerate(plan.prompt_loss_batches):
        tokens = stream_output_tokens(model, batch, lengths, repeats, plan.max_output_tokens)
        windows.append(asyncio.run(probes_beside_streams(target, batch, lengths, repeats, vocab_size, tokens,
                                                         seed=300 + index)))
        advance(f"{label}: prompts beside {batch} streams")
    prefill, decode = engine_steps(trace_dir, prefill_id), engine_steps(trace_dir, decode_id)
    in_windows = [step for step in prefill if any(start <= step.start_s < end for start, end in windows)]
    by_bucket = prompt_stretch_by_decode_batch(in_windows, decode, float("-inf"), float("inf"),
                                               model.prefill_step_s, min_steps=len(lengths))
    for bucket, row in by_bucket.items():
        advance(f"{label}: prompt steps beside {bucket} streams: {describe(row)}", step=False)
    streamed = [window for window, batch in zip(windows, plan.prompt_loss_batches) if batch > 0]
    inside = lambda steps: [s for s in steps if any(start <= s.start_s < end for start, end in streamed)]  # noqa: E731
    return by_bucket, loss_over_idle(by_bucket), corun_by_batch(inside(decode), inside(prefill))


def describe(row: dict) -> str:
    """One bucket of `prompt_stretch_by_decode_batch`: its steps, median stretch and line."""
    line = (f"; the line {row['lost_ms']:+.1f} ms + {row['slope']:.2f}x the engine's step misses them by "
            f"{row['line_error']:.1%}" if "lost_ms" in row else "; too alike in length for a line")
    return f"{row['steps']} steps, median {row['median_stretch']:.2f}x the engine's" + line
