"""Filters: each keeps (True) or drops (False) a candidate path.

Hard filters say the path cannot work (`local_allowed`, `kv_fits`); the soft ones say it will
miss an SLO: `decodes_spared` (a local prefill would push the decodes already running on that
worker over the TPOT SLO), then `ttft_feasible` (this request's TTFT). The running decodes go
first: they are several requests, this one is one. The pipeline (`pick.place`) applies them in `FILTERS` order and
skips a soft filter that would drop every candidate left: then no path meets the SLO, placement
still names the least bad one, and admission decides whether to take the request at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from router.policies.placement.config import PlacementConfig
from router.policies.placement.paths import Local, Path, Prediction
from router.policies.placement.state import RequestView, WorkerView

Filter = Callable[[Path, Prediction, RequestView, Mapping[str, WorkerView], PlacementConfig], bool]


def local_allowed(path: Path, prediction: Prediction, request: RequestView, workers: Mapping[str, WorkerView],
                  config: PlacementConfig) -> bool:
    """A Local path needs a decode worker that accepts local prefills and, when
    `local_prefill_max_tokens` > 0, at most that many uncached prompt tokens. Other paths pass."""
    if not isinstance(path, Local):
        return True
    decode = workers[path.decode_id]
    if not decode.accepts_local_prefill:
        return False
    cap = config.local_prefill_max_tokens
    return cap == 0 or request.uncached_tokens(decode) <= cap


def kv_fits(path: Path, prediction: Prediction, request: RequestView, workers: Mapping[str, WorkerView],
            config: PlacementConfig) -> bool:
    """The decode worker has free KV blocks for prompt + max_tokens (its cached prefix is not
    subtracted: vLLM counts unreferenced cached blocks as free, so a hit uses up free blocks too)."""
    decode = workers[path.decode_id]
    return decode.kv_blocks_free >= request.kv_blocks_needed(decode.block_size)


def ttft_feasible(path: Path, prediction: Prediction, request: RequestView, workers: Mapping[str, WorkerView],
                  config: PlacementConfig) -> bool:
    """The predicted TTFT meets the SLO (soft: skipped when no candidate would pass)."""
    return prediction.ttft_s <= request.ttft_slo_s


def decodes_spared(path: Path, prediction: Prediction, request: RequestView, workers: Mapping[str, WorkerView],
                   config: PlacementConfig) -> bool:
    """A Local path keeps the TPOT SLO of the decodes running on its worker: their step with this
    request joined plus the stall spread over a horizon of `max_tokens` (this request's budget stands
    in for theirs) stays within it. Other paths, and a Local path on an idle worker, pass (soft)."""
    if not isinstance(path, Local) or workers[path.decode_id].running_decodes == 0:
        return True
    per_token_s = prediction.decode_step_s + prediction.decode_stall_s / max(1, request.max_tokens)
    return per_token_s <= request.tpot_slo_s


# (name, filter, soft): applied in this order.
FILTERS: tuple[tuple[str, Filter, bool], ...] = (
    ("local_allowed", local_allowed, False),
    ("kv_fits", kv_fits, False),
    ("decodes_spared", decodes_spared, True),
    ("ttft_feasible", ttft_feasible, True),
)
