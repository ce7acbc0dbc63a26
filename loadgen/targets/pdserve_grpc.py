"""pdserve's gRPC API through the SDK (`pdserve.client.AsyncClient`).

Each request sends the prompt as token ids with `max_tokens = min_tokens = output_tokens` and
`ignore_eos`, like the OpenAI target, so both generate exactly the requested length. The SDK's
typed errors (`pdserve.errors.ServeError`) become `TargetError(kind, message)`, e.g.
`invalid_request_error: prompt (5000 tokens) ... exceeds the model's context`. The final chunk's
`pdserve.timings.Timings` becomes the record's `PhaseTimings`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pdserve.client import AsyncClient, GenerationChunk
from pdserve.errors import NoHealthyWorker, Overloaded, ServeError
from pdserve.timings import Timings

from loadgen.prompts import Prompt
from loadgen.targets.base import Delta, PhaseTimings, Refused, TargetError


class PdserveGrpcTarget:
    """`address` is the router's gRPC address, e.g. 127.0.0.1:50051. `open` asks the router for
    its model (so an unreachable router fails the run at once, as `TargetError("unreachable")`, and
    a refused key as `TargetError("invalid_request_error")`). `api_key`, `tls`, `root_certificates`
    go to `pdserve.client.AsyncClient` as they are."""

    name = "pdserve"

    def __init__(self, address: str, temperature: float = 0.0, api_key: str | None = None, tls: bool = False,
                 root_certificates: bytes | None = None) -> None:
        if "://" in address:
            raise ValueError(f"a gRPC address is host:port without a scheme, got {address!r}")
        self.address = address
        self.temperature = temperature
        self._connection = {"api_key": api_key, "tls": tls, "root_certificates": root_certificates}
        self.model: str | None = None
        self._client: AsyncClient | None = None

    async def open(self) -> None:
        self._client = AsyncClient(self.address, **self._connection)
        try:
            self.model = (await self._client.model_info()).model
        except NoHealthyWorker as unreachable:  # UNAVAILABLE: nothing answers there
            await self.close()
            raise TargetError("unreachable", f"{self.address}: UNAVAILABLE ({unreachable.message}); "
                                             "is the router up?") from unreachable
        except ServeError as refused:
            await self.close()
            raise TargetError(refused.kind, f"{self.address}: {refused.message}") from refused

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def generate(self, prompt: Prompt) -> AsyncIterator[Delta]:
        if self._client is None:
            raise RuntimeError("call open() before generate()")
        stream = self._client.generate(token_ids=list(prompt.token_ids), max_tokens=prompt.max_tokens,
                                       min_tokens=prompt.max_tokens, temperature=self.temperature, ignore_eos=True)
        try:
            async for chunk in stream:
                yield chunk_to_delta(chunk)
        except Overloaded as refused:
            raise Refused(refused.kind, refused.message, refused.retry_after_s) from refused
        except ServeError as failure:
            raise TargetError(failure.kind, failure.message) from failure
        finally:  # a timed-out or abandoned request cancels its RPC, freeing the server's resources
            await stream.aclose()


def chunk_to_delta(chunk: GenerationChunk) -> Delta:
    """Content when the chunk carries tokens or text; the final chunk's timings become `phases`
    and its token counts the server-reported totals."""
    timings = chunk.timings if chunk.finished else None
    return Delta(
        content=bool(chunk.token_ids or chunk.text), text=chunk.text, num_tokens=len(chunk.token_ids),
        completion_tokens=timings.output_tokens if timings is not None else None,
        prompt_tokens=timings.prompt_tokens if timings is not None else None,
        phases=phase_timings(timings) if timings is not None else None,
    )


def phase_timings(timings: Timings) -> PhaseTimings:
    return PhaseTimings(queued_s=timings.queued_s, prefill_s=timings.prefill_s, kv_transfer_s=timings.kv_transfer_s,
                        kv_transfer_bytes=timings.kv_transfer_bytes, decode_s=timings.decode_s,
                        disaggregated=timings.disaggregated)
