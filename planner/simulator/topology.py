"""A cluster's shape as the simulator and the planner name it: how many instances of which kind,
their step token budget and how many devices one spans, and its label ("1P+1D", "2C@512", "1Cx2",
"1P+1H/256")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pdserve.roles import TOPOLOGIES
from pdserve.roles import Topology as TopologyKind
from planner.simulator.config import SimulationError

_LABEL = re.compile(r"(?:(?P<colocated>\d+)C(?:x(?P<width>\d+))?"
                    r"|(?P<prefill>\d+)P\+(?P<decode>\d+)(?P<kind>[DH])(?:/(?P<cap>\d+))?)"
                    r"(?:@(?P<budget>\d+))?")


@dataclass(frozen=True)
class Topology:
    """A cluster as `pdserve.roles.Topology` names it, one instance per device unless it says
    otherwise (goodput per device divides by `devices`):
    - disaggregated: N >= 1 prefill + M >= 1 decode instances (`num_prefill`, `num_decode`);
    - hybrid: the same pools, and the router may have a decode instance compute a prompt itself
      (the Local path) for prompts of at most `local_prefill_max_tokens` tokens (0: any length);
    - aggregated: K >= 1 colocated instances (`num_colocated`), each serving both phases.
    `local_prefill_max_tokens` is the router's `PlacementConfig` cap: only a hybrid cluster has one
    (disaggregated keeps prompts off decode workers; an aggregated one has nowhere else to put them).
    `token_budget`: every engine's step token budget (vLLM's max_num_batched_tokens, the chunk of
    chunked prefill), 0 for the engine's own (the profile's). Where one engine runs both phases
    (aggregated, hybrid) it bounds what a prompt's chunk adds to a decode step: TPOT against TTFT.
    `devices_per_instance`: how many devices one engine spans (on a CPU host, cores one worker is
    bound to), 1 but for an aggregated topology: "1Cx2" is one aggregated worker over two devices,
    what vLLM's own server is on a two-core host. Its steps are the profile's wide engine's
    (`PerfModel.on_devices`) and it holds the KV memory of all its devices."""

    num_prefill: int = 0
    num_decode: int = 0
    num_colocated: int = 0
    kind: TopologyKind = "disaggregated"
    local_prefill_max_tokens: int = 0
    token_budget: int = 0
    devices_per_instance: int = 1

    def __post_init__(self) -> None:
        counts = (self.num_prefill, self.num_decode, self.num_colocated, self.local_prefill_max_tokens,
                  self.token_budget)
        if not isinstance(self.devices_per_instance, int) or self.devices_per_instance < 1:
            raise SimulationError(f"devices_per_instance must be an int >= 1, got {self.devices_per_instance!r}")
        if self.devices_per_instance > 1 and self.kind != "aggregated":
            raise SimulationError(f"only aggregated workers may span devices; a {self.kind} topology has one "
                                  f"device per instance, got devices_per_instance={self.devices_per_instance}")
        if any(not isinstance(c, int) or c < 0 for c in counts):
            raise SimulationError(f"instance counts, the local prefill cap and the token budget must be ints >= 0, "
                                  f"got {counts}")
        if self.kind not in TOPOLOGIES:
            raise SimulationError(f"kind must be one of {TOPOLOGIES}, got {self.kind!r}")
        if self.kind == "aggregated":
            valid = self.num_colocated >= 1 and self.num_prefill == 0 and self.num_decode == 0
        else:
            valid = self.num_prefill >= 1 and self.num_decode >= 1 and self.num_colocated == 0
        if not valid:
            shape = "K>=1 colocated instances" if self.kind == "aggregated" else "N>=1 prefill + M>=1 decode instances"
            raise SimulationError(f"a topology of kind {self.kind} is {shape}; got prefill={self.num_prefill} "
                                  f"decode={self.num_decode} colocated={self.num_colocated}")
        if self.local_prefill_max_tokens and self.kind != "hybrid":
            raise SimulationError(f"only a hybrid topology caps local prefills; kind {self.kind} needs "
                                  f"local_prefill_max_tokens=0, got {self.local_prefill_max_tokens}")

    @classmethod
    def disaggregated(cls, num_prefill: int, num_decode: int, token_budget: int = 0) -> Topology:
        return cls(num_prefill=num_prefill, num_decode=num_decode, token_budget=token_budget)

    @classmethod
    def hybrid(cls, num_prefill: int, num_decode: int, local_prefill_max_tokens: int = 0,
               token_budget: int = 0) -> Topology:
        return cls(num_prefill=num_prefill, num_decode=num_decode, kind="hybrid",
                   local_prefill_max_tokens=local_prefill_max_tokens, token_budget=token_budget)

    @classmethod
    def aggregated(cls, num_instances: int, token_budget: int = 0, devices_per_instance: int = 1) -> Topology:
        return cls(num_colocated=num_instances, kind="aggregated", token_budget=token_budget,
                   devices_per_instance=devices_per_instance)

    colocated = aggregated  # the planner's older name: K colocated instances

    @classmethod
    def from_label(cls, label: str) -> Topology:
        """The topology `label` names ("2C", "2C@512", "1Cx2", "1P+1D", "1P+1H", "1P+1H/512",
        "1P+1H/256@512"); SimulationError otherwise."""
        match = _LABEL.fullmatch(label.strip())
        if match is None:
            raise SimulationError(f"not a topology label: {label!r}; say KC (K aggregated workers; KCxW: each "
                                  "over W devices), NP+MD "
                                  "(disaggregated) or NP+MH[/CAP] (hybrid, local prefills up to CAP tokens), "
                                  "each optionally @BUDGET (the engines' step token budget)")
        budget = int(match["budget"] or 0)
        if match["colocated"]:
            return cls.aggregated(int(match["colocated"]), budget, int(match["width"] or 1))
        prefill, decode = int(match["prefill"]), int(match["decode"])
        if match["kind"] == "D":
            if match["cap"]:
                raise SimulationError(f"{label!r}: only a hybrid topology (NP+MH) has a local prefill cap")
            return cls.disaggregated(prefill, decode, budget)
        return cls.hybrid(prefill, decode, int(match["cap"] or 0), budget)

    @property
    def is_colocated(self) -> bool:
        return self.kind == "aggregated"

    @property
    def devices(self) -> int:
        return (self.num_prefill + self.num_decode + self.num_colocated) * self.devices_per_instance

    @property
    def label(self) -> str:
        """"KC" aggregated ("KCxW" when each spans W devices), "NP+MD" disaggregated, "NP+MH" hybrid
        ("NP+MH/cap" with a local prefill cap), each with "@budget" when the engines' token budget
        is not their own."""
        budget = f"@{self.token_budget}" if self.token_budget else ""
        if self.kind == "aggregated":
            width = f"x{self.devices_per_instance}" if self.devices_per_instance > 1 else ""
            return f"{self.num_colocated}C{width}{budget}"
        if self.kind == "disaggregated":
            return f"{self.num_prefill}P+{self.num_decode}D{budget}"
        cap = f"/{self.local_prefill_max_tokens}" if self.local_prefill_max_tokens else ""
        return f"{self.num_prefill}P+{self.num_decode}H{cap}{budget}"
