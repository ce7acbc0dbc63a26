"""A loaded decode worker's steps without a join, by what ran beside them: a Decode call its front end
accepted during the step, a KV pull in flight, the prefill engine stepping through most of it; each
against the profile's model plus the served step's line, from a traced validation.

    .venv/bin/python bench/validate_planner.py ... --step-trace --out-dir RUN   # traces in RUN/**/logs/steps
    .venv/bin/python bench/decode_steps_beside.py --run RUN --profile P.json [--out beside.md]

Per shape (each directory under RUN with a trace in its logs/steps; its decode and prefill workers "decode-1" and
"prefill-0", 1P+1D), one table: rows by decode batch, columns by what ran beside the step ("-": nothing
of the three), each cell the mean of the step over the model's step plus `decode_serving_s` (the line)
and how many steps. Then per shape the decode worker's whole time over that yardstick, steady steps
and join steps apart; what the steady steps that took a Decode call in or ran a pull beside them
took over the others of their batch; and, a pulled request, what the simulator adds for it (the
profile's `decode_request_cpu_s`, charged to its join step) beside what its join step and the
steps around its handoff took over the others. Nothing runs on a cluster.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pdserve.engine_step_trace import TracedJoin, TracedStep, engine_joins, engine_steps  # noqa: E402
from planner.profile import load_profile  # noqa: E402
from planner.validation_step_report import model_and_served  # noqa: E402

BATCHES = ((1, 1, "1"), (2, 7, "2-7"), (8, 31, "8-31"), (32, 1 << 20, "32+"))
MOST = 0.5   # the prefill engine stepping through more than this share of a step counts as beside it


@dataclass(frozen=True)
class Beside:
    """What ran beside one decode step: Decode calls accepted during it, pulls in flight over it, the
    share of it the prefill engine was stepping."""
    calls: int
    pulls: int
    prefill_share: float

    @property
    def label(self) -> str:
        parts = [name for name, on in (("call", self.calls), ("pull", self.pulls),
                                       ("prompt", self.prefill_share > MOST)) if on]
        return "+".join(parts) or "-"


def beside(step: TracedStep, joins: Sequence[TracedJoin], prefill: Sequence[TracedStep]) -> Beside:
    """What of the decode worker's pulled `joins` and the prefill engine's `prefill` steps ran beside
    `step`: calls accepted within (start, end], pulls whose (taken in, reported done) span meets it,
    the prefill steps' overlap over its length. Pure."""
    calls = sum(1 for j in joins if j.pulled and step.start_s < j.accepted_s <= step.end_s)
    pulls = sum(1 for j in joins if j.pulled and j.arrived_s < step.end_s and j.pulled_s > step.start_s)
    length = step.end_s - step.start_s
    overlap = sum(max(0.0, min(p.end_s, step.end_s) - max(p.start_s, step.start_s)) for p in prefill)
    return Beside(calls, pulls, overlap / length if length > 0 else 0.0)


def batch_label(batch: int) -> str:
    return next(label for low, high, label in BATCHES if low <= batch <= high)


def steady_beside(steps: Sequence[TracedStep], joins: Sequence[TracedJoin],
                  prefill: Sequence[TracedStep]) -> list[tuple[TracedStep, Beside]]:
    """Each steady step (it only decodes, no request joining) with what ran beside it. Pure."""
    pulled = [j for j in joins if j.pulled]
    prefill = sorted(prefill, key=lambda p: p.start_s)
    starts = np.array([p.start_s for p in prefill])
    out = []
    for step in steps:
        if step.joined or not step.decoding or step.tokens != step.decoding:
            continue
        near = prefill[max(0, int(np.searchsorted(starts, step.start_s)) - 1):int(np.searchsorted(starts, step.end_s))]
        out.append((step, beside(step, pulled, near)))
    return out


