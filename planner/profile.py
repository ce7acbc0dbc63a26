"""The profile file: what `pdserve profile` measured on one host, for one model and engine setup.

A profile is JSON with a format tag and a version. Version 1 holds:

- `hardware`: cpu model, core count, device ("cpu" or a GPU name);
- `model`: name, layers, hidden size, attention and KV heads, dtype, KV block size;
- `engine`: the vLLM settings the measurements were taken with (they bound a step:
  `max_num_batched_tokens` is the chunk size / token budget, `max_num_seqs` the batch cap,
  `kv_cache_memory_bytes` the KV capacity per instance);
- `serving` (optional; zeros when absent): what the router, the gRPC hops and the workers' API
  processes add around the engines, see `ServingCosts`;
- `wide` (optional; empty when absent): the prefill and decode tables again, of one engine spread
  over several devices (`WideEngine`: on a CPU host, one engine bound to both cores, as vLLM's own
  server runs): what a worker that spans devices computes at, measured, not scaled;
- `vllm_server` (optional; null when absent): what vLLM's own OpenAI server adds around the widest
  engine (`ServingCosts`, the latency and step terms only; `pdserve profile --vllm-server`): the
  baseline a goodput comparison judges pdserve against, predicted with its own costs;
- three measured tables:
  `prefill`  one request alone: `prefill_s` for `prompt_tokens`, chunked by `chunk_tokens`;
  `decode`   one engine step: `step_s` for `batch_size` sequences holding `context_tokens` in total;
  `kv_transfer` one transfer: `transfer_s` for `kv_bytes` over `transport`.

`load_profile` validates everything on load and names the field and the fix in its errors;
the returned `Profile` is frozen. `save_profile` writes the same format back.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from loadgen.host_probe import PRODUCTS as MACHINE_PRODUCTS

PROFILE_FORMAT = "pdserve-profile"
PROFILE_VERSION = 1
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
MIN_PREFILL_ROWS = 3  # the prefill form has three coefficients
MIN_DECODE_ROWS = 3
MIN_TRANSFER_ROWS_PER_TRANSPORT = 2


class ProfileError(ValueError):
    """A profile file that cannot be used; the message says which field and how to fix it."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ProfileError(message)


def _positive_int(owner: str, name: str, value: Any) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
             f"{owner}.{name} must be a positive integer, got {value!r}")


def _positive_float(owner: str, name: str, value: Any) -> None:
    _require(isinstance(value, (int, float)) and not isinstance(value, bool)
             and math.isfinite(value) and value > 0,
             f"{owner}.{name} must be a positive number of seconds, got {value!r}")


def _mean_checked(*checks: float) -> float:
    taken = [value for value in checks if value > 0]
    return sum(taken) / len(taken) if taken else 0.0


@dataclass(frozen=True)
class HardwareInfo:
    cpu_model: str
    num_cores: int
    device: str = "cpu"
    host_kind: str = ""       # `pdserve.dtype_probe.this_host_kind()`: profiles carry to hosts of one kind
    dtype_choice: str = ""    # how the engine's dtype was chosen (the probe's decision and timings)
    # the machine's speed when the profile began and ended (`loadgen.host_probe.speed_check_ms`: ms per
    # fixed product, every core busy; 0: not checked): a shared VM's moves by 1.5-2x, and every table
    # here holds only at the speed it was measured at
    machine_ms_start: float = 0.0
    machine_ms_end: float = 0.0
    # which product those checks timed (`loadgen.host_probe.PRODUCTS`): the engines' dtype's since
    # profiles of this field; profiles before it timed float32
    machine_product: str = "float32"
    # how fast an idle core wakes for a message, at the start and the end (`loadgen.host_probe.
    # wake_check_us`: a cross-core round trip, us; 0: not checked): what every hop of a request pays,
    # which a compute check does not see
    machine_wake_us_start: float = 0.0
    machine_wake_us_end: float = 0.0

    @property
    def machine_ms(self) -> float:
        """The mean of the compute checks taken (ms per `machine_product`); 0.0: none."""
        return _mean_checked(self.machine_ms_start, self.machine_ms_end)

    @property
    def machine_wake_us(self) -> float:
        """The mean of the wake-up checks taken (us); 0.0: none."""
        return _mean_checked(self.machine_wake_us_start, self.machine_wake_us_end)

    def __post_init__(self) -> None:
        _positive_int("hardware", "num_cores", self.num_cores)
        _require(self.machine_product in MACHINE_PRODUCTS,
                 f"hardware.machine_product {self.machine_product!r} is unknown; use one of {list(MACHINE_PRODUCTS)}")


