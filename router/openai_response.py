"""OpenAI's response objects for completions and chat completions, shaped as vLLM's OpenAI server
shapes them (`completion/serving.py`, `chat_completion/serving.py`): pure, chunks in, dicts out.

One HTTP request is one or more choices (a batch of prompts, `n` samples of each), each its own
walk; choice `index` is `prompt_index * n + sample`, as vLLM numbers them. A choice's streamed
chunk and its whole answer are shaped by the same `choice` (vLLM shares the logic too): with
`echo`, the first one starts with the prompt's text, tokens and prompt logprobs; a completion's
logprob text offsets run on across a stream's chunks.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from pdserve.generation import GenerationChunk
from pdserve.logprobs import PositionLogprobs
from router.openai_logprobs import FLOOR, chat_logprobs, completion_logprobs, next_text_offset
from router.openai_tools import ChoiceParser


@dataclass
class Echo:
    """What a completion with `echo` prepends: the prompt's text (vLLM's: the string sent, or the
    token ids' decoded text) and token ids."""

    text: str
    token_ids: list[int]
    only: bool = False   # vLLM's echo without generation: the prompt alone, the walk's token not shown


@dataclass
class ChoiceState:
    index: int
    echo: Echo | None = None
    echoed: bool = False
    next_text_offset: int = 0
    prompt_token_ids: list[int] | None = None   # with `return_token_ids`: the prompt's ids, as the engines got them
    ids_sent: bool = False                      # a completion stream sends them with its first chunk only
    parser: ChoiceParser | None = None          # a chat's tool or reasoning parser (`router.openai_tools`)


@dataclass(frozen=True)
class LogprobsAsked:
    """How the request asked for logprobs: the top ones listed per position (None: no logprobs in
    the answer), whether tokens are named by id (`return_tokens_as_token_ids`), whether the prompt's
    were asked (`prompt_logprobs`, or `echo`'s: vLLM answers them in `prompt_logprobs`, not streamed,
    a completion's in each choice, a chat's on the body), and whether `logprob_token_ids` named the
    tokens (then every entry of a position is listed)."""

    num_top: int | None = None
    as_token_ids: bool = False
    prompt: bool = False
    listed: bool = False


