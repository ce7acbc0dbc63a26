"""OpenAI's logprobs objects, made as vLLM's OpenAI server makes them (`completion/serving.py`
`_create_completion_logprobs`, `chat_completion/serving.py` `_create_chat_logprobs`): pure, from
the positions the lifecycle made (`router.output_logprobs`, vLLM's own dicts).

- completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; a position's top
  logprobs are its first `logprobs + 1` entries keyed by their text (entries with the same text
  collapse, as in vLLM's dict); a position without logprobs (a prompt's first token) has None.
- chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}: a position's top
  logprobs are its first `top_logprobs` entries (the output token first, as vLLM lists them).
- with `logprob_token_ids` (`listed`), a position's top logprobs are all of its entries, in either
  API: the output token's and the listed ids' (vLLM's `return_all`).
Logprobs below -9999 (-inf) are sent as -9999.0, OpenAI's floor.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pdserve.logprobs import PositionLogprobs, TopLogprob

FLOOR = -9999.0
Decode = Callable[[int], str]   # one token id's text, the tokenizer's `decode([token_id])`


def completion_logprobs(token_ids: Sequence[int], positions: Sequence[PositionLogprobs], num_top: int,
                        decode: Decode, initial_text_offset: int = 0, as_token_ids: bool = False,
                        listed: bool = False) -> dict:
    """`positions[i]` is token_ids[i]'s; `num_top` the request's `logprobs`. The text offsets
    start at `initial_text_offset` (a stream's earlier chunks: `next_text_offset`)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for i, token_id in enumerate(token_ids):
        position = positions[i] if i < len(positions) else ()
        entry = _entry(position, token_id)
        if entry is None:
            token = _placeholder(token_id) if as_token_ids else decode(token_id)
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            token = _text(entry, decode, as_token_ids)
            token_logprobs.append(max(entry.logprob, FLOOR))
            top_logprobs.append({_text(top, decode, as_token_ids): max(top.logprob, FLOOR)
                                 for rank, top in enumerate(position) if listed or num_top == -1 or num_top >= rank})
        text_offset.append(initial_text_offset if not text_offset else text_offset[-1] + len(tokens[-1]))
        tokens.append(token)
    return {"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": tokens,
            "top_logprobs": top_logprobs}


def next_text_offset(logprobs: dict, current: int) -> int:
    """Where a stream's next chunk's text offsets start, after a chunk's `logprobs` (vLLM advances
    by the tokens reported, not by the text sent, which may lag near a stop string)."""
    return logprobs["text_offset"][-1] + len(logprobs["tokens"][-1]) if logprobs["tokens"] else current


def chat_logprobs(token_ids: Sequence[int], positions: Sequence[PositionLogprobs], num_top: int | None,
                  decode: Decode, as_token_ids: bool = False, listed: bool = False) -> dict:
    """`num_top` is the request's `top_logprobs`."""
    content = []
    for i, token_id in enumerate(token_ids):
        position = positions[i] if i < len(positions) else ()
        entry = _entry(position, token_id)
        if entry is None:
            token = _placeholder(token_id) if as_token_ids else decode(token_id)
            content.append({"token": token, "logprob": FLOOR, "bytes": _bytes(token), "top_logprobs": []})
            continue
        tops = [{"token": (text := _text(top, decode, as_token_ids)), "logprob": max(top.logprob, FLOOR),
                 "bytes": _bytes(text)}
                for rank, top in enumerate(position)
                if listed or num_top == -1 or (num_top is not None and rank < num_top)]
        content.append({"token": _text(entry, decode, as_token_ids), "logprob": max(entry.logprob, FLOOR),
                        "bytes": None if entry.token is None else _bytes(entry.token), "top_logprobs": tops})
    return {"content": content}


def _entry(position: PositionLogprobs, token_id: int) -> TopLogprob | None:
    return next((entry for entry in position if entry.token_id == token_id), None)


def _text(entry: TopLogprob, decode: Decode, as_token_ids: bool) -> str:
    if as_token_ids:
        return _placeholder(entry.token_id)
    return entry.token if entry.token is not None else decode(entry.token_id)


def _placeholder(token_id: int) -> str:
    return f"token_id:{token_id}"


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))
