"""How much slower than its profile the plan should assume the machine can run: the robust pick's
margin, `pdserve plan --speed-margin`.

A plan ranks topologies by the goodput the simulator gives them at the profile's speed. On a shared
VM that speed moves: the benchmarks measured one-core prompts 1.2-1.3x slower during the runs than
during the profile on two VMs whose own profiles saw the machine-speed check move 1.23x and 1.29x
between their start and end, and on both the nominal picks (a one-core prefill worker whose TTFT
margin was its own service time) lost their goodput while vLLM's form over both cores did not. On
the VMs that held still (the checks within 1.03-1.06x) the nominal picks held.

So `auto` (the default) reads the profile's own two checks: a host that moved while it was profiled
is planned for a machine slower by as much as it moved; a host that held still (within
`STEADY_DRIFT`) or a profile without checks is planned at its measured speed. Pure: numbers in,
a `SpeedMargin` out.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
# two checks within this ratio: the host held still while profiled (the steady VMs' 1.03-1.06x;
# the moving ones' 1.23-1.29x); below it no margin, so steady hosts keep the nominal pick
STEADY_DRIFT = 1.10
# the most `auto` takes: a host that moved more than 1.5x is planned for 1.5x (and told to re-profile)
MAX_AUTO_MARGIN = 0.5


@dataclass(frozen=True)
class SpeedMargin:
    """The margin the search uses (0.1: rank by the goodput on a machine 10% slower) and why."""
    value: float
    why: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.value < 1.0:
            raise ValueError(f"the speed margin must be in [0, 1), e.g. 0.1 for a machine 10% slower than "
                             f"profiled; got {self.value}")


def margin_from_checks(start_ms: float, end_ms: float, steady: float = STEADY_DRIFT,
                       cap: float = MAX_AUTO_MARGIN) -> SpeedMargin:
    """`auto`: the margin from a profile's machine-speed checks at its start and end (ms per product;
    0: not checked). The drift is the slower check over the faster, whichever came first (a VM that
    sped up during the profile may slow again as much); within `steady` it is none."""
    if start_ms <= 0 or end_ms <= 0:
        return SpeedMargin(0.0, "auto: the profile has no machine-speed checks, so it is planned at its measured speed")
    drift = max(start_ms, end_ms) / min(start_ms, end_ms)
    seen = f"the profile's machine-speed checks moved {drift:.2f}x between its start and end"
    if drift <= steady:
        return SpeedMargin(0.0, f"auto: {seen} (steady: within {steady:.2f}x), so it is planned at its measured speed")
    margin = min(drift - 1.0, cap)
    capped = f", capped at {cap:.0%}: re-profile when the host is quieter" if drift - 1.0 > cap else ""
    return SpeedMargin(margin, f"auto: {seen}, so topologies are ranked by their goodput on a machine "
                               f"{margin:.0%} slower{capped}")


def resolve_speed_margin(asked: str | float, start_ms: float, end_ms: float) -> SpeedMargin:
    """`--speed-margin`: `AUTO` from the profile's checks, or the number given (0: nominal)."""
    if asked == AUTO:
        return margin_from_checks(start_ms, end_ms)
    value = float(asked)
    return SpeedMargin(value, "given" if value > 0 else "given: 0, planned at the profile's measured speed")


def parse_speed_margin(text: str) -> str | float:
    """The CLI's value: `auto` or a fraction in [0, 1). Raises ValueError with what is accepted."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected 'auto' or a fraction such as 0.1 (10% slower), got {text!r}") from None
    SpeedMargin(value, "")   # the range check
    return value
