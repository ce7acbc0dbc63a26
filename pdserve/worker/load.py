"""A worker's live load, fed by vLLM's own stats through a custom stat logger.

The engine calls `record()` after every step with its scheduler stats (running, waiting, KV cache
usage) and iteration stats (prompt tokens by source, first-token and inter-token latencies). The
gRPC servicer reads the latest snapshot for `GetLoad` and the registry heartbeat.

pdserve's logger runs beside vLLM's own `PrometheusStatLogger` (`engine_stat_loggers`), never in
its place: the worker's metrics endpoint serves vLLM's `vllm:*` series with pdserve's, so
dashboards built on vLLM's names work on a pdserve worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_transfer.stats import held_leases

_EWMA = 0.2


@dataclass
class EngineLoad:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    pending_transfers: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_external: int = 0
    prompt_tokens_local_hit: int = 0
    generation_tokens: int = 0
    recent_ttft_s: float = 0.0
    recent_tpot_s: float = 0.0

    def record_scheduler(self, stats) -> None:
        self.num_running = stats.num_running_reqs
        self.num_waiting = stats.num_waiting_reqs
        self.kv_blocks_used = round(stats.kv_cache_usage * self.kv_blocks_total)
        # consumer: requests fetching KV; producer: prefilled requests whose KV a consumer has yet to take
        self.pending_transfers = (sum((stats.num_kv_fetch_reqs_by_stage or {}).values())
                                  + held_leases(stats.kv_connector_stats))

    def record_iteration(self, stats) -> None:
        tokens = stats.prompt_token_stats
        self.prompt_tokens_computed += tokens.computed
        self.prompt_tokens_external += tokens.external_kv_transfer
        self.prompt_tokens_local_hit += tokens.local_cache_hit
        self.generation_tokens += stats.num_generation_tokens
        for ttft_s in stats.time_to_first_tokens_iter:
            self.recent_ttft_s = _ewma(self.recent_ttft_s, ttft_s)
        for itl_s in stats.inter_token_latencies_iter:
            self.recent_tpot_s = _ewma(self.recent_tpot_s, itl_s)


def _ewma(previous: float, sample: float) -> float:
    return sample if previous == 0.0 else (1 - _EWMA) * previous + _EWMA * sample


def engine_stat_loggers(load: EngineLoad) -> list:
    """The stat logger factories a worker's `AsyncLLM` gets: pdserve's (into `load`) and vLLM's
    Prometheus logger, named so it stays whatever vLLM's defaults become."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    return [stat_logger_factory(load), PrometheusStatLogger]


def stat_logger_factory(load: EngineLoad):
    """A vLLM `StatLoggerFactory` whose loggers write into `load`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LoadLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            load.kv_blocks_total = vllm_config.cache_config.num_gpu_blocks or 0

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                load.record_scheduler(scheduler_stats)
            if iteration_stats is not None:
                load.record_iteration(iteration_stats)

        def log_engine_initialized(self) -> None:
            return None

    return LoadLogger