@dataclass(frozen=True)
class ModelInfo:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    dtype: str
    block_size: int
    head_dim: int = 0  # 0: hidden_size / num_attention_heads (models whose config has no head_dim)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "block_size"):
            _positive_int("model", name, getattr(self, name))
        _require(self.dtype in DTYPE_BYTES,
                 f"model.dtype {self.dtype!r} is unknown; use one of {sorted(DTYPE_BYTES)}")
        _require(isinstance(self.head_dim, int) and self.head_dim >= 0,
                 f"model.head_dim must be an integer >= 0 (0: hidden_size / num_attention_heads), "
                 f"got {self.head_dim!r}")
        _require(self.head_dim > 0 or self.hidden_size % self.num_attention_heads == 0,
                 f"model.hidden_size {self.hidden_size} is not a multiple of "
                 f"num_attention_heads {self.num_attention_heads}; give model.head_dim")

    @property
    def kv_head_dim(self) -> int:
        """The per-head size of K and V: `head_dim` when given, else hidden_size / heads."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head."""
        return 2 * self.num_layers * self.num_kv_heads * self.kv_head_dim * DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_block(self) -> int:
        return self.kv_bytes_per_token * self.block_size


@dataclass(frozen=True)
class EngineSettings:
    vllm_version: str
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_memory_bytes: int
    enforce_eager: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "kv_cache_memory_bytes"):
            _positive_int("engine", name, getattr(self, name))


