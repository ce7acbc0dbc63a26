"""What the simulator runs: the topology (how many instances of which kind) and the per-instance
engine settings (token budget, batch cap, KV capacity, transport)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from planner.profile import Profile, ServingCosts

DecodePick = Literal["handoff", "arrival"]


class SimulationError(ValueError):
    """A workload or configuration the simulator cannot run; the message says how to fix it."""


@dataclass(frozen=True)
class Topology:
    """Either N prefill + M decode instances (disaggregated) or K colocated instances (vLLM alone,
    each doing prefill and decode). One instance is one device: goodput per device divides by
    `devices`."""

    num_prefill: int = 0
    num_decode: int = 0
    num_colocated: int = 0

    def __post_init__(self) -> None:
        counts = (self.num_prefill, self.num_decode, self.num_colocated)
        if any(not isinstance(c, int) or c < 0 for c in counts):
            raise SimulationError(f"instance counts must be ints >= 0, got {counts}")
        disaggregated = self.num_prefill >= 1 and self.num_decode >= 1 and self.num_colocated == 0
        colocated = self.num_colocated >= 1 and self.num_prefill == 0 and self.num_decode == 0
        if not (disaggregated or colocated):
            raise SimulationError(
                f"a topology is N>=1 prefill + M>=1 decode instances, or K>=1 colocated ones; got "
                f"prefill={self.num_prefill} decode={self.num_decode} colocated={self.num_colocated}")

    @classmethod
    def disaggregated(cls, num_prefill: int, num_decode: int) -> "Topology":
        return cls(num_prefill=num_prefill, num_decode=num_decode)

    @classmethod
    def colocated(cls, num_instances: int) -> "Topology":
        return cls(num_colocated=num_instances)

    @property
    def is_colocated(self) -> bool:
        return self.num_colocated > 0

    @property
    def devices(self) -> int:
        return self.num_prefill + self.num_decode + self.num_colocated

    @property
    def label(self) -> str:
        return f"{self.num_colocated}C" if self.is_colocated else f"{self.num_prefill}P+{self.num_decode}D"


@dataclass(frozen=True)
class SimSettings:
    """Per-instance engine limits (the same for every instance) and how KV moves.

    - `token_budget`: tokens one engine step may compute (vLLM's max_num_batched_tokens; the
      chunk size of chunked prefill);
    - `max_num_seqs`: requests admitted at once per instance (decode: transferring + running);
    - `num_kv_blocks` of `block_size` tokens per instance; a request reserves blocks for its whole
      sequence (prompt + output) when admitted to decode, and waits while they are not free;
    - `kv_bytes_per_token` and `transport` give a transfer's bytes (whole blocks) and time;
    - `decode_pick`: when the router picks the decode instance: "handoff" (when prefill finishes,
      by the load at that moment) or "arrival" (the pair is chosen up front);
    - `serving`: what the router, the hops and the workers' API processes add (latencies, CPU on
      the workers' cores and on the host's); zeros simulate the engines alone.
    """

    token_budget: int
    max_num_seqs: int
    num_kv_blocks: int
    block_size: int
    kv_bytes_per_token: int
    transport: str = "tcp"
    decode_pick: DecodePick = "handoff"
    serving: ServingCosts = ServingCosts()

    def __post_init__(self) -> None:
        for name in ("token_budget", "max_num_seqs", "num_kv_blocks", "block_size", "kv_bytes_per_token"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SimulationError(f"SimSettings.{name} must be an int >= 1, got {value!r}")
        if self.decode_pick not in ("handoff", "arrival"):
            raise SimulationError(f"SimSettings.decode_pick must be 'handoff' or 'arrival', got {self.decode_pick!r}")

    @classmethod
    def from_profile(cls, profile: Profile, transport: str | None = None, **overrides) -> "SimSettings":
        """The engine settings the profile was measured with; `transport` defaults to the
        profile's only (or first, alphabetically) transport."""
        chosen = transport or profile.transports[0]
        if chosen not in profile.transports:
            raise SimulationError(f"transport {chosen!r} was not measured; the profile has {profile.transports}")
        settings = cls(
            token_budget=profile.engine.max_num_batched_tokens,
            max_num_seqs=profile.engine.max_num_seqs,
            num_kv_blocks=profile.num_kv_blocks,
            block_size=profile.model.block_size,
            kv_bytes_per_token=profile.model.kv_bytes_per_token,
            transport=chosen,
            serving=profile.serving,
        )
        return replace(settings, **overrides)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def kv_bytes_for(self, prompt_tokens: int) -> int:
        """Bytes moved for a prompt: whole blocks, as the transport copies them."""
        return self.blocks_for(prompt_tokens) * self.block_size * self.kv_bytes_per_token
