"""Any OpenAI-compatible server through streaming `POST /v1/completions` or
`POST /v1/chat/completions` (vLLM's own server, pdserve's router, other OpenAI-style servers).

What a request body holds is `RequestShape`'s choice, and nothing else:
- always: `model`, the prompt, the output budget (`max_tokens` for completions,
  `max_completion_tokens` for chat, as `vllm bench serve` sends), `temperature`, `stream: true` and
  `stream_options.include_usage` (a final usage chunk, so the server counts output tokens);
- the prompt: token ids (`"prompt": [ids]`, completions only, no tokenizer needed: the server sees
  exactly the requested length) or text (`"prompt": "..."`, or one user message for chat), which
  needs the prompts built with a tokenizer (`PromptSynthesizer(tokenizer=...)`);
- `min_tokens` = `max_tokens` and `ignore_eos: true` only with `vllm_extensions` (the default):
  vLLM's sampling extensions that make every request generate exactly its requested length. A
  strict OpenAI server may reject unknown fields: turn them off there, and read
  `output_len_mismatches` in the summary for requests that stopped early.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import httpx

from loadgen.prompts import Prompt
from loadgen.targets.base import Delta, Refused, TargetError
from loadgen.targets.sse import SSEDecoder, error_message, parse_chat_chunk, parse_completion_chunk

Endpoint = Literal["completions", "chat"]
PromptFormat = Literal["token-ids", "text"]
ENDPOINT_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class RequestShape:
    """Which endpoint, how the prompt is sent, and whether vLLM's exact-length fields are added."""

    endpoint: Endpoint = "completions"
    prompt_format: PromptFormat = "token-ids"
    vllm_extensions: bool = True

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINT_PATHS)}, got {self.endpoint!r}")
        if self.prompt_format not in ("token-ids", "text"):
            raise ValueError(f"prompt format must be 'token-ids' or 'text', got {self.prompt_format!r}")
        if self.endpoint == "chat" and self.prompt_format != "text":
            raise ValueError("chat completions take text messages: use prompt format 'text' (it needs a tokenizer)")

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    @property
    def backend(self) -> str:
        """`vllm bench serve --backend`'s name for this endpoint: openai or openai-chat."""
        return "openai-chat" if self.endpoint == "chat" else "openai"


class OpenAITarget:
    """`base_url` like http://127.0.0.1:8000 (a trailing /v1 is accepted). `model` None: the
    first model `GET /v1/models` lists. Timeouts belong to the runner, except connecting."""

    def __init__(self, base_url: str, model: str | None = None, temperature: float = 0.0,
                 api_key: str | None = None, connect_timeout_s: float = 10.0,
                 shape: RequestShape = RequestShape(), ca_file: str | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"target URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.temperature = temperature
        self.shape = shape
        self.name = shape.backend
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._connect_timeout_s = connect_timeout_s
        self._verify = ssl.create_default_context(cafile=ca_file) if ca_file else True   # https: whom to trust
        self._client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            verify=self._verify,
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
        """The JSON body for `prompt`; raises TargetError when text is needed and the prompt has none."""
        shape = self.shape
        if shape.prompt_format == "text" and prompt.text is None:
            raise TargetError("no text", "text prompts need prompts built with a tokenizer (--tokenizer)")
        body: dict = {"model": self.model}
        if shape.endpoint == "chat":
            body |= {"messages": [{"role": "user", "content": prompt.text}], "max_completion_tokens": prompt.max_tokens}
        else:
            text_or_ids = prompt.text if shape.prompt_format == "text" else list(prompt.token_ids)
            body |= {"prompt": text_or_ids, "max_tokens": prompt.max_tokens}
        body |= {"temperature": self.temperature, "stream": True, "stream_options": {"include_usage": True}}
        if shape.vllm_extensions:
            body |= {"min_tokens": prompt.max_tokens, "ignore_eos": True}
        return body

    async def generate(self, prompt: Prompt) -> AsyncIterator[Delta]:
        if self._client is None:
            raise RuntimeError("call open() before generate()")
        parse = parse_chat_chunk if self.shape.endpoint == "chat" else parse_completion_chunk
        async with self._client.stream("POST", self.shape.path, json=self.payload(prompt)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                if response.status_code == 429:
                    raise Refused("HTTP 429", error_message(body), retry_after_s(response.headers.get("retry-after")))
                raise TargetError(f"HTTP {response.status_code}", error_message(body))
            decoder = SSEDecoder()
            async for line in response.aiter_lines():
                data = decoder.feed(line)
                if data == "[DONE]":
                    return
                if data is not None and (delta := parse(data)) is not None:
                    yield delta
            if decoder.flush() != "[DONE]":
                raise TargetError("incomplete stream", "the server closed the stream before data: [DONE]")


def retry_after_s(header: str | None) -> float | None:
    """A `Retry-After` header's delay in seconds (RFC 9110 delay-seconds); None when absent or an
    HTTP date (a load generator has no use for a wall-clock date)."""
    try:
        return float(header) if header is not None else None
    except ValueError:
        return None