@dataclass(frozen=True)
class PrefillSample:
    prompt_tokens: int
    chunk_tokens: int
    prefill_s: float

    def __post_init__(self) -> None:
        _positive_int("prefill[]", "prompt_tokens", self.prompt_tokens)
        _positive_int("prefill[]", "chunk_tokens", self.chunk_tokens)
        _positive_float("prefill[]", "prefill_s", self.prefill_s)

    @property
    def num_chunks(self) -> int:
        return -(-self.prompt_tokens // self.chunk_tokens)


@dataclass(frozen=True)
class DecodeSample:
    batch_size: int
    context_tokens: int
    step_s: float

    def __post_init__(self) -> None:
        _positive_int("decode[]", "batch_size", self.batch_size)
        _positive_int("decode[]", "context_tokens", self.context_tokens)
        _positive_float("decode[]", "step_s", self.step_s)


@dataclass(frozen=True)
class TransferSample:
    transport: str
    kv_bytes: int
    transfer_s: float

    def __post_init__(self) -> None:
        _require(bool(self.transport), "kv_transfer[].transport must name a transport, e.g. 'tcp'")
        _positive_int("kv_transfer[]", "kv_bytes", self.kv_bytes)
        _positive_float("kv_transfer[]", "transfer_s", self.transfer_s)


@dataclass(frozen=True)
class ServingCosts:
    """What serving adds around the engines, measured through a real 1P+1D cluster
    (`pdserve profile --through cluster`); all zero in an engine-only profile.

    Latencies, which hold no engine:
    - `first_token_s`: added to every request's first token: the router, the gRPC hops and the
      prefill worker's API process, the prompt in and the token back;
    - `handoff_s`: from the prefill engine's first token until the decode engine has the request
      (the router's Decode RPC, the decode worker's API process), on top of the KV transfer.
    Decode steps as served, fitted on batches decoding together (served step = engine step +
    `decode_step_s` + `decode_cpu_s_per_token` x batch): what the worker's engine core and API
    process, on the model runner's core, add per step (a wake-up for the step's outputs) and per
    token of the batch (each stream's message).
    CPU on a worker's own cores, which stretches that worker's engine steps:
    - `decode_cpu_s_per_request`: the decode worker's API process per request (its Decode RPC,
      admission);
    - `prefill_cpu_s_per_request`: the prefill worker's, per request.
    Each `*_cpu_s_per_request` term has a `*_cpu_s_per_prompt_token` beside it: the prompt's token
    ids cross every process (the router's placement and Prefill RPC, the prefill worker's request
    into vLLM, the Decode RPC), so a 1.4k-token prompt costs each several ms more CPU than a
    128-token one. 0 in a profile measured before it was (the per-request terms then hold the
    cost at the profile's 128-token CPU-run prompts). `*_request_cpu_s(prompt_tokens)` adds both.
    CPU of the processes bound to no worker (the router; a client on the same host), which takes
    whatever core is free and otherwise stretches the engines' steps:
    - `host_cpu_s_per_token` and `host_cpu_s_per_step`: per token streamed and per decode step that
      streams any (a step's outputs wake the router and the client once, whatever the batch: at
      batch 1 the wake-up is most of a token's cost, at 64 little of it), fitted together over the
      batched runs' steady windows (`stream_fit.stream_cpu_terms`); in a profile measured before
      (per step 0) the per-token term alone, measured at the largest batch;
    - `host_cpu_s_per_request`;
    - `host_cores`: the cores every process shares (0: the host is not modelled);
    - `router_cpu_s_per_token`, `router_cpu_s_per_step`, `router_cpu_s_per_request`, `router_cpu_s_per_prompt_token`: the
      router's own part of the host terms above. Where the router is bound to the prefill workers' cores (`pdserve up`'s default
      for a cluster with a prefill pool apart from its decode workers:
      `launch.commands.router_cores_for`), that part runs there and stretches only their steps, and
      the rest (the client) goes wherever a core is free; elsewhere all of it floats. 0 (a profile
      measured before the router was measured apart): all of it floats.
    The spread around those medians (`planner.profiler.spread`: deviations in seconds at equally
    spaced quantiles, ascending; () when not measured, and the simulator then charges the medians):
    - `first_token_spread_s`: of lone requests' first token, within each prompt length;
    - `decode_step_spread_s`: of the gaps between a request's tokens while a batch decodes
      together, within each batched run.
    Engines on different cores slowing each other (`planner.profiler.corun_probe`: shared caches,
    memory bandwidth, SMT siblings sold as two vCPUs), as a ratio of an engine's time while another
    engine steps on the other worker's cores to its time alone (1: none measured, or none):
    - `corun_prefill_stretch`: of a prompt computed beside a decoding engine;
    - `corun_decode_stretch`: of a decode step beside an engine computing prompts.
    Kept as measured (the median over rounds); the simulator takes a ratio below 1 as 1 (noise).
    What the served step was fitted on, kept so that another form can be fitted later without
    measuring again (`stream_fit.kept_batch_runs`; () in a profile measured before it was kept):
    - `served_batch_runs`: each batched run as (batch, served step s, context tokens, tokens the
      client received per s), in run order.
    """

    first_token_s: float = 0.0
    handoff_s: float = 0.0
    decode_step_s: float = 0.0
    decode_cpu_s_per_token: float = 0.0
    decode_cpu_s_per_request: float = 0.0
    prefill_cpu_s_per_request: float = 0.0
    host_cpu_s_per_token: float = 0.0
    host_cpu_s_per_request: float = 0.0
    host_cores: int = 0
    router_cpu_s_per_token: float = 0.0
    router_cpu_s_per_request: float = 0.0
    first_token_spread_s: tuple[float, ...] = ()
    decode_step_spread_s: tuple[float, ...] = ()
    corun_prefill_stretch: float = 1.0
    corun_decode_stretch: float = 1.0
    prefill_cpu_s_per_prompt_token: float = 0.0
    decode_cpu_s_per_prompt_token: float = 0.0
    host_cpu_s_per_prompt_token: float = 0.0
    router_cpu_s_per_prompt_token: float = 0.0
    host_cpu_s_per_step: float = 0.0
    router_cpu_s_per_step: float = 0.0
    served_batch_runs: tuple[tuple[float, float, float, float], ...] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "served_batch_runs":
                object.__setattr__(self, f.name, _batch_runs(value))
                continue
            if f.name in SPREAD_FIELDS:
                object.__setattr__(self, f.name, _spread(f.name, value))
                continue
            if f.name in CORUN_FIELDS:
                _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                         and CORUN_RANGE[0] <= value <= CORUN_RANGE[1],
                         f"serving.{f.name} must be a ratio in [{CORUN_RANGE[0]}, {CORUN_RANGE[1]:g}] (1: engines on "
                         f"different cores do not slow each other), got {value!r}")
                continue
            _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                     and value >= 0, f"serving.{f.name} must be a number >= 0, got {value!r}")
        for part in ("token", "request", "prompt_token", "step"):
            router, host = getattr(self, f"router_cpu_s_per_{part}"), getattr(self, f"host_cpu_s_per_{part}")
            _require(router <= host, f"serving.router_cpu_s_per_{part} ({router!r}) is part of "
                     f"serving.host_cpu_s_per_{part} ({host!r}) and cannot exceed it")

    def prefill_request_cpu_s(self, prompt_tokens: int) -> float:
        """The prefill worker's API process's CPU for one request of `prompt_tokens`."""
        return self.prefill_cpu_s_per_request + self.prefill_cpu_s_per_prompt_token * prompt_tokens

    def decode_request_cpu_s(self, prompt_tokens: int) -> float:
        """The decode worker's API process's CPU for one request of `prompt_tokens`."""
        return self.decode_cpu_s_per_request + self.decode_cpu_s_per_prompt_token * prompt_tokens

    def host_request_cpu_s(self, prompt_tokens: int) -> float:
        """The unbound processes' (router and client) CPU for one request, its tokens' apart."""
        return self.host_cpu_s_per_request + self.host_cpu_s_per_prompt_token * prompt_tokens

    def router_request_cpu_s(self, prompt_tokens: int) -> float:
        """The router's part of `host_request_cpu_s`."""
        return self.router_cpu_s_per_request + self.router_cpu_s_per_prompt_token * prompt_tokens


