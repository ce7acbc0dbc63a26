"""Tables, JSON and plots of a goodput search (what `pdserve plan` prints and writes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from planner.search import FewestDevices, RateSearch, SplitSearch
from planner.simulator.topology import Topology


KIND_COLORS = {"disaggregated": "tab:blue", "hybrid": "tab:green", "aggregated": "tab:orange"}


def marks(result: SplitSearch) -> dict[int, str]:
    """id(RateSearch) -> its mark: "picked" for the pick, "best <kind>" for each kind's best."""
    out = {id(best): f"best {kind}" for kind, best in result.best_by_kind().items() if best is not None}
    if result.best is not None:
        out[id(result.best)] = f"picked (best {result.best.topology.kind})"
    return out


def search_table(result: SplitSearch, target: float, speed_margin: float = 0.0) -> Table:
    """One row per topology; with a `speed_margin` (the robust pick) its goodput on a machine that
    much slower too, which the pick ranks by."""
    title = (f"goodput per topology (highest rate with >= {target:.0%} of requests meeting the SLOs); "
             "D: decode workers, H: hybrid decode workers (/N: local prefill cap), C: aggregated")
    if speed_margin > 0:
        title += f"; picked by the rate {speed_margin:.0%} slower"
    table = Table(title=title)
    robust = [(f"{speed_margin:.0%} slower req/s", "right")] if speed_margin > 0 else []
    for name, justify in (("topology", "left"), ("kind", "left"), ("devices", "right"), ("rate req/s", "right"),
                          *robust, ("req/s/device", "right"), ("attainment", "right"), ("", "left")):
        table.add_column(name, justify=justify, no_wrap=True)
    marked = marks(result)
    for r in result.results:
        slower = [f"{r.robust_rate_rps:.3f}" if r.robust_rate_rps is not None else "-"] if speed_margin > 0 else []
        table.add_row(r.topology.label, r.topology.kind, str(r.topology.devices), f"{r.max_rate_rps:.3f}", *slower,
                      f"{r.goodput_per_device:.3f}", f"{r.attainment:.1%}", marked.get(id(r), ""),
                      style="bold green" if id(r) in marked else None)
    return table


def detail_table(title: str, rows: dict[str, dict[str, Any]]) -> Table:
    """Simulated latency at a chosen operating point; rows: label -> loadgen summary dict."""
    table = Table(title=title + " (ms)")
    columns = ("slo_attainment", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
               "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "local_prefill_share", "prefill_load")
    headers = ("attain", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99", "ITL p99", "local prefill",
               "prefill load")
    shares = ("slo_attainment", "local_prefill_share", "prefill_load")
    table.add_column("topology@req/s", no_wrap=True)
    for header in headers:
        table.add_column(header, justify="right")
    for label, summary in rows.items():
        cells = [("-" if c not in summary else f"{summary[c]:.1%}") if c in shares else f"{summary[c]:.4g}"
                 for c in columns]
        table.add_row(label, *cells)
    return table


def fewest_table(answer: FewestDevices, target: float) -> Table:
    """One row per kind searched (its fewest devices), the fewest of all marked."""
    table = Table(title=f"fewest devices meeting the SLOs for >= {target:.0%} of requests at "
                        f"{answer.rate_rps:g} req/s")
    for name in ("kind", "topology", "devices", "attainment", ""):
        table.add_column(name)
    best = answer.best
    for kind, found in answer.by_kind:
        if found is None:
            table.add_row(kind, "none within the device cap", "-", "-", "")
        else:
            topology, value = found
            table.add_row(kind, topology.label, str(topology.devices), f"{value:.1%}",
                          "<- fewest" if found == best else "")
    return table


def search_json(result: SplitSearch) -> dict[str, Any]:
    def one(r: RateSearch) -> dict[str, Any]:
        return {"topology": r.topology.label, "kind": r.topology.kind, "num_prefill": r.topology.num_prefill,
                "num_decode": r.topology.num_decode, "num_colocated": r.topology.num_colocated,
                "local_prefill_max_tokens": r.topology.local_prefill_max_tokens,
                "token_budget": r.topology.token_budget, "devices": r.topology.devices, "max_rate_rps": r.max_rate_rps,
                "goodput_per_device": r.goodput_per_device, "attainment": r.attainment,
                "robust_rate_rps": r.robust_rate_rps,
                "samples": [{"rate_rps": rate, "attainment": value} for rate, value in r.samples]}

    label = lambda r: r.topology.label if r is not None else None  # noqa: E731
    return {"results": [one(r) for r in result.results], "best": label(result.best),
            "best_by_kind": {kind: label(best) for kind, best in result.best_by_kind().items()},
            "best_colocated": label(result.best_colocated)}


def plot_search(result: SplitSearch, target: float, path: Path, title: str) -> Path:
    """Left: goodput per device of every topology. Right: attainment vs rate of each kind's best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(max(13.0, 0.3 * len(result.results) + 6), 4.8))
    everything = result.results
    best = {id(r) for r in result.best_by_kind().values() if r is not None}
    positions = range(len(everything))
    drawn = bars.bar(positions, [r.goodput_per_device for r in everything],
                     color=[KIND_COLORS[r.topology.kind] for r in everything])
    for bar, r in zip(drawn, everything):
        if id(r) in best:
            bar.set_edgecolor("black")
            bar.set_linewidth(3 if r is result.best else 1.5)
    bars.set_xticks(list(positions), [r.topology.label for r in everything], rotation=60, ha="right")
    bars.set_ylabel("goodput per device (req/s)")
    bars.set_title("blue: disaggregated, green: hybrid, orange: aggregated (each kind's best outlined)")
    for kind, r in result.best_by_kind().items():
        if r is None:
            continue
        samples = sorted(r.samples)
        curves.plot([s[0] for s in samples], [s[1] for s in samples], "o-", color=KIND_COLORS[kind],
                    label=f"{r.topology.label}: {r.max_rate_rps:.2f} req/s" + (" (picked)" if r is result.best else ""))
    curves.axhline(target, color="gray", linestyle="--", label=f"target {target:.0%}")
    curves.set_xlabel("offered rate (req/s)")
    curves.set_ylabel("share of requests meeting TTFT and TPOT SLOs")
    curves.set_title("attainment vs rate (search samples)")
    curves.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_fewest(checked: list[tuple[str, float]], answer: FewestDevices, target: float, path: Path) -> Path:
    """Attainment at the asked rate of every topology the reverse search simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(checked) + 2), 4.5))
    colors = [KIND_COLORS[Topology.from_label(label).kind] for label, _ in checked]
    ax.bar(range(len(checked)), [value for _, value in checked], color=colors)
    ax.set_xticks(list(range(len(checked))), [label for label, _ in checked], rotation=45, ha="right")
    ax.axhline(target, color="gray", linestyle="--")
    ax.set_ylabel("share meeting the SLOs")
    ax.set_title(f"attainment at {answer.rate_rps:g} req/s of each topology tried (in search order)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
