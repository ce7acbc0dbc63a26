"""Per-phase timings of one request: made by the router, carried on the last message, read by clients."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class Timings:
    """Per-phase breakdown of one request, all seconds measured at the router unless noted."""

    queued_s: float = 0.0          # the router's dispatch queue + the first engine's queue (prefill's, or decode's when Local)
    prefill_s: float = 0.0         # prefill RPC round trip minus queued_s: hops and prefill compute
    kv_transfer_bytes: int = 0     # measured by the decode worker's connector
    kv_transfer_s: float = 0.0     # measured by the decode worker's connector
    kv_transfer_blocks: int = 0
    decode_s: float = 0.0          # decode RPC sent -> last token (minus queued_s when decode-only)
    ttft_s: float = 0.0            # receive -> first token ready to send
    e2e_s: float = 0.0             # receive -> last token ready to send
    prefill_worker: str = ""
    decode_worker: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    decode_computed_prompt_tokens: int = 0
    disaggregated: bool = False
    cached_prompt_tokens: int = 0  # vLLM's num_cached_tokens of the engine that computed the prompt

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, as `vllm bench serve` defines it:
        (e2e_s - ttft_s) / (output_tokens - 1); None for fewer than two output tokens."""
        if self.output_tokens < 2:
            return None
        return max(0.0, self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def phase_seconds(self) -> dict[str, float]:
        """The phases this request went through, by name, with their seconds: "queue" always;
        "prefill" when a prefill worker ran the prompt; "kv_transfer" when KV bytes moved;
        "decode" when a decode worker streamed (not for a request that ended at its first token)."""
        phases = {"queue": self.queued_s}
        if self.disaggregated:
            phases["prefill"] = self.prefill_s
        if self.kv_transfer_bytes:
            phases["kv_transfer"] = self.kv_transfer_s
        if self.decode_worker:
            phases["decode"] = self.decode_s
        return phases

    @classmethod
    def from_proto(cls, message) -> "Timings":
        return cls(**{f.name: getattr(message, f.name) for f in fields(cls)})