SPREAD_FIELDS = ("first_token_spread_s", "decode_step_spread_s")
CORUN_FIELDS = ("corun_prefill_stretch", "corun_decode_stretch")
# What a co-run stretch may be: below 0.5 or above 4 is a broken measurement, not two engines on
# different cores (SMT siblings sharing one core slow each other by 1.3-2x)
CORUN_RANGE = (0.5, 4.0)


def _batch_runs(value: Any) -> tuple[tuple[float, float, float, float], ...]:
    what = "serving.served_batch_runs must be a list of [batch, served step s, context tokens, tokens per s]"
    _require(isinstance(value, (list, tuple)), f"{what}, got {value!r}")
    runs = []
    for row in value:
        _require(isinstance(row, (list, tuple)) and len(row) == 4
                 and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in row),
                 f"{what}, got the row {row!r}")
        _require(row[0] >= 1 and row[1] > 0 and row[2] >= 0 and row[3] >= 0,
                 f"{what} (a batch of at least 1, a step above 0), got the row {row!r}")
        runs.append(tuple(float(v) for v in row))
    return tuple(runs)


def _spread(name: str, value: Any) -> tuple[float, ...]:
    _require(isinstance(value, (list, tuple)), f"serving.{name} must be a list of seconds, got {value!r}")
    points = tuple(value)
    _require(all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in points),
             f"serving.{name} must hold finite numbers, got {value!r}")
    _require(list(points) == sorted(points), f"serving.{name} must be ascending (quantiles), got {value!r}")
    return tuple(float(v) for v in points)


