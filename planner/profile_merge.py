"""Several profiles of one host kind, model and engine setup taken together: each point the median
of the profiles that measured it (`merged_profile`).

A shared VM runs the same engine 1.3-1.8x slower for seconds to minutes at a time, and a profile
holds whatever its minutes ran at: on one Zen 4 VM three profiles measured within 40 minutes
charged a served decode step +1.63, +0.94 and +2.34 ms over the engine's, and put one validation's
goodput 9-30% apart (BENCHMARKS, "A prompt step beside decode streams"); on a Zen 3 VM three put the
goodput 4-53% apart. No one profile's minutes are the machine. Their median hedges against an
unlucky one: resimulating every kept validation whose session measured several profiles, its
goodput error was below the worst single profile's in all 38 cases and below their mean in 24
(BENCHMARKS, "Several profiles of one VM, merged"); it does not pick the good one, whose terms it
mixes with the others'.

What is taken how:
- the engine tables (one device and each width measured by every profile), the KV transfers:
  row by row, keyed by what the row is of ((prompt tokens, chunk), (batch, context), (transport,
  bytes)), the median of the profiles that have that row, kept where at least half have it (a
  second look's extra row stays out unless most profiles took it); a row's timestamps are
  dropped (each profile ran on its own clock);
- every serving term (`ServingCosts`): the median of the profiles' (a router's part stays within
  its host's: a median keeps order); a spread, quantile by quantile, over the profiles with the
  most common number of quantiles; the served step's extra and the prompt-loss rows batch by
  batch, over the profiles that measured that batch; the batched runs pooled, in profile order,
  without their windows; the served co-run stretch and the join warm-up's two terms over the
  profiles that measured them;
- vLLM's server's terms the same way where every profile measured them, else none;
- the machine checks: the compute check's fastest and slowest over every profile (so a plan's
  speed margin sees how far the machine moved over all of them), the wake-up's and the
  interpreter's mean the median; the interpreter's series is dropped (each on its own clock).
The model, the engine settings, the host kind, the product the checks timed, the host's cores and
where the client was placed must agree: profiles that differ in any are not of one setup, and
merging them is refused (`ProfileError`, naming what differs). Pure: profiles in, a profile out.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import fields, replace
from typing import TypeVar

from planner.profile import (DecodeSample, HardwareInfo, PrefillSample, Profile, ProfileError, TransferSample,
                             WideEngine)
from planner.serving_costs import JOIN_WARMUP_FIELDS, SPREAD_FIELDS, ServingCosts

Row = TypeVar("Row")

# serving fields taken otherwise than as a median of numbers
_SERVING_AGREE = ("host_cores", "client_placement")
_SERVING_BY_BATCH = ("served_step_extra_s", "prompt_loss_by_batch")


def merged_profile(profiles: Sequence[Profile], created_at: str = "") -> Profile:
    """The median profile of `profiles` (at least two, of one setup), as the module says; `created_at`
    the merged file's (default: the latest of theirs). Raises ProfileError where they are not of one
    setup."""
    if len(profiles) < 2:
        raise ProfileError(f"merging takes at least two profiles, got {len(profiles)}")
    first = profiles[0]
    _agree(profiles, "the model", lambda p: p.model)
    _agree(profiles, "the engine settings", lambda p: p.engine)
    _agree(profiles, "hardware.host_kind", lambda p: p.hardware.host_kind)
    _agree(profiles, "hardware.machine_product", lambda p: p.hardware.machine_product)
    _agree(profiles, "hardware.num_cores", lambda p: p.hardware.num_cores)
    widths = sorted(set.intersection(*({engine.devices for engine in p.wide} for p in profiles)))
    wide = tuple(WideEngine(devices, merged_prefill([_wide(p, devices).prefill for p in profiles]),
                            merged_decode([_wide(p, devices).decode for p in profiles])) for devices in widths)
    servers = [p.vllm_server for p in profiles]
    names = ", ".join(p.created_at or "?" for p in profiles)
    return Profile(
        hardware=merged_hardware([p.hardware for p in profiles]), model=first.model, engine=first.engine,
        prefill=merged_prefill([p.prefill for p in profiles]), decode=merged_decode([p.decode for p in profiles]),
        kv_transfer=merged_rows([p.kv_transfer for p in profiles], lambda r: (r.transport, r.kv_bytes),
                                lambda r, s: TransferSample(r.transport, r.kv_bytes, s), lambda r: r.transfer_s),
        created_at=created_at or max(p.created_at for p in profiles),
        notes=f"the median of {len(profiles)} profiles (created {names}): each row and term the median of the "
              "profiles that measured it (planner.profile_merge)",
        serving=merged_serving([p.serving for p in profiles]), wide=wide,
        vllm_server=merged_serving(servers) if wide and all(s is not None for s in servers) else None)


def merged_rows(tables: Sequence[Sequence[Row]], key: Callable[[Row], Hashable], make: Callable[[Row, float], Row],
                value: Callable[[Row], float]) -> tuple[Row, ...]:
    """One row per key that at least half of `tables` hold (a table holding a key twice counts its
    rows' median), its value the median of theirs, made from the first such row with `make`; in the
    order the keys first appear."""
    by_key: dict[Hashable, list[float]] = {}
    first_row: dict[Hashable, Row] = {}
    for table in tables:
        own: dict[Hashable, list[float]] = {}
        for row in table:
            own.setdefault(key(row), []).append(value(row))
            first_row.setdefault(key(row), row)
        for k, values in own.items():
            by_key.setdefault(k, []).append(statistics.median(values))
    return tuple(make(first_row[k], statistics.median(values)) for k, values in by_key.items()
                 if 2 * len(values) >= len(tables))


def merged_prefill(tables: Sequence[Sequence[PrefillSample]]) -> tuple[PrefillSample, ...]:
    return merged_rows(tables, lambda r: (r.prompt_tokens, r.chunk_tokens),
                       lambda r, s: PrefillSample(r.prompt_tokens, r.chunk_tokens, s), lambda r: r.prefill_s)


def merged_decode(tables: Sequence[Sequence[DecodeSample]]) -> tuple[DecodeSample, ...]:
    return merged_rows(tables, lambda r: (r.batch_size, r.context_tokens),
                       lambda r, s: DecodeSample(r.batch_size, r.context_tokens, s), lambda r: r.step_s)


def merged_hardware(machines: Sequence[HardwareInfo]) -> HardwareInfo:
    """The first's, with no interpreter series; its compute checks the fastest and the slowest of
    every profile's (start and end alike: `pdserve plan --speed-margin auto` then plans for as far as
    the machine moved over all of them, `planner.speed_margin`), its wake-up checks and interpreter
    mean the median of those taken (0: none was)."""
    def median_checked(name: str) -> float:
        taken = [getattr(m, name) for m in machines if getattr(m, name) > 0]
        return statistics.median(taken) if taken else 0.0

    compute = [ms for m in machines for ms in (m.machine_ms_start, m.machine_ms_end) if ms > 0]
    return replace(machines[0], machine_ms_start=min(compute, default=0.0), machine_ms_end=max(compute, default=0.0),
                   machine_wake_us_start=median_checked("machine_wake_us_start"),
                   machine_wake_us_end=median_checked("machine_wake_us_end"),
                   machine_interp_ms=median_checked("machine_interp_ms"),
                   machine_interp_series_ms=(), machine_interp_start_s=0.0)


def merged_serving(costs: Sequence[ServingCosts]) -> ServingCosts:
    """Each term the median of `costs`' (the module's rules)."""
    for name in _SERVING_AGREE:
        _agree(costs, f"serving.{name}", lambda c, name=name: getattr(c, name))
    merged: dict[str, object] = {}
    for f in fields(ServingCosts):
        values = [getattr(c, f.name) for c in costs]
        if f.name in _SERVING_AGREE:
            merged[f.name] = values[0]
        elif f.name in SPREAD_FIELDS:
            merged[f.name] = merged_spread(values)
        elif f.name in _SERVING_BY_BATCH:
            merged[f.name] = merged_by_batch(values)
        elif f.name == "served_batch_runs":
            merged[f.name] = tuple(run for runs in values for run in runs)
        elif f.name == "served_batch_windows_s":
            merged[f.name] = ()
        elif f.name == "corun_decode_stretch_served":   # 0: not measured, not a stretch of 0
            merged[f.name] = statistics.median([v for v in values if v > 0] or [0.0])
        elif f.name == "prompt_idle_loss":   # of the profiles that measured it, term by term
            measured = [v for v in values if v]
            merged[f.name] = tuple(statistics.median(column) for column in zip(*measured)) if measured else ()
        elif f.name == "first_token_idle_excess_s":   # alike: 0 is "not measured"
            merged[f.name] = statistics.median([getattr(c, f.name) for c in costs if c.prompt_idle_loss] or [0.0])
        elif f.name in JOIN_WARMUP_FIELDS:   # of the profiles that measured it
            measured = [getattr(c, f.name) for c in costs if c.join_warmup_measured]
            merged[f.name] = statistics.median(measured or [0.0])
        else:
            merged[f.name] = statistics.median(values)
    return ServingCosts(**merged)


def merged_spread(spreads: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    """Quantile by quantile, the median over the spreads with the most common number of quantiles
    (on a tie, the larger number); () where none was measured."""
    lengths = Counter(len(s) for s in spreads if s)
    if not lengths:
        return ()
    length = max(lengths, key=lambda n: (lengths[n], n))
    kept = [s for s in spreads if len(s) == length]
    return tuple(statistics.median(column) for column in zip(*kept))


def merged_by_batch(tables: Sequence[tuple[tuple[float, ...], ...]]) -> tuple[tuple[float, ...], ...]:
    """Rows led by their batch ((batch, value, ...)), by rising batch: each batch any table holds,
    every value the median over the tables that hold that batch."""
    by_batch: dict[float, list[tuple[float, ...]]] = {}
    for table in tables:
        for row in table:
            by_batch.setdefault(row[0], []).append(tuple(row[1:]))
    return tuple((batch, *(statistics.median(column) for column in zip(*rows)))
                 for batch, rows in sorted(by_batch.items()))


def _wide(profile: Profile, devices: int) -> WideEngine:
    return next(engine for engine in profile.wide if engine.devices == devices)


def _agree(items: Sequence, what: str, of: Callable) -> None:
    values = [of(item) for item in items]
    if any(value != values[0] for value in values[1:]):
        differing = next(value for value in values[1:] if value != values[0])
        raise ProfileError(f"cannot merge profiles whose {what} differ: {values[0]!r} and {differing!r}")
