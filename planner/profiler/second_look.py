"""A second look at an engine table's rows that stand off its fit, while the engine is still up.

A VM's neighbours slow it for seconds at a time; a prefill row or a decode point measured in such
a stretch stands 15-25% off a smooth table (an AMX Xeon's profile: the 1,024-token prompt 379 ms
between 143 ms at 512 and 721 ms at 2,048, where the same kind's profiles read 281-313; its decode
step of one sequence at context 1,042 27.1 ms between 22.0 and 27.0 at contexts 530 and 4,081).
The fit leans on it, and the medians of the row's own repeats cannot help: they ran in the same
stretch. So every row more than `SECOND_LOOK_ERROR` off the table's fit is measured `SECOND_LOOKS`
times more, minutes later, and the median of its measurements kept: one slow stretch among three
is outvoted, and a real bend in the table (a context knee, a kernel that changes past a length) is
measured the same again and stays. Only the rows are re-read; the form fitted is unchanged.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

SECOND_LOOK_ERROR = 0.10  # a row whose fit is this far off its measurement is measured again
SECOND_LOOKS = 2          # times more; the median of 1 + SECOND_LOOKS measurements is kept


def rows_off_the_fit(measured_s: Sequence[float], fitted_s: Sequence[float],
                     tolerance: float = SECOND_LOOK_ERROR) -> list[int]:
    """Indices of the rows whose fitted time is more than `tolerance` (relative) off the measured
    one, worst first. A row measured at 0 s or less is always off."""
    if len(measured_s) != len(fitted_s):
        raise ValueError(f"{len(measured_s)} measured rows against {len(fitted_s)} fitted")
    errors = {i: (abs(f / m - 1) if m > 0 else float("inf")) for i, (m, f) in enumerate(zip(measured_s, fitted_s))}
    return sorted((i for i, e in errors.items() if e > tolerance), key=lambda i: -errors[i])


def kept_s(first_s: float, again_s: Sequence[float]) -> float:
    """The time a row keeps after its second look: the median of its first measurement and the
    ones taken again (with none again, the first)."""
    return statistics.median([first_s, *again_s])


def kept_span(measured_s: Sequence[float], spans_s: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """When the time `kept_s` keeps was read: the (start, end) of the median measurement of
    `measured_s` (the first and the ones taken again, in order, each read over its `spans_s`), or
    the two middle ones' joined for an even count (their mean is kept)."""
    if not measured_s or len(measured_s) != len(spans_s):
        raise ValueError(f"{len(measured_s)} measurements against {len(spans_s)} spans (need as many, at least one)")
    order = sorted(range(len(measured_s)), key=lambda i: measured_s[i])
    middle = order[(len(order) - 1) // 2: len(order) // 2 + 1]
    return min(spans_s[i][0] for i in middle), max(spans_s[i][1] for i in middle)