@dataclass(frozen=True)
class WideEngine:
    """The engine tables of one engine spread over `devices` devices (cores on a CPU host), with
    the same engine settings as the profile's one-device tables. A wide engine is not `devices`
    times faster: prefill parallelises well, a small decode step hardly (its cost is per-step
    overhead and memory), so the planner needs both measured to weigh one wide worker against
    several narrow ones."""

    devices: int
    prefill: tuple[PrefillSample, ...]
    decode: tuple[DecodeSample, ...]

    def __post_init__(self) -> None:
        _require(isinstance(self.devices, int) and not isinstance(self.devices, bool) and self.devices >= 2,
                 f"wide[].devices must be an integer >= 2 (the one-device tables are the profile's own), "
                 f"got {self.devices!r}")
        _check_engine_tables(self.prefill, self.decode, f"wide[{self.devices} devices].")


def _check_engine_tables(prefill: tuple[PrefillSample, ...], decode: tuple[DecodeSample, ...], where: str) -> None:
    lengths = {row.prompt_tokens for row in prefill}
    _require(len(lengths) >= MIN_PREFILL_ROWS,
             f"{where}prefill needs rows for at least {MIN_PREFILL_ROWS} distinct prompt lengths to fit "
             f"a + b*n + c*n^2, got {sorted(lengths)}; measure more prompt lengths")
    batches = {row.batch_size for row in decode}
    _require(len(decode) >= MIN_DECODE_ROWS and len(batches) >= 2,
             f"{where}decode needs >= {MIN_DECODE_ROWS} rows over >= 2 batch sizes, got {len(decode)} "
             f"rows over batch sizes {sorted(batches)}; measure more batch sizes")


@dataclass(frozen=True)
class Profile:
    """One host + model + engine setup and its measured tables. Immutable and validated."""

    hardware: HardwareInfo
    model: ModelInfo
    engine: EngineSettings
    prefill: tuple[PrefillSample, ...]
    decode: tuple[DecodeSample, ...]
    kv_transfer: tuple[TransferSample, ...]
    created_at: str = ""
    notes: str = ""
    serving: ServingCosts = ServingCosts()
    wide: tuple[WideEngine, ...] = ()
    vllm_server: ServingCosts | None = None  # vLLM's own server around the widest engine; None: not measured

    def __post_init__(self) -> None:
        _check_engine_tables(self.prefill, self.decode, "")
        widths = [engine.devices for engine in self.wide]
        _require(len(set(widths)) == len(widths), f"wide lists a width twice: {widths}")
        _require(self.vllm_server is None or bool(self.wide),
                 "vllm_server is measured around the widest engine: the profile needs a wide engine too")
        for transport in self.transports:
            sizes = {row.kv_bytes for row in self.kv_transfer if row.transport == transport}
            _require(len(sizes) >= MIN_TRANSFER_ROWS_PER_TRANSPORT,
                     f"kv_transfer for {transport!r} needs >= 2 distinct kv_bytes to fit "
                     f"latency + bytes/bandwidth, got {sorted(sizes)}")

    @property
    def transports(self) -> tuple[str, ...]:
        return tuple(sorted({row.transport for row in self.kv_transfer}))

    @property
    def num_kv_blocks(self) -> int:
        """KV blocks one instance holds, from `kv_cache_memory_bytes` and the model's block size."""
        return self.engine.kv_cache_memory_bytes // self.model.kv_bytes_per_block


