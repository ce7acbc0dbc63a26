"""The KV transfer handle: what a producer's `request_finished` names, and what a consumer pulls.

One frozen dataclass with one encoding per medium:

- `to_params()` / `from_params()`: vLLM's `kv_transfer_params` dict (the producer's
  `request_finished` returns it; the consumer's request carries it). Keys:

      {"do_remote_prefill": True, "transfer_id", "remote_address", "remote_engine_id",
       "remote_block_ids", "remote_num_tokens"}

- `encode()` / `decode()`: the wire string (`PrefillResponse.kv_transfer_params_json` and
  `DecodeRequest.kv_transfer_params_json`), the JSON of exactly that dict, key for key.

`decode`/`from_params` validate every field and raise `MalformedKVHandle` saying which is wrong,
so a bad handle is refused at the decode worker's edge and never reaches the engine core.
`producer_params(transfer_id)` is the other direction: what a prefill request carries to ask the
producer for a handle. Importable without vLLM (the router uses it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping


class MalformedKVHandle(Exception):
    """A KV handle is not valid JSON, or a field is missing or of the wrong type or range.

    Deliberately no ValueError (which the worker maps to the client's INVALID_ARGUMENT): the edge
    that reads a handle from a peer decides whose fault it is (`pdserve.worker_proto.decode_handle`:
    the caller's; the router's gRPC worker client: the prefill worker's)."""


@dataclass(frozen=True)
class KVHandle:
    """Names the producer's leased blocks of one prompt. Invariants (checked when decoded):
    `transfer_id` and `remote_address` are non-empty, `remote_block_ids` are ints >= 0, and
    `remote_num_tokens` >= 1 (a handle exists only for a prompt with at least one block)."""

    transfer_id: str
    remote_address: str          # the producer's KV transfer address, host:port
    remote_engine_id: str
    remote_block_ids: tuple[int, ...]
    remote_num_tokens: int       # prompt tokens whose KV the blocks hold

    def to_params(self) -> dict[str, Any]:
        """vLLM's `kv_transfer_params` for the consumer's request (a fresh, mutable dict)."""
        return {
            "do_remote_prefill": True,
            "transfer_id": self.transfer_id,
            "remote_address": self.remote_address,
            "remote_engine_id": self.remote_engine_id,
            "remote_block_ids": list(self.remote_block_ids),
            "remote_num_tokens": self.remote_num_tokens,
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "KVHandle":
        """The handle in a `kv_transfer_params` dict; raises MalformedKVHandle naming the bad field.
        `do_remote_prefill` is the consumer's one-shot flag, not part of the handle: not checked."""
        if not isinstance(params, Mapping):
            raise MalformedKVHandle(f"a KV handle is a JSON object, got {type(params).__name__}")
        block_ids = _field(params, "remote_block_ids", list)
        if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in block_ids):
            raise MalformedKVHandle("KV handle field remote_block_ids must be a list of integers >= 0")
        num_tokens = _field(params, "remote_num_tokens", int)
        if num_tokens < 1:
            raise MalformedKVHandle(f"KV handle field remote_num_tokens must be >= 1, got {num_tokens}")
        return cls(
            transfer_id=_nonempty(params, "transfer_id"),
            remote_address=_nonempty(params, "remote_address"),
            remote_engine_id=_field(params, "remote_engine_id", str),
            remote_block_ids=tuple(block_ids),
            remote_num_tokens=num_tokens,
        )

    def encode(self) -> str:
        """The wire string: `json.dumps(self.to_params())`."""
        return json.dumps(self.to_params())

    @classmethod
    def decode(cls, text: str) -> "KVHandle":
        """The handle in a wire string; raises MalformedKVHandle if it is not one."""
        try:
            params = json.loads(text)
        except (TypeError, ValueError) as error:
            raise MalformedKVHandle(f"a KV handle is JSON: {error}") from None
        return cls.from_params(params)


def producer_params(transfer_id: str) -> dict[str, Any]:
    """The `kv_transfer_params` of a prefill request: keep the prompt's KV for `transfer_id`."""
    return {"do_remote_decode": True, "transfer_id": transfer_id}


def _field(params: Mapping[str, Any], name: str, kind: type) -> Any:
    value = params.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise MalformedKVHandle(f"KV handle field {name} must be a {kind.__name__}, got {value!r}")
    return value


def _nonempty(params: Mapping[str, Any], name: str) -> str:
    value = _field(params, name, str)
    if not value:
        raise MalformedKVHandle(f"KV handle field {name} must not be empty")
    return value
