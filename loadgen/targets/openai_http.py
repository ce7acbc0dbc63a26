"""Any OpenAI-compatible server through streaming `POST /v1/completions` (vLLM's own server,
pdserve's router, ...).

Each request sends the prompt as token ids with `max_tokens = min_tokens = output_tokens` and
`ignore_eos: true`, so the server generates exactly the requested length, and asks for a final
usage chunk (`stream_options.include_usage`) so output tokens are counted by the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from loadgen.prompts import Prompt
from loadgen.targets.base import Delta, TargetError
from loadgen.targets.sse import SSEDecoder, error_message, parse_completion_chunk


class OpenAICompletionsTarget:
    """`base_url` like http://127.0.0.1:8000 (a trailing /v1 is accepted). `model` None: the
    first model `GET /v1/models` lists. Timeouts belong to the runner, except connecting."""

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, temperature: float = 0.0,
                 api_key: str | None = None, connect_timeout_s: float = 10.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"target URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.temperature = temperature
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._connect_timeout_s = connect_timeout_s
        self._client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=httpx.Timeout(None, connect=self._connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
        if self.model is None:
            self.model = await self._first_model()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _first_model(self) -> str:
        try:
            response = await self._client.get("/v1/models")
        except httpx.HTTPError as unreachable:
            raise TargetError("unreachable", f"GET {self.base_url}/v1/models: {unreachable!r}; is the server up?") \
                from unreachable
        if response.status_code != 200:
            raise TargetError(f"HTTP {response.status_code}",
                              f"GET {self.base_url}/v1/models failed ({error_message(response.text)}); pass --model")
        models = response.json().get("data") or []
        if not models:
            raise TargetError("no model", f"{self.base_url}/v1/models lists no model; pass --model")
        return str(models[0]["id"])

    def payload(self, prompt: Prompt) -> dict:
        return {
            "model": self.model,
            "prompt": list(prompt.token_ids),
            "max_tokens": prompt.max_tokens,
            "min_tokens": prompt.max_tokens,
            "ignore_eos": True,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def generate(self, prompt: Prompt) -> AsyncIterator[Delta]:
        if self._client is None:
            raise RuntimeError("call open() before generate()")
        async with self._client.stream("POST", "/v1/completions", json=self.payload(prompt)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                raise TargetError(f"HTTP {response.status_code}", error_message(body))
            decoder = SSEDecoder()
            async for line in response.aiter_lines():
                data = decoder.feed(line)
                if data == "[DONE]":
                    return
                if data is not None and (delta := parse_completion_chunk(data)) is not None:
                    yield delta
            if decoder.flush() != "[DONE]":
                raise TargetError("incomplete stream", "the server closed the stream before data: [DONE]")
