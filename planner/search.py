"""Goodput search over topologies and pool sizes, as pure functions of an attainment oracle.

`attainment(topology, rate_rps) -> float` is the share of requests meeting every SLO when the
workload arrives at `rate_rps` (the simulator provides it, tests pass a formula). The search
assumes attainment does not rise with the rate and does not fall with more instances.

- each topology's goodput is `planner.rate_search.max_rate`'s: where its service first breaks;
- `search_splits`: every topology within the budget (`enumerate_topologies`): disaggregated
  N prefill + M decode, hybrid N + M under each local prefill cap, aggregated K workers, the
  last two under each engine token budget (the chunk that trades a decode's TPOT for TTFT); the
  pick is the highest goodput per device of all (objective "per-device": what to add when a pool
  grows; ties: fewer devices, then search order) or the highest goodput within the budget
  (objective "total": how best to use the devices one has; ties: fewer devices), and each
  kind's best is reported beside it; given a second oracle on a slower machine
  (`robust_attainment`), the goodput ranked is the one there (the robust pick);
- `fewest_devices`: the reverse question, each kind's fewest devices meeting the target at a
  given rate over the same variants (splits walked as a staircase of minimal M for each N;
  aggregated K workers of each width and token budget), and the fewest of all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdserve.roles import TOPOLOGIES
from pdserve.roles import Topology as TopologyKind
from planner.rate_search import SearchSettings, max_rate
from planner.simulator.topology import Topology

AttainmentFn = Callable[[Topology, float], float]
Progress = Callable[[str], None]
DEFAULT_LOCAL_PREFILL_CAPS = (0, 256, 1024)  # hybrid: the placement's local_prefill_max_tokens tried (0: none)
DEFAULT_TOKEN_BUDGETS = (0, 256, 512, 1024)  # aggregated and hybrid: engine step token budgets tried (0: the engine's)
OBJECTIVES = ("per-device", "total")


@dataclass(frozen=True)
class RateSearch:
    """The highest rate found for one topology; `samples` are every (rate, attainment) tried."""

    topology: Topology
    max_rate_rps: float  # 0.0 when even min_rate_rps misses the target
    attainment: float  # at max_rate_rps
    samples: tuple[tuple[float, float], ...]
    # the highest rate meeting the target on a machine slower than profiled (`search_splits`'
    # `robust_attainment`); None: not searched
    robust_rate_rps: float | None = None

    @property
    def goodput_per_device(self) -> float:
        return self.max_rate_rps / self.topology.devices

    @property
    def ranking_rate_rps(self) -> float:
        """What the pick ranks by: the robust rate where it was searched, else the nominal one."""
        return self.max_rate_rps if self.robust_rate_rps is None else self.robust_rate_rps


@dataclass(frozen=True)
class SplitSearch:
    """Every topology searched, in search order; `best` is the pick by `objective` (OBJECTIVES)."""

    results: tuple[RateSearch, ...]
    objective: str = "per-device"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"the objective must be one of {OBJECTIVES}, got {self.objective!r}")

    def of_kind(self, kind: TopologyKind) -> tuple[RateSearch, ...]:
        return tuple(r for r in self.results if r.topology.kind == kind)

    def best_of(self, kind: TopologyKind) -> RateSearch | None:
        """The kind's pick by the objective, or None when none of it meets the target."""
        return _best(self.of_kind(kind), self.objective)

    def best_by_kind(self) -> dict[TopologyKind, RateSearch | None]:
        """kind -> its best, for every kind searched, in `TOPOLOGIES` order."""
        kinds = {r.topology.kind for r in self.results}
        return {kind: self.best_of(kind) for kind in TOPOLOGIES if kind in kinds}

    @property
    def best(self) -> RateSearch | None:
        return _best(self.results, self.objective)

    @property
    def disaggregated(self) -> tuple[RateSearch, ...]:
        return self.of_kind("disaggregated")

    @property
    def hybrid(self) -> tuple[RateSearch, ...]:
        return self.of_kind("hybrid")

    @property
    def colocated(self) -> tuple[RateSearch, ...]:
        """The aggregated topologies (K colocated workers)."""
        return self.of_kind("aggregated")

    @property
    def best_colocated(self) -> RateSearch | None:
        return self.best_of("aggregated")


Pick = tuple[Topology, float]  # (topology, attainment at the asked rate)


@dataclass(frozen=True)
class FewestDevices:
    """The answer to "how few devices meet the SLOs at this rate": for each kind searched, in
    `TOPOLOGIES` order, its smallest topology meeting the target (None where none within the cap)."""

    rate_rps: float
    by_kind: tuple[tuple[TopologyKind, Pick | None], ...]

    def of(self, kind: TopologyKind) -> Pick | None:
        return dict(self.by_kind).get(kind)

    @property
    def best(self) -> Pick | None:
        """The fewest devices of every kind; ties: the higher attainment, then `TOPOLOGIES` order."""
        found = [pick for _, pick in self.by_kind if pick is not None]
        return min(found, key=lambda pick: (pick[0].devices, -pick[1]), default=None)

    @property
    def disaggregated(self) -> Pick | None:
        return self.of("disaggregated")

    @property
    def colocated(self) -> Pick | None:
        """The aggregated pick (K colocated workers)."""
        return self.of("aggregated")


