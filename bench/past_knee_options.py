"""The options bench/overload.py and bench/calibration_warmup.py share: the request set, the SLO
pairs, the time budget and where results go, and the `CompareConfig` made from them."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.comparison.config import CompareConfig


def add_run_options(parser: argparse.ArgumentParser, num_requests: int, label: str) -> None:
    parser.add_argument("--num-requests", type=int, default=num_requests, help="trace requests per run (default %(default)s)")
    parser.add_argument("--ttft-slo-ms", type=float, default=3000.0, help="the TTFT SLO of both pairs (default %(default)s)")
    parser.add_argument("--tpot-tight-ms", type=float, default=35.0, help="the tight pair's TPOT SLO (default %(default)s)")
    parser.add_argument("--tpot-loose-ms", type=float, default=70.0, help="the loose pair's TPOT SLO (default %(default)s)")
    parser.add_argument("--budget-min", type=float, default=40.0, help="the whole run fits in this (default %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results"), help="where results go (default %(default)s)")
    parser.add_argument("--label", default=label, help="the results' file name stem (default %(default)s)")


def run_config(args: argparse.Namespace, **fields) -> CompareConfig:
    """The comparison these options describe, at `args.rates` (comma-separated req/s), with `fields`
    (systems, plans, ...) as given; ValueError on a bad value."""
    return CompareConfig(rates_rps=tuple(float(r) for r in args.rates.split(",")), num_requests=args.num_requests,
                         ttft_slo_s=args.ttft_slo_ms / 1000, tpot_tight_s=args.tpot_tight_ms / 1000,
                         tpot_loose_s=args.tpot_loose_ms / 1000, budget_s=args.budget_min * 60, out_dir=args.out_dir,
                         label=args.label, cdf_rates_rps=(), **fields)