def steady_table(steady: Sequence[tuple[TracedStep, Beside]],
                 yardstick_s: Callable[[TracedStep], float]) -> dict[tuple[str, str], list[float]]:
    """(batch label or "all", beside label) -> each steady step's time over `yardstick_s`, from
    `steady_beside`'s steps. Pure."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for step, what in steady:
        ratio = (step.end_s - step.start_s) / yardstick_s(step)
        cells[(batch_label(step.batch), what.label)].append(ratio)
        cells[("all", what.label)].append(ratio)
    return cells


def handoff_excess_s(steady: Sequence[tuple[TracedStep, Beside]], yardstick_s: Callable[[TracedStep], float]) -> float:
    """Seconds the steady steps (`steady_beside`'s) that took a Decode call in or ran a pull beside
    them took over the steps of their batch (bucket) with neither, the prefill engine beside them or
    not alike: what the handoffs added to the steps around them. Pure."""
    seen = [(batch_label(step.batch), what.prefill_share > MOST, bool(what.calls or what.pulls),
             (step.end_s - step.start_s) / yardstick_s(step), yardstick_s(step)) for step, what in steady]
    quiet = defaultdict(list)
    for batch, prompt, handoff, ratio, _ in seen:
        if not handoff:
            quiet[(batch, prompt)].append(ratio)
    return sum((ratio - float(np.mean(quiet[(batch, prompt)]))) * yardstick
               for batch, prompt, handoff, ratio, yardstick in seen if handoff and quiet[(batch, prompt)])


def time_over(steps: Sequence[TracedStep], yardstick_s: Callable[[TracedStep], float]) -> dict[str, float]:
    """Seconds the decoding steps took over `yardstick_s`, steady and join steps apart, and the
    steady steps' yardstick total. Pure."""
    out = {"steady_over_s": 0.0, "join_over_s": 0.0, "steady_yardstick_s": 0.0}
    for step in steps:
        if not step.decoding:
            continue
        over = (step.end_s - step.start_s) - yardstick_s(step)
        if step.joined:
            out["join_over_s"] += over
        else:
            out["steady_over_s"] += over
            out["steady_yardstick_s"] += yardstick_s(step)
    return out


def table_lines(shape: str, cells: dict[tuple[str, str], list[float]]) -> list[str]:
    labels = sorted({label for _, label in cells}, key=lambda label: (label.count("+"), label))
    lines = [f"\n{shape}: steady decode steps over model + served line (mean, steps)\n",
             "| batch | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for row in [label for *_, label in BATCHES] + ["all"]:
        if any((row, label) in cells for label in labels):
            lines.append(f"| {row} | " + " | ".join(
                f"{np.mean(cells[(row, label)]):.2f} ({len(cells[(row, label)])})" if (row, label) in cells else ""
                for label in labels) + " |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--run", type=Path, required=True, help="a validate_planner --step-trace output directory")
    p.add_argument("--profile", type=Path, required=True, help="the profile the validation ran with")
    p.add_argument("--out", type=Path, help="also write the markdown here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.profile)
    model, served = model_and_served(profile)

    def yardstick(step: TracedStep) -> float:
        return model.decode_step_s(step.batch, step.context_tokens) + served(step.batch)

    lines = [f"# Decode steps by what ran beside them ({args.run}, against {args.profile.name})"]
    totals = ["\n| shape | pulled requests | steady steps over the yardstick | join steps over it "
              "| the handoffs' steps over their batch's others | a request: charged by the simulator / "
              "join steps' and handoffs' excess |", "|---|---|---|---|---|---|"]
    traced = [path.parent for path in args.run.rglob("steps-decode-1-*.csv") if path.parent.name == "steps"]
    for trace_dir in sorted(set(traced)):
        shape_dir = trace_dir.parent.parent
        steps, joins = engine_steps(trace_dir, "decode-1"), engine_joins(trace_dir, "decode-1")
        steady = steady_beside(steps, joins, engine_steps(trace_dir, "prefill-0"))   # each step's neighbours, once
        lines += table_lines(shape_dir.name, steady_table(steady, yardstick))
        over = time_over(steps, yardstick)
        handoffs_s = handoff_excess_s(steady, yardstick)
        pulled = [j for j in joins if j.pulled]
        charged_s = sum(profile.serving.decode_request_cpu_s(j.prompt_tokens) for j in pulled)
        per_request_ms = 1e3 / max(len(pulled), 1)
        totals.append(f"| {shape_dir.name} | {len(pulled)} | {over['steady_over_s']:.1f} s "
                      f"({100 * over['steady_over_s'] / max(over['steady_yardstick_s'], 1e-9):.0f}%) | "
                      f"{over['join_over_s']:.1f} s | {handoffs_s:.1f} s | {charged_s * per_request_ms:.1f} / "
                      f"{(over['join_over_s'] + handoffs_s) * per_request_ms:.1f} ms |")
    if len(totals) == 2:
        raise SystemExit(f"no decode-1 step trace under {args.run} (run validate_planner with --step-trace)")
    text = "\n".join(lines + totals) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
