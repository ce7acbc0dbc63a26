"""What the planner asks of whatever runs the pools: how big they are, and to resize one.

An actuator is an adapter between the planner's pure decision core and a real backend (local
processes, Ray actors, Kubernetes Deployments). Contract for every implementation:
- `current()` returns the *desired* size of both pools, as last set, keyed by role;
- `scale(role, replicas)` sets one pool's desired size and returns once the backend has
  accepted it (not once the new members are serving); it is idempotent;
- both raise on failure with a message that says what to fix, never return a guess.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pdserve.roles import ROLES, Role

__all__ = ["Actuator", "ROLES", "Role"]


@runtime_checkable
class Actuator(Protocol):
    def current(self) -> dict[Role, int]:
        """Desired replica count of each pool, {"prefill": n, "decode": m}."""
        ...

    def scale(self, role: Role, replicas: int) -> None:
        """Set the desired replica count of one pool (replicas >= 0)."""
        ...
