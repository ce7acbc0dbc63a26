"""What a prompt step loses beside decode streams, from the prefill engine's traced steps (the pure
half of `planner.profiler.prompt_loss_probe`).

On a loaded 1P+1D cluster the prefill worker's prompt steps run longer the more sequences the
decode worker streams (BENCHMARKS, "On a Zen 3 EPYC again": 1.4x the engine table with the decode
side idle, 2.4x beside 4-7 streams, 3x beside 16+; the tokens the streams carry wake the router
bound to the prefill core, and with it the client, once a decode step). Short prompts stretch more
than long ones: the loss is a fixed part a step plus a share of its length, not a ratio alone
(an AVX-512 EPYC's lone prompts beside 8 streams, 256 to 2,000 tokens: 1.22x to 1.13x). So each
decode batch's prompt steps are fitted as

    measured = lost_s + slope x model      (`planner.validation_steps.step_loss_fit`)

and kept as the increase over the same fit with the decode worker idle (`loss_over_idle`), beside the
idle fit itself (`idle_loss`). The simulator charges a prompt step of t beside b streams at least
t x stretch + lost_s, the row of the largest batch not above b (`SimSettings.prompt_loss_at`), each
row the idle one plus its increase, and the idle row itself with nothing streaming: the step takes
the engine for that long, where a prompt queued behind it waits. (Charged over idle alone, as
before, the idle excess sat in the lone requests' latency, `ServingCosts.first_token_s`: a constant
beside every prompt's TTFT, never in the prefill engine's busy time, so long prompts and prompts
queued behind others paid too little: BENCHMARKS, "Prompt steps charged as measured".)
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.profiler.stream_fit import StreamCpu
    from planner.validation_steps import CorunRow

MIN_STRETCH = 1.0   # a batch's slope below the idle one is noise: streams do not speed a prompt


def bucket_low(label: str) -> int:
    """The smallest decode batch of a `planner.validation_steps.BATCH_BUCKETS` label ("8-15" -> 8,
    "64+" -> 64, "1" -> 1, "0" -> 0)."""
    return int(label.split("-")[0].rstrip("+"))


def loss_over_idle(by_bucket: Mapping[str, Mapping]) -> tuple[tuple[int, float, float], ...]:
    """`prompt_stretch_by_decode_batch`'s rows as (batch, stretch, lost_s) over the idle row "0",
    by rising batch: stretch = 1 + slope - idle slope (at least `MIN_STRETCH`), lost_s = lost -
    idle lost (at least 0). Where either row has no line (its lengths spanned too little), the
    difference of their median stretches the same way (1 + median - idle median) and no fixed
    part: the simulator charges the engine's step t, and the idle excess is in the lone
    latencies already, so what a batch adds is (its stretch - idle's) x t, not a ratio of them.
    () without an idle row: nothing to read an increase against."""
    idle = by_bucket.get("0")
    if idle is None:
        return ()
    rows = []
    for label, row in sorted(by_bucket.items(), key=lambda item: bucket_low(item[0])):
        if label == "0":
            continue
        if "lost_ms" in row and "lost_ms" in idle:
            stretch = 1.0 + row["slope"] - idle["slope"]
            lost_s = (row["lost_ms"] - idle["lost_ms"]) / 1e3
        else:
            stretch, lost_s = 1.0 + row["median_stretch"] - idle["median_stretch"], 0.0
        rows.append((bucket_low(label), round(max(MIN_STRETCH, stretch), 4), round(max(0.0, lost_s), 6)))
    return tuple(rows)


def idle_loss(by_bucket: Mapping[str, Mapping]) -> tuple[float, float] | None:
    """The idle row "0" of `prompt_stretch_by_decode_batch` as (stretch, lost_s) over the model's
    step: the line's slope and fixed part (slope at least `MIN_STRETCH`, lost at least 0), or with no
    line its median stretch and no fixed part; None without the row. What a lone prompt's step takes
    on the served prefill worker with nothing beside it, which `loss_over_idle`'s rows are over."""
    idle = by_bucket.get("0")
    if idle is None:
        return None
    if "lost_ms" in idle:
        return round(max(MIN_STRETCH, idle["slope"]), 4), round(max(0.0, idle["lost_ms"] / 1e3), 6)
    return round(max(MIN_STRETCH, idle["median_stretch"]), 4), 0.0


def served_decode_corun(rows: Sequence[CorunRow], stream: StreamCpu, host_cores: float,
                        client_placement: str) -> tuple[float | None, list[str]]:
    """The decode side of the same probes: how much longer a decode step runs while the prefill
    engine computes a prompt beside it than with that engine idle, as the cluster shows it (the
    router bound to the prefill core, the client placed as Linux wakes it), net of what the
    simulator's host model already charges for it, so that the two are not counted twice.

    Each row (`planner.validation_steps.corun_by_batch` over the probes' windows: the decode
    engine's steps that prompt steps covered throughout, against those they left alone) gives
    (beside / alone) / (the host model's stretch beside a prompt / its stretch alone) at the
    row's smallest batch and the token rate its alone steps imply (`StreamCpu.decode_stretch`);
    the stretch is their median, None without a row. Also one line per row saying so."""
    from planner.profiler.corun_fit import chargeable_stretch

    ratios, lines = [], []
    for row in rows:
        batch = max(1, bucket_low(row.batch))
        tokens_per_s = batch / row.alone_s
        host = (stream.decode_stretch(tokens_per_s, batch, host_cores, client_placement=client_placement,
                                      beside_prompt=True)
                / stream.decode_stretch(tokens_per_s, batch, host_cores, client_placement=client_placement))
        ratios.append(row.ratio / host)
        lines.append(f"{row.batch} streams: {row.beside_s * 1e3:.2f} ms a step beside a prompt ({row.beside_steps} steps) "
                     f"against {row.alone_s * 1e3:.2f} ms with the prefill engine idle ({row.alone_steps}), "
                     f"{row.ratio:.3f}x, of which the host model charges {host:.3f}x")
    if not ratios:
        return None, lines
    return chargeable_stretch(statistics.median(ratios)), lines