def _best(results: tuple[RateSearch, ...], objective: str = "per-device") -> RateSearch | None:
    """The pick by `objective`, ranked by each result's `ranking_rate_rps` (the robust rate where it
    was searched), the nominal rate breaking ties; None when no topology meets the target."""
    feasible = [r for r in results if r.max_rate_rps > 0]
    if not feasible:
        return None
    if objective == "total":
        return max(feasible, key=lambda r: (r.ranking_rate_rps, r.max_rate_rps, -r.topology.devices))
    return max(feasible, key=lambda r: (r.ranking_rate_rps / r.topology.devices, r.goodput_per_device,
                                        -r.topology.devices, r.max_rate_rps))


def search_topology(attainment: AttainmentFn, topology: Topology, settings: SearchSettings,
                    robust_attainment: AttainmentFn | None = None) -> RateSearch:
    """The topology's highest rate meeting the target; with `robust_attainment` (the same oracle
    on a slower machine) its highest rate there too, searched from the nominal one."""
    rate, value, samples = max_rate(lambda r: attainment(topology, r), settings,
                                    settings.rate_hint_rps * topology.devices)
    robust = None
    if robust_attainment is not None:
        robust, _, _ = max_rate(lambda r: robust_attainment(topology, r), settings,
                                rate or settings.rate_hint_rps * topology.devices)
    return RateSearch(topology, rate, value, samples, robust)


def enumerate_splits(budget_devices: int) -> list[Topology]:
    """Every N prefill + M decode with N, M >= 1 and N + M <= budget, smallest first."""
    if budget_devices < 2:
        raise ValueError(f"a disaggregated split needs a budget of >= 2 devices, got {budget_devices}")
    return [Topology.disaggregated(n, total - n) for total in range(2, budget_devices + 1) for n in range(1, total)]