@dataclass
class ResponseShape:
    request_id: str
    model: str
    chat: bool
    decode: Callable[[int], str]       # one token id's text (the tokenizer's decode)
    logprobs: LogprobsAsked = LogprobsAsked()
    role: str = "assistant"            # a chat answer's role (`router.openai_prompt.answer_role`)
    token_ids: bool = False            # vLLM's `return_token_ids`: each choice's `token_ids`, the prompt's ids
    prompt_text: str | None = None     # vLLM's `return_prompt_text` (chat): the rendered prompt, sent as is
    created: int = field(default_factory=lambda: int(time.time()))

    def base(self, streaming: bool) -> dict:
        kind = ("chat.completion.chunk" if streaming else "chat.completion") if self.chat else "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, state: ChoiceState, chunk: GenerationChunk, streaming: bool) -> dict | None:
        """Choice `state`'s part of a stream event (`chunk` is its next chunk; None: vLLM sends no
        event for it, a parser holding its text back), or its whole answer (`chunk` is all of its
        chunks, `merged`)."""
        text, token_ids, positions = chunk.text, list(chunk.token_ids), list(chunk.logprobs)
        if state.echo is not None and state.echo.only:
            text, token_ids, positions = "", [], []
        echoed, echo_ids = "", None
        if state.echo is not None and not state.echoed:
            state.echoed = True
            echoed, echo_ids, token_ids = state.echo.text, state.echo.token_ids, state.echo.token_ids + token_ids
            if not self.chat:   # a chat echoes text only, a completion its prompt's tokens too
                positions = list(chunk.prompt_logprobs or [()] * len(state.echo.token_ids)) + positions
        hidden = state.parser is not None and state.parser.hides_metadata
        body = {"index": state.index, "finish_reason": chunk.finish_reason or None, "stop_reason": chunk.stop_reason,
                "logprobs": None if hidden else self._logprobs(state, token_ids, positions)}
        if self.chat and state.parser is not None:
            if not self._parsed(state.parser, body, echoed, text, chunk, streaming):
                return None
        elif self.chat:
            text = echoed + text
            body |= {"delta": {"content": text}} if streaming else {"message": {"role": self.role, "content": text}}
        else:
            text = echoed + text
            body["text"] = text
            if self.logprobs.prompt and not streaming:
                body["prompt_logprobs"] = prompt_logprobs_body(chunk.prompt_logprobs)
        if streaming and not self.chat and echo_ids is not None:   # vLLM's stream: an echo names its prompt's ids
            body["prompt_token_ids"], state.ids_sent = echo_ids, True
        if self.token_ids and not hidden:   # vLLM's: the choice's own tokens (never the echoed prompt's)
            body["token_ids"] = list(chunk.token_ids)
            if not self.chat and not state.ids_sent:
                body["prompt_token_ids"], state.ids_sent = state.prompt_token_ids, streaming
        return body

    def _parsed(self, parser: ChoiceParser, body: dict, echoed: str, text: str, chunk: GenerationChunk,
                streaming: bool) -> bool:
        """A parsed chat choice's message (whole) or delta (streamed) and finish reason, into
        `body`; False when vLLM sends no event for this chunk: nothing parsed out yet, not
        finished, and no logprobs or token ids to carry."""
        finish_reason = chunk.finish_reason or None
        if not streaming:
            fields, body["finish_reason"] = parser.whole(text, list(chunk.token_ids), finish_reason)
            if echoed:   # vLLM's: the echoed content before the parsed content
                fields["content"] = echoed + (fields.get("content") or "")
            body["message"] = {"role": self.role} | fields
            return True
        fields, body["finish_reason"] = parser.delta(text, list(chunk.token_ids), finish_reason)
        if fields is None:
            carries = body["logprobs"] is not None or (self.token_ids and not parser.hides_metadata)
            if finish_reason is None and not carries:
                return False
            fields = {}
        body["delta"] = fields
        return True

    def opening_events(self, states: list[ChoiceState]) -> list[dict]:
        """vLLM's first chat stream events: each choice's role, no content yet; then, with `echo`,
        each choice's echoed content alone."""
        events = [self._delta_event(state.index, {"role": self.role, "content": ""}) | self._prompt_fields(state)
                  for state in states]
        for state in states:
            if state.echo is not None:
                state.echoed = True
                if state.echo.text:
                    events.append(self._delta_event(state.index, {"content": state.echo.text}))
        return events

    def _delta_event(self, index: int, delta: dict) -> dict:
        return self.base(True) | {"choices": [{"index": index, "delta": delta, "logprobs": None,
                                               "finish_reason": None}]}

    def _prompt_fields(self, state: ChoiceState) -> dict:
        """A chat's `prompt_token_ids` and `prompt_text`, when asked (fields of the whole answer,
        or of each role event: vLLM's first chunk of each choice)."""
        fields = {"prompt_token_ids": state.prompt_token_ids} if self.token_ids else {}
        return fields | ({"prompt_text": self.prompt_text} if self.prompt_text is not None else {})

    def event(self, state: ChoiceState, chunk: GenerationChunk) -> dict | None:
        """The stream event of a choice's next chunk (None: no event, see `choice`)."""
        choice = self.choice(state, chunk, streaming=True)
        if choice is None:
            return None
        body = self.base(True) | {"choices": [choice]}
        if chunk.finished and chunk.timings:
            body["pdserve_timings"] = chunk.timings.to_dict()
        return body

    def whole(self, answers: list[tuple[ChoiceState, GenerationChunk]], usage_body: dict) -> dict:
        """The non-streamed answer: each choice's merged chunks, in index order."""
        answers = sorted(answers, key=lambda answer: answer[0].index)
        timings = [chunk.timings.to_dict() if chunk.timings else None for _, chunk in answers]
        body = self.base(False) | {"choices": [self.choice(state, chunk, streaming=False) for state, chunk in answers],
                                   "usage": usage_body,
                                   "pdserve_timings": timings[0] if len(timings) == 1 else timings}
        if self.chat and self.logprobs.prompt:   # vLLM's chat answer carries its one prompt's logprobs
            body["prompt_logprobs"] = prompt_logprobs_body(answers[0][1].prompt_logprobs)
        if self.chat:
            body |= self._prompt_fields(answers[0][0])
        return body

    def _logprobs(self, state: ChoiceState, token_ids: list[int], positions: list[PositionLogprobs]) -> dict | None:
        asked = self.logprobs
        if asked.num_top is None:
            return None
        if self.chat:
            return chat_logprobs(token_ids, positions, asked.num_top, self.decode, asked.as_token_ids, asked.listed)
        logprobs = completion_logprobs(token_ids, positions, asked.num_top, self.decode, state.next_text_offset,
                                       asked.as_token_ids, asked.listed)
        state.next_text_offset = next_text_offset(logprobs, state.next_text_offset)
        return logprobs


