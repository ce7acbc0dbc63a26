"""The measurement as a markdown table, JSON records and a bar chart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from kv_transfer.throughput.summary import Row, speedup

REFERENCES = ("raw socket", "raw gloo", "memcpy")  # the table's "vs" columns


def markdown_table(rows: Sequence[Row]) -> str:
    """A line per row; "vs X" is X's median over the row's (above 1: faster than X), "-" when X
    was not measured."""
    lines = ["| prompt | bytes | method | median ms | p25-p75 ms | GB/s | "
             + " | ".join(f"vs {name}" for name in REFERENCES) + " |",
             "|---:|---:|---|---:|---:|---:|" + "---:|" * len(REFERENCES)]
    for row in rows:
        ratios = [speedup(rows, row, name) for name in REFERENCES]
        lines.append(f"| {row.prompt_tokens} | {row.num_bytes / 2**20:.0f} MiB | {row.method} | "
                     f"{row.median_s * 1000:.2f} | {row.p25_s * 1000:.2f}-{row.p75_s * 1000:.2f} | "
                     f"{row.gb_per_s:.2f} | " + " | ".join("-" if r is None else f"{r:.2f}" for r in ratios) + " |")
    return "\n".join(lines)


def cost_table(rows: Sequence[Row], pairs: Sequence[tuple[str, str]]) -> str:
    """A line per `(method, reference)` pair measured: the ratio of their medians per prompt length
    (above 1: `method` is slower; 1.02 is a 2% cost), "-" where either was not measured."""
    sizes = sorted({r.prompt_tokens for r in rows})
    lines = ["| method | reference | " + " | ".join(f"{s}-token median ratio" for s in sizes) + " |",
             "|---|---|" + "---:|" * len(sizes)]
    for method, reference in pairs:
        ratios = [speedup(rows, row, method) for s in sizes for row in rows
                  if row.prompt_tokens == s and row.method == reference]
        if ratios:
            lines.append(f"| {method} | {reference} | "
                         + " | ".join("-" if r is None else f"{r:.3f}" for r in ratios) + " |")
    return "\n".join(lines)


def rows_json(rows: Sequence[Row]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=1)


def plot(rows: Sequence[Row], path: Path, title: str) -> None:
    """Grouped bars of median GB/s: a group per prompt length, a bar per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.prompt_tokens for r in rows})
    methods = list(dict.fromkeys(r.method for r in rows))
    by = {(r.prompt_tokens, r.method): r for r in rows}
    figure, axes = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        xs = [j + i * width for j in range(len(sizes))]
        axes.bar(xs, [by[(s, method)].gb_per_s for s in sizes], width, label=method)
    axes.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))])
    axes.set_xticklabels([f"{s}-token prompt\n({by[(s, methods[0])].num_bytes / 2**20:.0f} MiB)" for s in sizes])
    axes.set_ylabel("GB/s (median)")
    axes.set_title(title)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # off the bars
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
