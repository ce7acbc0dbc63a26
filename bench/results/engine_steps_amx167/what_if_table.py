"""The router-core cap what-if over kept validations: each DIR/<root>/<variant>/summary.json (as
`bench/validate_planner.py --resimulate ... --out-dir DIR/<root>/<variant>` writes it) side by side.

    python3 what_if_table.py DIR 0.9,0.5 amx167 epyc zen4 ...
Prints a markdown table (mean |error| to the knee of TTFT p50/p90, TPOT p50/p90, and the goodput
error) and the mean of every percentile error and of every bracketed |goodput error| per variant."""
import json
import sys
from pathlib import Path

KEYS = ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms")
root_dir, variants, roots = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]
errors = {v: [] for v in variants}
goodput = {v: [] for v in variants}
print("| validation | topology | shape | " + " | ".join(f"{v}: TTFT p50/p90, TPOT p50/p90, goodput" for v in variants) + " |")
print("|---|---|---|" + "---|" * len(variants))
for root in roots:
    rows = {}
    for variant in variants:
        for v in json.loads((root_dir / root / variant / "summary.json").read_text()):
            rows.setdefault((v["topology"], v["shape"]), {})[variant] = v
    for (topology, shape), by_variant in sorted(rows.items()):
        cells = []
        for variant in variants:
            v = by_variant[variant]
            e, g = v["mean_abs_error_to_knee"], v["goodput_error"]
            errors[variant] += [e[k] for k in KEYS]
            if g is not None:
                goodput[variant].append(abs(g))
            cells.append(" / ".join(f"{100 * e[k]:.0f}%" for k in KEYS) + (", not on the grid" if g is None else f", {100 * g:+.0f}%"))
        print(f"| {root} | {topology} | {shape} | " + " | ".join(cells) + " |")
for variant in variants:
    print(f"\n{variant}: mean percentile error {100 * sum(errors[variant]) / len(errors[variant]):.1f}% over "
          f"{len(errors[variant])}; mean |goodput error| {100 * sum(goodput[variant]) / len(goodput[variant]):.1f}% over "
          f"{len(goodput[variant])} bracketed")