def _build(cls: type, data: Any, where: str) -> Any:
    _require(isinstance(data, dict), f"{where} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    _require(not unknown, f"{where} has unknown keys {unknown}; known keys are {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as error:  # a missing required key
        raise ProfileError(f"{where}: {error}; known keys are {sorted(names)}") from error
    except ProfileError as error:
        raise ProfileError(f"{where}: {error}") from error


def _rows(cls: type, data: dict[str, Any], key: str) -> tuple[Any, ...]:
    rows = data.get(key)
    _require(isinstance(rows, (list, tuple)), f"profile.{key} must be a list of measured rows")
    return tuple(_build(cls, row, f"profile.{key}[{i}]") for i, row in enumerate(rows))


def profile_from_dict(data: dict[str, Any]) -> Profile:
    """Validate a decoded JSON document and build the `Profile`; raises `ProfileError`."""
    _require(isinstance(data, dict), "a profile must be a JSON object")
    _require(data.get("format") == PROFILE_FORMAT,
             f"not a pdserve profile: 'format' is {data.get('format')!r}, expected {PROFILE_FORMAT!r}")
    version = data.get("version")
    _require(version == PROFILE_VERSION,
             f"profile version {version!r} is not readable by this pdserve (it reads version "
             f"{PROFILE_VERSION}); re-run `pdserve profile` to write a current one")
    return Profile(
        hardware=_build(HardwareInfo, data.get("hardware"), "profile.hardware"),
        model=_build(ModelInfo, data.get("model"), "profile.model"),
        engine=_build(EngineSettings, data.get("engine"), "profile.engine"),
        prefill=_rows(PrefillSample, data, "prefill"),
        decode=_rows(DecodeSample, data, "decode"),
        kv_transfer=_rows(TransferSample, data, "kv_transfer"),
        created_at=str(data.get("created_at", "")),
        notes=str(data.get("notes", "")),
        serving=_build(ServingCosts, data.get("serving", {}), "profile.serving"),
        wide=_wide(data.get("wide", [])),
        vllm_server=(None if data.get("vllm_server") is None
                     else _build(ServingCosts, data["vllm_server"], "profile.vllm_server")),
    )


def _wide(data: Any) -> tuple[WideEngine, ...]:
    _require(isinstance(data, (list, tuple)), "profile.wide must be a list of {devices, prefill, decode}")
    engines = []
    for i, entry in enumerate(data):
        where = f"profile.wide[{i}]"
        _require(isinstance(entry, dict) and set(entry) == {"devices", "prefill", "decode"},
                 f"{where} must be an object with exactly the keys devices, prefill, decode")
        try:
            engines.append(WideEngine(entry["devices"], _rows(PrefillSample, entry, "prefill"),
                                      _rows(DecodeSample, entry, "decode")))
        except ProfileError as error:
            raise ProfileError(f"{where}: {error}") from error
    return tuple(engines)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    body = asdict(profile)
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **body}


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ProfileError(f"{path} is not valid JSON ({error}); re-run `pdserve profile`") from error
    return profile_from_dict(data)


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write `profile` as JSON: sections indented, one measured row per line."""
    body = profile_to_dict(profile)
    tables = ("prefill", "decode", "kv_transfer")
    head = {key: value for key, value in body.items() if key not in (*tables, "wide")}
    parts = [f"{json.dumps(key)}: {json.dumps(value, indent=2)}" for key, value in head.items()]
    parts += [f"{json.dumps(key)}: {_table(body[key], '')}" for key in tables]
    if body["wide"]:
        wide = ",\n".join(f'  {{"devices": {engine["devices"]},\n'
                           f'   "prefill": {_table(engine["prefill"], "   ")},\n'
                           f'   "decode": {_table(engine["decode"], "   ")}}}' for engine in body["wide"])
        parts.append(f'"wide": [\n{wide}\n]')
    Path(path).write_text("{\n" + ",\n".join(parts) + "\n}\n")


def _table(rows: list[dict[str, Any]], indent: str) -> str:
    """A measured table as JSON, one row per line."""
    lines = ",\n".join(f"{indent}  {json.dumps(row)}" for row in rows)
    return f"[\n{lines}\n{indent}]"
