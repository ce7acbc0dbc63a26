"""The router's placement options (topology, SLOs, policy and cost files), shared by `pdserve router`
and the commands that start a cluster (`pdserve up`, `pdserve demo`), and the `SchedulerConfig`
they make."""

from __future__ import annotations

import argparse


def add_placement_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topology", choices=["disaggregated", "hybrid", "aggregated"], default="disaggregated",
                        help="disaggregated: prefill workers compute prompts, decode workers decode (they compute a "
                             "prompt only when no prefill worker is alive, or under --local-prefill-max-tokens); "
                             "hybrid: the same pools, and the router may have a decode worker compute a prompt when "
                             "that meets the SLOs with more headroom; aggregated: decode workers only, each serving "
                             "both phases (a cluster then starts no prefill worker and gives its decode workers all "
                             "the cores) (default: %(default)s)")
    parser.add_argument("--local-prefill-max-tokens", type=int, default=0,
                        help="the longest prompt (uncached tokens) a decode worker may compute itself; in a "
                             "disaggregated cluster, > 0 allows that for prompts this short (0: no local prefill "
                             "when disaggregated, no cap otherwise)")
    parser.add_argument("--slo-ttft-ms", type=float, default=None,
                        help="time-to-first-token SLO: placement aims under it, admission refuses a request "
                             "predicted to miss it by more than the policy's refuse_slack (default 0), its prediction "
                             "scaled by how far recent requests' were off (default: none, never refuse)")
    parser.add_argument("--slo-tpot-ms", type=float, default=None,
                        help="time-per-output-token SLO: placement aims under it, admission refuses a request whose "
                             "decode worker's step with it joined is predicted past it (default: none)")
    parser.add_argument("--placement-config", default=None,
                        help="JSON or YAML file of the placement policy (scorer weights, refuse_slack, SLO classes, "
                             "the dispatch gate): keys of router.policies.placement.PlacementConfig")
    parser.add_argument("--cost-model", default=None,
                        help="JSON file of the cost model's coefficients (router.policies.placement.CostModel "
                             "fields), e.g. from a profile; the router refines the prefill part online")


def scheduler_config(args: argparse.Namespace):
    """The router's placement, admission and cost settings from its flags and files."""
    import dataclasses

    from router.policies.placement import PlacementConfig
    from router.scheduler import DEFAULT_COST, SchedulerConfig, SloTargets

    placement = PlacementConfig.from_file(args.placement_config) if args.placement_config else PlacementConfig()
    if args.local_prefill_max_tokens:
        placement = dataclasses.replace(placement, local_prefill_max_tokens=args.local_prefill_max_tokens)
    cost = _cost_model(args.cost_model, DEFAULT_COST) if args.cost_model else DEFAULT_COST
    ms = lambda value: None if value is None else value / 1000  # noqa: E731
    return SchedulerConfig(topology=args.topology, placement=placement,
                           slo=SloTargets(ms(args.slo_ttft_ms), ms(args.slo_tpot_ms)), cost_prior=cost)


def _cost_model(path: str, prior):
    """The prior with the coefficients of a JSON object of `CostModel` fields; ValueError naming
    what is wrong (an unknown key, a value that is not a number)."""
    import dataclasses
    import json

    with open(path) as file:
        data = json.load(file)
    known = [f.name for f in dataclasses.fields(prior)]
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a cost model is a JSON object of {', '.join(known)}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; known: {known}")
    bad = [key for key, value in data.items() if isinstance(value, bool) or not isinstance(value, (int, float))]
    if bad:
        raise ValueError(f"{path}: {', '.join(bad)} must be numbers of seconds (or a slowdown factor)")
    return dataclasses.replace(prior, **data)


def router_flags(args: argparse.Namespace) -> list[str]:
    """The placement options given to this command, as `pdserve router` flags (a launcher passes
    them on to the router it starts; file paths made absolute, as a Ray actor runs elsewhere).
    Validates them first (`scheduler_config`), so a mistake stops the launcher, not its router."""
    import os

    scheduler_config(args)
    flags = []
    for name in ("slo_ttft_ms", "slo_tpot_ms", "placement_config", "cost_model"):
        value = getattr(args, name, None)
        if value is not None:
            value = os.path.abspath(value) if name in ("placement_config", "cost_model") else value
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags
