"""The online planner's view of the cluster: live load from the routers, workers from the registry.

Reading is a thin Redis adapter (`read_router_loads`); everything else here is pure and turns
what was read into the decision core's `ObservedLoad`:

- several routers: rates add up, mean lengths are weighted by requests finished, and the p50s
  and p90s are the worst router's (a conservative merge; exact percentiles would need the samples);
- a pool's ready size counts registered workers that are not draining;
- when no request finished in the window (only in-flight ones), the mean lengths are the last
  ones seen, so a load step of long requests is still sized with their lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.registry import WorkerRecord
from planner.decision import ObservedLoad
from planner.model_error import Latencies
from planner.pool_sizes import ROLES, PoolSizes
from pdserve.keys import router_load_key
from router.live_stats import LoadSummary


@dataclass(frozen=True)
class LiveLoad:
    """Every router's summary merged into one."""

    num_routers: int
    num_finished: int
    num_inflight: int
    arrival_rate_rps: float
    mean_prompt_tokens: float | None  # None when nothing finished in the window
    mean_output_tokens: float | None
    ttft_p90_s: float | None
    tpot_p90_s: float | None
    ttft_p50_s: float | None = None
    tpot_p50_s: float | None = None


async def read_router_loads(redis, cluster: str) -> list[LoadSummary]:
    """Every router's current summary (expired keys are gone, so only live routers appear)."""
    keys = [key async for key in redis.scan_iter(match=router_load_key(cluster, "*"), count=100)]
    if not keys:
        return []
    values = await redis.mget(keys)
    return [LoadSummary.from_json(value) for value in values if value is not None]


def _worst(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def merge_loads(summaries: Sequence[LoadSummary]) -> LiveLoad | None:
    """None when no router published (the planner then holds: no data is not "no load")."""
    if not summaries:
        return None
    finished = sum(s.num_finished for s in summaries)

    def weighted(name: str) -> float | None:
        if finished == 0:
            return None
        return sum(getattr(s, name) * s.num_finished for s in summaries) / finished

    return LiveLoad(
        num_routers=len(summaries), num_finished=finished, num_inflight=sum(s.num_inflight for s in summaries),
        arrival_rate_rps=sum(s.arrival_rate_rps for s in summaries),
        mean_prompt_tokens=weighted("mean_prompt_tokens"), mean_output_tokens=weighted("mean_output_tokens"),
        ttft_p90_s=_worst([s.ttft_p90_s for s in summaries]), tpot_p90_s=_worst([s.tpot_p90_s for s in summaries]),
        ttft_p50_s=_worst([s.ttft_p50_s for s in summaries]), tpot_p50_s=_worst([s.tpot_p50_s for s in summaries]),
    )


def observed_latencies(live: LiveLoad) -> Latencies:
    """What the model's prediction is judged against (`planner.model_error`)."""
    return Latencies(ttft_p50_s=live.ttft_p50_s, ttft_p90_s=live.ttft_p90_s, tpot_p50_s=live.tpot_p50_s,
                     tpot_p90_s=live.tpot_p90_s)


def observation_window_s(summaries: Sequence[LoadSummary]) -> float:
    """The longest span the routers' numbers cover: requests served that long ago still count."""
    return max((s.window_s for s in summaries), default=0.0)


def ready_sizes(workers: Sequence[WorkerRecord]) -> PoolSizes:
    """Registered, non-draining workers per role: the ones the router can send work to."""
    counts = {role: sum(1 for w in workers if w.role == role and not w.draining) for role in ROLES}
    return PoolSizes(**counts)


def observed_load(live: LiveLoad, current: PoolSizes, ready: PoolSizes, seconds_since_last_scale: float,
                  rate_history_rps: tuple[float, ...], fallback_lengths: tuple[float, float]) -> ObservedLoad:
    """The decision core's input. `fallback_lengths` (prompt, output) stand in for the means
    when nothing finished in the window."""
    prompt = live.mean_prompt_tokens if live.mean_prompt_tokens is not None else fallback_lengths[0]
    output = live.mean_output_tokens if live.mean_output_tokens is not None else fallback_lengths[1]
    return ObservedLoad(arrival_rate_rps=live.arrival_rate_rps, mean_prompt_tokens=prompt, mean_output_tokens=output,
                        ttft_p90_s=live.ttft_p90_s, tpot_p90_s=live.tpot_p90_s, current=current,
                        seconds_since_last_scale=seconds_since_last_scale, rate_history_rps=rate_history_rps,
                        ready=ready, num_finished=live.num_finished)
