"""How a profile file's fields are checked on load: `ProfileError` names the field and the fix."""

from __future__ import annotations

import math
from typing import Any


class ProfileError(ValueError):
    """A profile file that cannot be used; the message says which field and how to fix it."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ProfileError(message)


def positive_int(owner: str, name: str, value: Any) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
             f"{owner}.{name} must be a positive integer, got {value!r}")


def positive_float(owner: str, name: str, value: Any) -> None:
    require(isinstance(value, (int, float)) and not isinstance(value, bool)
             and math.isfinite(value) and value > 0,
             f"{owner}.{name} must be a positive number of seconds, got {value!r}")
