"""The router's files for a planned cluster (`pdserve plan --write-router-config DIR`), so the
router places with the planner's numbers:

- `cost.json`: the `CostModel` fields (`pdserve router --cost-model`), from the profile through
  `planner.simulator.cost.cost_model_from`: the cost model the simulated router used;
- `placement.json`: the `PlacementConfig` fields (`--placement-config`): the simulated router's
  policy with the picked topology's local prefill cap.
`write_router_config` reads both back with the router's own loaders before it returns, so what
it writes is what the router accepts. `up_flags` names the rest (topology, pool sizes, SLOs).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadgen.metrics import SLO
from planner.simulator.config import Topology
from router.policies.placement import CostModel, PlacementConfig

COST_FILE, PLACEMENT_FILE = "cost.json", "placement.json"


def router_files(placement: PlacementConfig, cost: CostModel) -> dict[str, dict[str, Any]]:
    """File name -> JSON content. Pure."""
    policy = {field.name: getattr(placement, field.name) for field in dataclasses.fields(placement)}
    policy = {name: dict(value) if isinstance(value, Mapping) else value for name, value in policy.items()}
    return {COST_FILE: dataclasses.asdict(cost), PLACEMENT_FILE: policy}


def write_router_config(directory: Path, placement: PlacementConfig, cost: CostModel) -> list[Path]:
    """Writes the two files into `directory` (made if missing); returns their paths. Raises
    ValueError if the router would read back anything other than `placement` and `cost`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, content in router_files(placement, cost).items():
        path = directory / name
        path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
        paths.append(path)
    if PlacementConfig.from_file(directory / PLACEMENT_FILE) != placement or \
            CostModel(**json.loads((directory / COST_FILE).read_text())) != cost:
        raise ValueError(f"the router files in {directory} do not read back as written")
    return paths


def up_flags(topology: Topology, directory: Path, slo: SLO) -> list[str]:
    """`pdserve up` / `pdserve router` flags that run `topology` with the written files and the SLOs."""
    prefill = topology.num_prefill
    decode = topology.num_decode + topology.num_colocated
    flags = ["--topology", topology.kind, "--prefill", str(prefill), "--decode", str(decode),
             "--cost-model", str(directory / COST_FILE), "--placement-config", str(directory / PLACEMENT_FILE)]
    for flag, seconds in (("--slo-ttft-ms", slo.ttft_s), ("--slo-tpot-ms", slo.tpot_s)):
        if seconds is not None:
            flags += [flag, f"{seconds * 1e3:g}"]
    return flags
