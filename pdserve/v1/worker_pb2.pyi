from pdserve.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "transfer_id", "cache_salt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _generation_pb2.SamplingParams
    transfer_id: str
    cache_salt: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., transfer_id: _Optional[str] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class SampledLogprobs(_message.Message):
    __slots__ = ("token_ids", "logprobs", "rank")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    rank: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., rank: _Optional[int] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "finished", "finish_reason", "kv_transfer_params_json", "engine_s", "num_cached_tokens", "queued_s", "stop_token_id", "stop_string", "first_logprobs", "prompt_logprobs")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_S_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    finished: bool
    finish_reason: str
    kv_transfer_params_json: str
    engine_s: float
    num_cached_tokens: int
    queued_s: float
    stop_token_id: int
    stop_string: str
    first_logprobs: SampledLogprobs
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[SampledLogprobs]
    def __init__(self, first_token_id: _Optional[int] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., kv_transfer_params_json: _Optional[str] = ..., engine_s: _Optional[float] = ..., num_cached_tokens: _Optional[int] = ..., queued_s: _Optional[float] = ..., stop_token_id: _Optional[int] = ..., stop_string: _Optional[str] = ..., first_logprobs: _Optional[_Union[SampledLogprobs, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[SampledLogprobs, _Mapping]]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "kv_transfer_params_json", "num_generated", "cache_salt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATED_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _generation_pb2.SamplingParams
    kv_transfer_params_json: str
    num_generated: int
    cache_salt: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., kv_transfer_params_json: _Optional[str] = ..., num_generated: _Optional[int] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("token_ids", "finished", "finish_reason", "kv_transfer_bytes", "kv_transfer_s", "kv_transfer_blocks", "num_cached_tokens", "kv_load_error", "kv_loaded_tokens", "queued_s", "stop_token_id", "stop_string", "logprobs", "prompt_logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_LOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    KV_LOADED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    finish_reason: str
    kv_transfer_bytes: int
    kv_transfer_s: float
    kv_transfer_blocks: int
    num_cached_tokens: int
    kv_load_error: str
    kv_loaded_tokens: int
    queued_s: float
    stop_token_id: int
    stop_string: str
    logprobs: _containers.RepeatedCompositeFieldContainer[SampledLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[SampledLogprobs]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., kv_transfer_bytes: _Optional[int] = ..., kv_transfer_s: _Optional[float] = ..., kv_transfer_blocks: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., kv_load_error: _Optional[str] = ..., kv_loaded_tokens: _Optional[int] = ..., queued_s: _Optional[float] = ..., stop_token_id: _Optional[int] = ..., stop_string: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[SampledLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[SampledLogprobs, _Mapping]]] = ...) -> None: ...

class WorkerAbortRequest(_message.Message):
    __slots__ = ("request_id", "transfer_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ...) -> None: ...

class WorkerAbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Load(_message.Message):
    __slots__ = ("role", "num_waiting", "num_running", "kv_blocks_used", "kv_blocks_total", "pending_transfers", "recent_ttft_s", "recent_tpot_s", "num_inflight", "prompt_tokens_computed", "prompt_tokens_external", "prompt_tokens_local_hit", "worker_id", "generation_tokens")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PENDING_TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    RECENT_TTFT_S_FIELD_NUMBER: _ClassVar[int]
    RECENT_TPOT_S_FIELD_NUMBER: _ClassVar[int]
    NUM_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_EXTERNAL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_LOCAL_HIT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    role: str
    num_waiting: int
    num_running: int
    kv_blocks_used: int
    kv_blocks_total: int
    pending_transfers: int
    recent_ttft_s: float
    recent_tpot_s: float
    num_inflight: int
    prompt_tokens_computed: int
    prompt_tokens_external: int
    prompt_tokens_local_hit: int
    worker_id: str
    generation_tokens: int
    def __init__(self, role: _Optional[str] = ..., num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., pending_transfers: _Optional[int] = ..., recent_ttft_s: _Optional[float] = ..., recent_tpot_s: _Optional[float] = ..., num_inflight: _Optional[int] = ..., prompt_tokens_computed: _Optional[int] = ..., prompt_tokens_external: _Optional[int] = ..., prompt_tokens_local_hit: _Optional[int] = ..., worker_id: _Optional[str] = ..., generation_tokens: _Optional[int] = ...) -> None: ...