@dataclass
class StreamInterval:
    """vLLM's `stream_interval` for one choice's stream (`OutputProcessor`'s rule, in DELTA mode): a
    chunk is sent when it finishes the choice, when nothing has been sent yet, or when the tokens
    held reach `interval`; else it is held and sent merged with the next. An interval of 1 (vLLM's
    default) sends every chunk as it comes. Invariant: the chunks sent, joined, are the chunks added."""

    interval: int = 1
    sent_tokens: int = 0
    held: list[GenerationChunk] = field(default_factory=list)

    def add(self, chunk: GenerationChunk) -> GenerationChunk | None:
        """The chunk to send now (the held ones and `chunk`, merged), or None while holding."""
        if self.interval <= 1:
            return chunk
        self.held.append(chunk)
        held_tokens = sum(len(held.token_ids) for held in self.held)
        if not (chunk.finished or self.sent_tokens == 0 or held_tokens >= self.interval):
            return None
        send = merged(self.held) if len(self.held) > 1 else chunk
        self.sent_tokens += held_tokens
        self.held = []
        return send


def merged(chunks: list[GenerationChunk]) -> GenerationChunk:
    """One choice's chunks as one: text, tokens and logprobs joined; the prompt's logprobs of the
    first; the end (finish, stop reason, timings) of the last."""
    last = chunks[-1]
    prompt = next((chunk.prompt_logprobs for chunk in chunks if chunk.prompt_logprobs is not None), None)
    return GenerationChunk(last.request_id, [t for chunk in chunks for t in chunk.token_ids],
                           "".join(chunk.text for chunk in chunks), last.finished, last.finish_reason, last.timings,
                           last.stop_reason, [p for chunk in chunks for p in chunk.logprobs], prompt)


def usage(num_prompt_tokens: int, num_completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage; `prompt_tokens_details` only with `cached_tokens` (vLLM sends it only when
    started with --enable-prompt-tokens-details)."""
    body = {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def prompt_logprobs_body(positions: list[PositionLogprobs] | None) -> list | None:
    """vLLM's `prompt_logprobs` in a completion choice: per prompt token, None for the first, else
    {token id: {"logprob", "rank", "decoded_token"}} (its `Logprob` dataclass as JSON), -inf as
    -9999.0 (vLLM's `clamp_prompt_logprobs`)."""
    if positions is None:
        return None
    return [{str(entry.token_id): {"logprob": FLOOR if entry.logprob == float("-inf") else entry.logprob,
                                   "rank": entry.rank, "decoded_token": entry.token}
             for entry in position} or None for position in positions]


def model_list(name: str, root: str | None, max_model_len: int) -> dict:
    """`/v1/models` as vLLM's server lists its model (`ModelCard`, with its default permission
    entry); `owned_by` names pdserve."""
    created = int(time.time())
    permission = {"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                  "organization": "*", "group": None, "is_blocking": False}
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "pdserve",
                                        "root": root, "parent": None, "max_model_len": max_model_len,
                                        "permission": [permission]}]}