def enumerate_topologies(budget_devices: int, kinds: Sequence[TopologyKind] = TOPOLOGIES,
                         local_prefill_caps: Sequence[int] = DEFAULT_LOCAL_PREFILL_CAPS,
                         token_budgets: Sequence[int] = DEFAULT_TOKEN_BUDGETS,
                         widths: Sequence[int] = (1,)) -> list[Topology]:
    """In this order: every disaggregated split (the engines' own token budget: a decode worker
    computes no prompt, so its chunk size cannot trade TTFT for TPOT), every hybrid split under each
    cap and each token budget (split-major), K = 1..budget aggregated workers under each token
    budget, then K workers each over W devices for every other width W of `widths` (the widths the
    profile measured one engine over: `PerfModel.widths`) with K x W <= budget; only the `kinds`
    asked for."""
    unknown = sorted(set(kinds) - set(TOPOLOGIES))
    if unknown or not kinds:
        raise ValueError(f"topology kinds must be some of {TOPOLOGIES}, got {list(kinds)}")
    if "hybrid" in kinds and (not local_prefill_caps or any(c < 0 for c in local_prefill_caps)):
        raise ValueError(f"hybrid needs local prefill caps >= 0 (0: no cap), got {list(local_prefill_caps)}")
    if any(width < 1 for width in widths):
        raise ValueError(f"devices per instance must be >= 1, got {list(widths)}")
    if not token_budgets or any(b < 0 for b in token_budgets):
        raise ValueError(f"token budgets must be >= 0 (0: the engine's own), got {list(token_budgets)}")
    budgets = dict.fromkeys(token_budgets)
    topologies = []
    if "disaggregated" in kinds:
        topologies += enumerate_splits(budget_devices)
    if "hybrid" in kinds:
        topologies += [Topology.hybrid(split.num_prefill, split.num_decode, cap, budget)
                       for split in enumerate_splits(budget_devices) for cap in dict.fromkeys(local_prefill_caps)
                       for budget in budgets]
    if "aggregated" in kinds:
        topologies += [Topology.aggregated(k, budget, width) for width in sorted(set(widths) | {1})
                       for k in range(1, budget_devices // width + 1) for budget in budgets]
    return topologies


def search_splits(attainment: AttainmentFn, budget_devices: int, settings: SearchSettings = SearchSettings(),
                  include_colocated: bool = True, progress: Progress | None = None,
                  kinds: Sequence[TopologyKind] = TOPOLOGIES,
                  local_prefill_caps: Sequence[int] = DEFAULT_LOCAL_PREFILL_CAPS,
                  objective: str = "per-device",
                  token_budgets: Sequence[int] = DEFAULT_TOKEN_BUDGETS,
                  widths: Sequence[int] = (1,), robust_attainment: AttainmentFn | None = None) -> SplitSearch:
    """Goodput of every topology `enumerate_topologies` lists (`include_colocated=False` drops the
    aggregated ones), picked by `objective`; with `robust_attainment` each is searched on the slower
    machine too and the pick ranks by that rate (a topology whose SLO margin is its own service
    time loses its goodput when the machine slows; one with room keeps it)."""
    kinds = [kind for kind in kinds if include_colocated or kind != "aggregated"]
    results = []
    for topology in enumerate_topologies(budget_devices, kinds, local_prefill_caps, token_budgets, widths):
        results.append(search_topology(attainment, topology, settings, robust_attainment))
        if progress:
            progress(topology.label)
    return SplitSearch(tuple(results), objective)


def fewest_devices(attainment: AttainmentFn, rate_rps: float, max_devices: int,
                   settings: SearchSettings = SearchSettings(),
                   kinds: Sequence[TopologyKind] = ("disaggregated", "aggregated"),
                   local_prefill_caps: Sequence[int] = (0,), token_budgets: Sequence[int] = (0,),
                   widths: Sequence[int] = (1,), progress: Progress | None = None) -> FewestDevices:
    """Each of `kinds`' smallest topology meeting the target at `rate_rps` within `max_devices`,
    over the variants `enumerate_topologies` lists: splits N + M walked as a staircase (the
    smallest M for each N; a hybrid split is its best variant over `local_prefill_caps` x
    `token_budgets`), aggregated K workers of each width in `widths` (`PerfModel.widths`, 1 among
    them; the online planner gives its workers' one width) under each token budget.
    Among a kind's topologies of equally few devices the higher attainment wins."""
    target = settings.target_attainment
    enumerate_topologies(max_devices, kinds, local_prefill_caps, token_budgets, widths)  # validates the inputs

    def check(topology: Topology) -> float:
        value = attainment(topology, rate_rps)
        if progress:
            progress(topology.label)
        return value

    def best_variant(variants: Sequence[Topology]) -> Pick:
        return max(((t, check(t)) for t in variants), key=lambda pick: pick[1])

    caps, budgets = tuple(dict.fromkeys(local_prefill_caps)), tuple(dict.fromkeys(token_budgets))
    answers: list[tuple[TopologyKind, Pick | None]] = []
    for kind in (k for k in TOPOLOGIES if k in kinds):
        if kind == "aggregated":
            answers.append((kind, _fewest_aggregated(best_variant, max_devices, target, budgets, widths)))
            continue
        variants = ((lambda n, m: (Topology.disaggregated(n, m),)) if kind == "disaggregated" else
                    (lambda n, m: tuple(Topology.hybrid(n, m, cap, budget) for cap in caps for budget in budgets)))
        answers.append((kind, _fewest_split(lambda n, m: best_variant(variants(n, m)), max_devices, target)))
    return FewestDevices(rate_rps, tuple(answers))


def _fewest_split(check: Callable[[int, int], Pick], max_devices: int, target: float) -> Pick | None:
    """The smallest N + M passing, walking the staircase of minimal M for each N."""
    best: Pick | None = None
    m_pass: int | None = None  # smallest passing M for the previous N: M for this N is no larger
    for n in range(1, max_devices):
        if best is not None and n + 1 >= best[0].devices:
            break
        m, pick = _min_decode(check, n, m_pass, max_devices - n, target)
        if m is None:
            continue
        m_pass = m
        if pick is not None and (best is None or pick[0].devices < best[0].devices):
            best = pick
    return best


def _fewest_aggregated(best_variant: Callable[[Sequence[Topology]], Pick], max_devices: int, target: float,
                       budgets: Sequence[int], widths: Sequence[int]) -> Pick | None:
    """The fewest devices of K workers over W devices each (every width of `widths`), the best token
    budget at each K."""
    best: Pick | None = None
    for width in sorted(set(widths)):
        for k in range(1, max_devices // width + 1):
            if best is not None and k * width > best[0].devices:
                break
            pick = best_variant([Topology.aggregated(k, budget, width) for budget in budgets])
            if pick[1] >= target:
                if best is None or (pick[0].devices, -pick[1]) < (best[0].devices, -best[1]):
                    best = pick
                break
    return best


def _min_decode(check: Callable[[int, int], Pick], n: int, m_pass: int | None, m_max: int,
                target: float) -> tuple[int | None, Pick | None]:
    """Smallest passing M for N = n, and its pick.

    Without a bound: (None, None) if (n, m_max) misses, else bisection over 1..m_max. Given that
    (n-1, m_pass) passed, (n, m_pass) passes too and M <= m_pass: step down while M - 1 still
    passes. If no smaller M passes the pick is None: (n, m_pass) cannot beat (n-1, m_pass), so
    it is not simulated.
    """
    if m_pass is None:
        if m_max < 1:
            return None, None
        pick = check(n, m_max)
        if pick[1] < target:
            return None, None
        lo, hi = 0, m_max  # (n, lo) misses (lo = 0 by definition), (n, hi) passes
        while hi - lo > 1:
            mid = (lo + hi) // 2
            mid_pick = check(n, mid)
            if mid_pick[1] >= target:
                hi, pick = mid, mid_pick
            else:
                lo = mid
        return hi, pick
    m, pick = m_pass, None
    while m > 1:
        lower = check(n, m - 1)
        if lower[1] < target:
            break
        m, pick = m - 1, lower
    return m, pick
