"""The sizes of the two worker pools: what the planner decides and actuators apply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.actuators.base import ROLES, Role


@dataclass(frozen=True)
class PoolSizes:
    """Replica counts per role. Zero is allowed (a pool scaled to nothing), negatives are not."""

    prefill: int
    decode: int

    def __post_init__(self) -> None:
        for role in ROLES:
            value = getattr(self, role)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"PoolSizes.{role} must be an int >= 0, got {value!r}")

    @property
    def total(self) -> int:
        return self.prefill + self.decode

    def of(self, role: Role) -> int:
        return getattr(self, role)

    @classmethod
    def from_mapping(cls, sizes: Mapping[Role, int]) -> "PoolSizes":
        """From an actuator's `current()` ({"prefill": n, "decode": m})."""
        return cls(prefill=sizes["prefill"], decode=sizes["decode"])

    def as_dict(self) -> dict[Role, int]:
        return {role: self.of(role) for role in ROLES}

    def __str__(self) -> str:
        return f"{self.prefill}P+{self.decode}D"
