"""The steps a cluster's engines ran against those its simulation ran, by batch, over every kept
validation that traced its workers: the prompt steps by the decode batch streaming beside them, and
the decode steps (no join) by their own batch.

    .venv/bin/python bench/resimulate_kept.py --variant current= --out OUT      # the resimulations (minutes)
    .venv/bin/python bench/steps_by_batch.py --resimulated current=OUT/runs/current \\
        [--resimulated NAME=DIR ...] [--out steps.md] [--plot steps.png]

Each resimulated validation.json's 1P+1D rates carry, per batch bucket, the measured prompt steps'
median stretch over the model's step (the prefill engine's trace,
`planner.validation_steps.prompt_stretch_by_decode_batch`) beside the simulated steps' read the same
way (`SimResult.prefill_steps`, `planner.validation.prompt_steps_compared`), and the decode steps'
time over the profile's model plus its served line, measured and simulated
(`planner.validation.decode_steps_compared`). Prints, per resimulation and side, the mean measured
and simulated stretch and the simulated one's mean error (signed and absolute, over the measured) by
shape and bucket and by host kind; writes the same markdown to --out and a plot of every pair to
--plot. Nothing runs on a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from resimulate_kept import KEPT  # noqa: E402  (beside this file)
from planner.profiler.prompt_loss_fit import bucket_low  # noqa: E402


SIDES = {"prompt": "prompt_stretch", "decode": "decode_stretch"}   # side -> its key in a validation.json run


@dataclass(frozen=True)
class StepPair:
    """One batch bucket of one rate of one kept validation, one side: the prompt steps' median
    stretch over the model's step, or the decode steps' time over the model and the served line,
    measured and simulated."""
    kept: str
    side: str
    shape: str
    rate_rps: float
    bucket: str
    measured: float
    simulated: float

    @property
    def kind(self) -> str:
        """The host kind, as the kept validations are named (`zen4-s69` -> `zen4`)."""
        return self.kept.split("-")[0]

    @property
    def error(self) -> float:
        return (self.simulated - self.measured) / self.measured


def step_pairs(name: str, validation: dict) -> list[StepPair]:
    """The pairs of one resimulated validation.json: each run's buckets, on each side (`SIDES`),
    where both the measured and the simulated read a stretch. Pure."""
    shape = validation.get("workload", {}).get("shape", "?")
    return [StepPair(name, side, shape, run["rate_rps"], bucket, pair["measured"], pair["simulated"])
            for side, key in SIDES.items()
            for run in validation.get("runs", [])
            for bucket, pair in (run.get(key) or {}).items()
            if pair.get("measured") and pair.get("simulated")]


SIDE_TITLES = {"prompt": "prompt steps' median stretch over the model's step, by the decode batch beside them",
               "decode": "decode steps (no join) over the model plus the served line, by their batch"}


def summary_lines(title: str, pairs: Sequence[StepPair]) -> list[str]:
    """Markdown for one side's pairs: by shape and bucket, then by host kind, the pairs' count, mean
    measured and simulated stretch and the simulated one's mean error, signed and absolute. Pure."""
    def row(label: str, chosen: Sequence[StepPair]) -> str:
        errors = np.array([p.error for p in chosen])
        return (f"| {label} | {len(chosen)} | {np.mean([p.measured for p in chosen]):.2f} | "
                f"{np.mean([p.simulated for p in chosen]):.2f} | {100 * errors.mean():+.0f}% | {100 * np.abs(errors).mean():.0f}% |")

    head = ["| rows | n | measured | simulated | error | \\|error\\| |", "|---|---|---|---|---|---|"]
    lines = [f"\n## {title}\n", *head, row("all", pairs)]
    for shape in sorted({p.shape for p in pairs}):
        for bucket in sorted({p.bucket for p in pairs if p.shape == shape}, key=bucket_low):
            lines.append(row(f"{shape}, batch {bucket}", [p for p in pairs if p.shape == shape and p.bucket == bucket]))
    lines += ["", *head]
    lines += [row(kind, [p for p in pairs if p.kind == kind]) for kind in sorted({p.kind for p in pairs})]
    return lines


def plot(pairs_by_name: dict[str, list[StepPair]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(pairs_by_name), figsize=(5.5 * len(pairs_by_name), 5), squeeze=False)
    for ax, (name, pairs) in zip(axes[0], pairs_by_name.items()):   # name: "<resimulation>, <side>"
        for shape in sorted({p.shape for p in pairs}):
            chosen = [p for p in pairs if p.shape == shape]
            ax.scatter([p.measured for p in chosen], [p.simulated for p in chosen], s=14, label=shape, alpha=0.7)
        top = max([p.measured for p in pairs] + [p.simulated for p in pairs] + [1.0]) * 1.05
        ax.plot([1, top], [1, top], color="black", linewidth=0.8)
        ax.set(title=name, xlabel="measured stretch (per rate and batch bucket)",
               ylabel="simulated stretch", xlim=(0.8, top), ylim=(0.8, top))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--resimulated", action="append", required=True, metavar="NAME=DIR",
                   help="a resimulate_kept variant's runs directory (OUT/runs/<variant>)")
    p.add_argument("--out", type=Path, help="also write the markdown here")
    p.add_argument("--plot", type=Path, help="and the measured-against-simulated plot here (PNG)")
    return p.parse_args(argv)


def kept_pairs(directory: Path, names: Iterable[str]) -> list[StepPair]:
    """Every pair of the kept validations `names` resimulated under `directory`."""
    pairs = []
    for name in names:
        for path in sorted((directory / name).glob("1P+1D/*/validation.json")):
            pairs += step_pairs(name, json.loads(path.read_text()))
    return pairs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines, by_name = ["# The engines' steps by batch: the cluster's against the simulation's"], {}
    for item in args.resimulated:
        name, _, directory = item.partition("=")
        pairs = kept_pairs(Path(directory), [kept.name for kept in KEPT])
        if not pairs:
            raise SystemExit(f"{directory}: no resimulated kept validation with traced steps")
        for side in SIDES:
            chosen = [p for p in pairs if p.side == side]
            if chosen:
                by_name[f"{name}, {side}"] = chosen
                lines += summary_lines(f"{name}: {SIDE_TITLES[side]}", chosen)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    if args.plot:
        plot(by_name, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
