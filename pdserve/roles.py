"""The two worker roles. The one definition every layer uses (registry, workers, router,
launchers, planner): a role is what a worker does with a request, and a pool is its workers."""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = get_args(Role)


def check_role(role: str) -> Role:
    """`role` as a Role, or ValueError saying which roles there are."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role  # type: ignore[return-value]
