"""The profile file: what `pdserve profile` measured on one host, for one model and engine setup.

A profile is JSON with a format tag and a version. Version 1 holds:

- `hardware`: cpu model, core count, device ("cpu" or a GPU name);
- `model`: name, layers, hidden size, attention and KV heads, dtype, KV block size;
- `engine`: the vLLM settings the measurements were taken with (they bound a step:
  `max_num_batched_tokens` is the chunk size / token budget, `max_num_seqs` the batch cap,
  `kv_cache_memory_bytes` the KV capacity per instance);
- `serving` (optional; zeros when absent): what the router, the gRPC hops and the workers' API
  processes add around the engines, see `planner.serving_costs.ServingCosts`;
- `wide` (optional; empty when absent): the prefill and decode tables again, of one engine spread
  over several devices (`WideEngine`: on a CPU host, one engine bound to both cores, as vLLM's own
  server runs): what a worker that spans devices computes at, measured, not scaled;
- `vllm_server` (optional; null when absent): what vLLM's own OpenAI server adds around the widest
  engine (`ServingCosts`, the latency and step terms only; `pdserve profile --vllm-server`): the
  baseline a goodput comparison judges pdserve against, predicted with its own costs;
- three measured tables:
  `prefill`  one request alone: `prefill_s` for `prompt_tokens`, chunked by `chunk_tokens`, its
             repeats run over [`start_s`, `end_s`] (as the decode rows'; 0, 0: not kept);
  `decode`   one engine step: `step_s` for `batch_size` sequences holding `context_tokens` in total,
             read over [`start_s`, `end_s`] (the clock of `hardware.machine_interp_start_s`; 0, 0:
             not kept), so a row can be set against the machine's speed as it ran;
  `kv_transfer` one transfer: `transfer_s` for `kv_bytes` over `transport`.

`load_profile` validates everything on load and names the field and the fix in its errors;
the returned `Profile` is frozen. `save_profile` writes the same format back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from loadgen.host_probe import PRODUCTS as MACHINE_PRODUCTS
from planner.profile_checks import ProfileError, positive_float, positive_int, require
from planner.serving_costs import ServingCosts

PROFILE_FORMAT = "pdserve-profile"
PROFILE_VERSION = 1
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
MIN_PREFILL_ROWS = 3  # the prefill form has three coefficients
MIN_DECODE_ROWS = 3
MIN_TRANSFER_ROWS_PER_TRANSPORT = 2


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
    # how fast the cores ran Python over the whole profile (`loadgen.host_probe.InterpreterSampler`:
    # the mean CPU ms of a fixed loop sampled every 0.15 s on every core; 0: not sampled): what an
    # engine's small decode steps and the serving hops are made of, which a VM can run 1.5x slower
    # for seconds at a time with the compute check unmoved
    machine_interp_ms: float = 0.0
    # and each core's second by second over the profile (`loadgen.host_probe.interpreter_series`:
    # (core, mean CPU ms per window, None for a window without a sample) pairs; (): not kept), its
    # window `machine_interp_window_s`: how the speed moved, which a mean hides
    machine_interp_series_ms: tuple[tuple[int, tuple[float | None, ...]], ...] = ()
    machine_interp_window_s: float = 1.0
    # when the series' first window began (monotonic s, `time.perf_counter`'s clock, as the tables'
    # own times; 0: not kept): what places a timed row (`DecodeSample.start_s`) in the series
    machine_interp_start_s: float = 0.0

    @property
    def machine_ms(self) -> float:
        """The mean of the compute checks taken (ms per `machine_product`); 0.0: none."""
        return _mean_checked(self.machine_ms_start, self.machine_ms_end)

    @property
    def machine_wake_us(self) -> float:
        """The mean of the wake-up checks taken (us); 0.0: none."""
        return _mean_checked(self.machine_wake_us_start, self.machine_wake_us_end)

    def __post_init__(self) -> None:
        positive_int("hardware", "num_cores", self.num_cores)
        object.__setattr__(self, "machine_interp_series_ms", tuple(
            (int(core), tuple(None if ms is None else float(ms) for ms in series))
            for core, series in self.machine_interp_series_ms))   # JSON's lists, as tuples
        require(self.machine_interp_window_s > 0,
                 f"hardware.machine_interp_window_s must be > 0, got {self.machine_interp_window_s!r}")
        require(self.machine_product in MACHINE_PRODUCTS,
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
            positive_int("model", name, getattr(self, name))
        require(self.dtype in DTYPE_BYTES,
                 f"model.dtype {self.dtype!r} is unknown; use one of {sorted(DTYPE_BYTES)}")
        require(isinstance(self.head_dim, int) and self.head_dim >= 0,
                 f"model.head_dim must be an integer >= 0 (0: hidden_size / num_attention_heads), "
                 f"got {self.head_dim!r}")
        require(self.head_dim > 0 or self.hidden_size % self.num_attention_heads == 0,
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
            positive_int("engine", name, getattr(self, name))


def _check_span(owner: str, start_s: Any, end_s: Any) -> None:
    require(all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (start_s, end_s))
            and 0.0 <= start_s <= end_s,
            f"{owner}.start_s and end_s must satisfy 0 <= start_s <= end_s, got {start_s!r}, {end_s!r}")


@dataclass(frozen=True)
class PrefillSample:
    prompt_tokens: int
    chunk_tokens: int
    prefill_s: float
    # when its repeats ran (as `DecodeSample.start_s`; 0, 0: not kept), not part of its identity
    start_s: float = field(default=0.0, compare=False)
    end_s: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        positive_int("prefill[]", "prompt_tokens", self.prompt_tokens)
        positive_int("prefill[]", "chunk_tokens", self.chunk_tokens)
        positive_float("prefill[]", "prefill_s", self.prefill_s)
        _check_span("prefill[]", self.start_s, self.end_s)

    @property
    def num_chunks(self) -> int:
        return -(-self.prompt_tokens // self.chunk_tokens)


@dataclass(frozen=True)
class DecodeSample:
    batch_size: int
    context_tokens: int
    step_s: float
    # when the step was read (monotonic s, the clock of `HardwareInfo.machine_interp_start_s`;
    # 0, 0: not kept): what `planner.profiler.point_speed` sets against the machine's speed then.
    # Not part of a row's identity: the same point measured at another time is the same point.
    start_s: float = field(default=0.0, compare=False)
    end_s: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        positive_int("decode[]", "batch_size", self.batch_size)
        positive_int("decode[]", "context_tokens", self.context_tokens)
        positive_float("decode[]", "step_s", self.step_s)
        _check_span("decode[]", self.start_s, self.end_s)

    @property
    def timed(self) -> bool:
        """Whether the row kept when it was read."""
        return self.end_s > 0.0


@dataclass(frozen=True)
class TransferSample:
    transport: str
    kv_bytes: int
    transfer_s: float

    def __post_init__(self) -> None:
        require(bool(self.transport), "kv_transfer[].transport must name a transport, e.g. 'tcp'")
        positive_int("kv_transfer[]", "kv_bytes", self.kv_bytes)
        positive_float("kv_transfer[]", "transfer_s", self.transfer_s)


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
        require(isinstance(self.devices, int) and not isinstance(self.devices, bool) and self.devices >= 2,
                 f"wide[].devices must be an integer >= 2 (the one-device tables are the profile's own), "
                 f"got {self.devices!r}")
        _check_engine_tables(self.prefill, self.decode, f"wide[{self.devices} devices].")


def _check_engine_tables(prefill: tuple[PrefillSample, ...], decode: tuple[DecodeSample, ...], where: str) -> None:
    lengths = {row.prompt_tokens for row in prefill}
    require(len(lengths) >= MIN_PREFILL_ROWS,
             f"{where}prefill needs rows for at least {MIN_PREFILL_ROWS} distinct prompt lengths to fit "
             f"a + b*n + c*n^2, got {sorted(lengths)}; measure more prompt lengths")
    batches = {row.batch_size for row in decode}
    require(len(decode) >= MIN_DECODE_ROWS and len(batches) >= 2,
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
        require(len(set(widths)) == len(widths), f"wide lists a width twice: {widths}")
        require(self.vllm_server is None or bool(self.wide),
                 "vllm_server is measured around the widest engine: the profile needs a wide engine too")
        for transport in self.transports:
            sizes = {row.kv_bytes for row in self.kv_transfer if row.transport == transport}
            require(len(sizes) >= MIN_TRANSFER_ROWS_PER_TRANSPORT,
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
    require(isinstance(data, dict), f"{where} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    require(not unknown, f"{where} has unknown keys {unknown}; known keys are {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as error:  # a missing required key
        raise ProfileError(f"{where}: {error}; known keys are {sorted(names)}") from error
    except ProfileError as error:
        raise ProfileError(f"{where}: {error}") from error


def _rows(cls: type, data: dict[str, Any], key: str) -> tuple[Any, ...]:
    rows = data.get(key)
    require(isinstance(rows, (list, tuple)), f"profile.{key} must be a list of measured rows")
    return tuple(_build(cls, row, f"profile.{key}[{i}]") for i, row in enumerate(rows))


def profile_from_dict(data: dict[str, Any]) -> Profile:
    """Validate a decoded JSON document and build the `Profile`; raises `ProfileError`."""
    require(isinstance(data, dict), "a profile must be a JSON object")
    require(data.get("format") == PROFILE_FORMAT,
             f"not a pdserve profile: 'format' is {data.get('format')!r}, expected {PROFILE_FORMAT!r}")
    version = data.get("version")
    require(version == PROFILE_VERSION,
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
    require(isinstance(data, (list, tuple)), "profile.wide must be a list of {devices, prefill, decode}")
    engines = []
    for i, entry in enumerate(data):
        where = f"profile.wide[{i}]"
        require(isinstance(entry, dict) and set(entry) == {"devices", "prefill", "decode"},
                 f"{where} must be an object with exactly the keys devices, prefill, decode")
        try:
            engines.append(WideEngine(entry["devices"], _rows(PrefillSample, entry, "prefill"),
                                      _rows(DecodeSample, entry, "decode")))
        except ProfileError as error:
            raise ProfileError(f"{where}: {error}") from error
    return tuple(engines)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    body = asdict(profile)
    for tables in (body, *body["wide"]):
        for table in ("prefill", "decode"):
            tables[table] = _times_where_kept(tables[table])
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **body}


def _times_where_kept(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Engine rows as written: a row that kept no time (end_s 0) without its zeros."""
    return [row if row["end_s"] > 0 else {k: v for k, v in row.items() if k not in ("start_s", "end_s")}
            for row in rows]


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
