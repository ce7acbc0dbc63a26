"""The router's files for a planned cluster (`pdserve plan --write-router-config DIR`), so the
router places with the planner's numbers:

- `cost.json`: the `CostModel` fields (`pdserve router --cost-model`), from the profile through
  `planner.simulator.cost.cost_model_from`: the cost model the simulated router used;
- `placement.json`: the `PlacementConfig` fields (`--placement-config`): the simulated router's
  policy with the picked topology's local prefill cap;
- `cluster.json` (`write_planned_cluster`): the pick itself, the topology, its SLOs and the goodput
  the planner predicts for it, so a benchmark can run the plan and set the prediction beside what
  it measures (`read_planned_cluster`).
`write_router_config` reads both back with the router's own loaders before it returns, so what
it writes is what the router accepts. `up_flags` names the rest (topology, pool sizes, SLOs).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.metrics import SLO
from planner.simulator.topology import Topology
from router.policies.placement import CostModel, PlacementConfig

COST_FILE, PLACEMENT_FILE, CLUSTER_FILE = "cost.json", "placement.json", "cluster.json"


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




def router_flags(directory: Path, slo: SLO) -> list[str]:
    """The `pdserve router` flags of a planned cluster: its policy and cost files and its SLOs."""
    flags = ["--cost-model", str(directory / COST_FILE), "--placement-config", str(directory / PLACEMENT_FILE)]
    for flag, seconds in (("--slo-ttft-ms", slo.ttft_s), ("--slo-tpot-ms", slo.tpot_s)):
        if seconds is not None:
            flags += [flag, f"{seconds * 1e3:g}"]
    return flags


def up_flags(topology: Topology, directory: Path, slo: SLO, kv_cache_mb_per_device: int = 0) -> list[str]:
    """`pdserve up` flags that run `topology` with the written files and the SLOs (the engines'
    token budget among them when the topology sets one). Workers that span devices get the
    topology's cores, which `pdserve up` splits evenly among them, and (given
    `kv_cache_mb_per_device`) the KV cache of all their devices, as the simulator gave them."""
    prefill = topology.num_prefill
    decode = topology.num_decode + topology.num_colocated
    budget = ["--max-num-batched-tokens", str(topology.token_budget)] if topology.token_budget else []
    wide = []
    if topology.devices_per_instance > 1:
        wide = ["--decode-cores", f"0-{topology.devices - 1}"]
        if kv_cache_mb_per_device:
            wide += ["--kv-cache-mb", str(kv_cache_mb_per_device * topology.devices_per_instance)]
    return ["--topology", topology.kind, "--prefill", str(prefill), "--decode", str(decode), *budget, *wide,
            *router_flags(directory, slo)]


@dataclass(frozen=True)
class PlannedCluster:
    """What `pdserve plan` picked, as `cluster.json` records it. `directory`: where its router files are."""

    topology: Topology
    slo: SLO
    predicted_goodput_rps: float
    predicted_attainment: float
    objective: str
    workload: str
    directory: Path

    def router_flags(self) -> list[str]:
        return router_flags(self.directory, self.slo)


def write_planned_cluster(directory: Path, topology: Topology, slo: SLO, predicted_goodput_rps: float,
                          predicted_attainment: float, objective: str, workload: str,
                          calibrated_admission: bool = True) -> Path:
    """Writes `cluster.json` beside the router files; returns its path. `calibrated_admission`: how
    the simulated router that predicted the goodput judged admission (`RouterSettings.calibrated`)."""
    fields = ("kind", "num_prefill", "num_decode", "num_colocated", "local_prefill_max_tokens", "token_budget",
              "devices_per_instance")
    content = {"topology": {name: getattr(topology, name) for name in fields}, "slo_ms": slo.as_ms(),
               "predicted_goodput_rps": predicted_goodput_rps, "predicted_attainment": predicted_attainment,
               "objective": objective, "workload": workload, "calibrated_admission": calibrated_admission}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CLUSTER_FILE
    path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
    return path


def read_planned_cluster(directory: Path) -> PlannedCluster:
    """The plan `write_planned_cluster` wrote into `directory`. Raises ValueError naming the file
    when it is missing or not one (the router files beside it are read by the router itself)."""
    path = Path(directory) / CLUSTER_FILE
    try:
        data = json.loads(path.read_text())
        slo_ms = data["slo_ms"]
        return PlannedCluster(Topology(**data["topology"]),
                              SLO(ttft_s=_seconds(slo_ms.get("ttft")), tpot_s=_seconds(slo_ms.get("tpot"))),
                              float(data["predicted_goodput_rps"]), float(data["predicted_attainment"]),
                              str(data["objective"]), str(data["workload"]), Path(directory))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a plan written by `pdserve plan --write-router-config` ({error})") from error


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else float(ms) / 1e3
