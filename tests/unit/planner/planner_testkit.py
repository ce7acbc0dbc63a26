"""Shared builders for the planner tests: a round-number performance model and settings."""

from __future__ import annotations

from loadgen.workload import RequestSpec
from planner.perf_model import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
from planner.simulator import SimSettings

# prefill step = 0.1 + 0.001*tokens + 1e-6*units; decode step = 0.01 + 0.005*batch + 1e-4*context;
# transfer = 5 ms + bytes / 100 kB/s  (a block of 10 tokens x 100 bytes = 1000 bytes = 10 ms)
ROUND_MODEL = PerfModel(
    prefill=PrefillCoeffs(step_s=0.1, per_token_s=0.001, per_token2_s=1e-6),
    decode=DecodeCoeffs(step_s=0.01, per_seq_s=0.005, per_context_token_s=1e-4),
    transfer={"tcp": TransferCoeffs(latency_s=0.005, bytes_per_s=1e5)},
)


def round_settings(**overrides) -> SimSettings:
    base = dict(token_budget=100, max_num_seqs=8, num_kv_blocks=100, block_size=10, kv_bytes_per_token=100,
                transport="tcp")
    return SimSettings(**(base | overrides))


def spec(arrival_s: float, prompt_tokens: int, output_tokens: int) -> RequestSpec:
    return RequestSpec(arrival_s=arrival_s, prompt_tokens=prompt_tokens, output_tokens=output_tokens)


class RecordingActuator:
    """An actuator that records its `scale` calls and answers `current` from them."""

    def __init__(self, prefill: int, decode: int) -> None:
        self.sizes = {"prefill": prefill, "decode": decode}
        self.calls: list[tuple[str, int]] = []

    def current(self) -> dict[str, int]:
        return dict(self.sizes)

    def scale(self, role: str, replicas: int) -> None:
        self.calls.append((role, replicas))
        self.sizes[role] = replicas
