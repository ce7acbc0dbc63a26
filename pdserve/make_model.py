"""Write a small, deterministic Hugging Face Llama checkpoint that vLLM loads: `build_model`.

No model can be downloaded where pdserve is developed, so tests and benchmarks serve one made
here: a `LlamaForCausalLM` config, random bfloat16 weights drawn from a fixed seed (safetensors),
and a byte-level BPE tokenizer trained on the English corpus shipped in `pdserve.corpus`.

Contracts:
- the same recipe (spec, seed, corpus, tokenizers and numpy versions) gives byte-identical files
  on every rebuild, on any machine: weights come from numpy's platform-independent PCG64 stream;
- a finished build ends with `pdserve_model.json` (the stamp: the recipe and each file's sha256),
  written last, so a directory with a valid stamp holds a complete build, and `build_model`
  returns at once when asked for the same build again;
- special tokens have all-zero `lm_head` rows, so the random model never picks them greedily and
  rarely when sampling: outputs run to `max_tokens` (stop strings still work).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pdserve.corpus import corpus_sha256, read_corpus
from pdserve.corpus.bpe import BOS_TOKEN, EOS_TOKEN, EOT_TOKEN, SPECIAL_TOKENS
from pdserve.corpus.bpe import special_tokens_map, tokenizer_config, train_tokenizer

Size = Literal["tiny", "bench"]
BUILD_FORMAT = 1  # bump whenever the bytes written for a given recipe change
STAMP_FILE = "pdserve_model.json"
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json")


class BuildProgress(Protocol):
    """Where `build_model` reports progress (the CLI passes a rich progress bar)."""

    def add_task(self, description: str, total: int) -> object: ...
    def advance(self, task: object, steps: int = 1) -> None: ...


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one buildable model; the std values are part of the recipe (and so the bytes).

    `embedding_std` is large next to `weight_std` on purpose: the residual stream is then led by the
    current token, so greedy decoding walks through many tokens instead of repeating one.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    weight_std: float = 0.02
    embedding_std: float = 1.0

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                      "intermediate_size", "vocab_size", "max_position_embeddings"):
            if getattr(self, field) <= 0:
                raise ValueError(f"ModelSpec.{field} must be positive, got {getattr(self, field)}")
        if self.hidden_size % (2 * self.num_attention_heads):
            raise ValueError(
                f"hidden_size {self.hidden_size} must split into {self.num_attention_heads} heads of an "
                "even size (rotary embeddings rotate pairs): use a multiple of 2*num_attention_heads"
            )
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of num_kv_heads "
                f"{self.num_kv_heads}: grouped-query attention shares each KV head by a whole group"
            )
        if self.vocab_size <= 256 + len(SPECIAL_TOKENS):
            raise ValueError(
                f"vocab_size {self.vocab_size} leaves no room for BPE merges: it must exceed the 256 "
                f"byte symbols plus {len(SPECIAL_TOKENS)} special tokens"
            )
        if self.weight_std <= 0 or self.embedding_std <= 0:
            raise ValueError("weight_std and embedding_std must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def weight_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor of the checkpoint by its Hugging Face Llama name, in the order drawn."""
        h, kv, ff = self.hidden_size, self.num_kv_heads * self.head_dim, self.intermediate_size
        shapes = [("model.embed_tokens.weight", (self.vocab_size, h))]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes += [
                (p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.o_proj.weight", (h, h)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (ff, h)),
                (p + "mlp.up_proj.weight", (ff, h)),
                (p + "mlp.down_proj.weight", (h, ff)),
            ]
        return shapes + [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab_size, h))]

    @property
    def num_params(self) -> int:
        return sum(math.prod(shape) for _, shape in self.weight_shapes())


SPECS: dict[str, ModelSpec] = {
    "tiny": ModelSpec("tiny", num_layers=4, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                      intermediate_size=512, vocab_size=2048, max_position_embeddings=2048),
    "bench": ModelSpec("bench", num_layers=12, hidden_size=768, num_attention_heads=12, num_kv_heads=4,
                       intermediate_size=2048, vocab_size=8192, max_position_embeddings=16384),
}


def spec_for(size: str) -> ModelSpec:
    """The spec named `size`; raises ValueError listing the known sizes."""
    if size not in SPECS:
        raise ValueError(f"unknown model size {size!r}: choose one of {', '.join(SPECS)}")
    return SPECS[size]


def recipe(spec: ModelSpec, seed: int) -> dict:
    """Everything the output bytes depend on; a build is reused only when this matches exactly."""
    import numpy
    import tokenizers

    return {"builder": "pdserve make-model", "build_format": BUILD_FORMAT, "seed": seed,
            "spec": dataclasses.asdict(spec), "corpus_sha256": corpus_sha256(),
            "tokenizers_version": tokenizers.__version__, "numpy_version": numpy.__version__}


def is_up_to_date(size: Size, out_dir: Path, *, seed: int = 0) -> bool:
    """True when `out_dir` holds a complete, unmodified build of this exact recipe."""
    stamp_path = Path(out_dir) / STAMP_FILE
    try:
        stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    files = stamp.get("files", {})
    return (stamp.get("recipe") == recipe(spec_for(size), seed) and set(files) == set(MODEL_FILES)
            and all((Path(out_dir) / name).is_file() and file_sha256(Path(out_dir) / name) == digest
                    for name, digest in files.items()))


def build_model(size: Size, out_dir: Path, *, seed: int = 0, progress: BuildProgress | None = None) -> Path:
    """Write the `size` checkpoint into `out_dir` (created if missing) and return `out_dir`.

    Does nothing when `is_up_to_date`. Refuses a directory holding files other than a checkpoint's,
    so a mistyped --out never overwrites someone's data.
    """
    spec, out_dir = spec_for(size), Path(out_dir)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if is_up_to_date(size, out_dir, seed=seed):
        return out_dir
    _check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / STAMP_FILE).unlink(missing_ok=True)
    tokenizer_task = progress.add_task("training tokenizer", total=1) if progress else None
    tokenizer = train_tokenizer(read_corpus(), spec.vocab_size)
    write_bytes_atomically(out_dir / "tokenizer.json", tokenizer.to_str(pretty=True).encode("utf-8"))
    if progress:
        progress.advance(tokenizer_task)
    special_ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    write_weights(spec, seed, special_ids, out_dir / "model.safetensors", progress)
    for name, value in _json_files(spec, tokenizer).items():
        write_bytes_atomically(out_dir / name, json_bytes(value))
    stamp = {"recipe": recipe(spec, seed), "files": {name: file_sha256(out_dir / name) for name in MODEL_FILES}}
    write_bytes_atomically(out_dir / STAMP_FILE, json_bytes(stamp))
    return out_dir


def draw_weight(spec: ModelSpec, seed: int, index: int, name: str, shape: tuple[int, ...]):
    """Tensor `index` of `spec.weight_shapes()` as float32 numpy: ones for norms, else a scaled normal.

    Each tensor has its own PCG64 stream keyed by (seed, index), so any one can be redrawn alone.
    Output projections are scaled by 1/sqrt(2*num_layers) (GPT-2) so the residual stream stays led
    by the token embedding.
    """
    import numpy as np

    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    std = spec.embedding_std if name == "model.embed_tokens.weight" else spec.weight_std
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std /= (2 * spec.num_layers) ** 0.5
    values = np.random.default_rng([seed, index]).standard_normal(shape, dtype=np.float32)
    return values * np.float32(std)


def write_weights(spec: ModelSpec, seed: int, special_ids: list[int], path: Path,
                  progress: BuildProgress | None) -> None:
    """Draw every weight, round it to bfloat16 and write `path` as one safetensors file."""
    import torch
    from safetensors.torch import save_file

    shapes = spec.weight_shapes()
    task = progress.add_task("drawing weights", total=len(shapes)) if progress else None
    tensors = {}
    for index, (name, shape) in enumerate(shapes):
        tensors[name] = torch.from_numpy(draw_weight(spec, seed, index, name, shape)).to(torch.bfloat16)
        if progress:
            progress.advance(task)
    tensors["lm_head.weight"][special_ids] = 0
    tmp = _tmp_path(path)
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.chmod(0o644)  # safetensors creates files owner-only; workers may run as another user
    os.replace(tmp, path)


def _json_files(spec: ModelSpec, tokenizer) -> dict[str, dict]:
    bos_id, eos_id, eot_id = (tokenizer.token_to_id(t) for t in (BOS_TOKEN, EOS_TOKEN, EOT_TOKEN))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
        "torch_dtype": "bfloat16", "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "hidden_act": "silu", "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
        "initializer_range": spec.weight_std, "tie_word_embeddings": False, "use_cache": True,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": None,
    }
    return {
        "config.json": config,
        "generation_config.json": {"bos_token_id": bos_id, "eos_token_id": [eos_id, eot_id]},
        "tokenizer_config.json": tokenizer_config(tokenizer, spec.max_position_embeddings),
        "special_tokens_map.json": special_tokens_map(),
    }


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file: pass a new or empty directory")
    ours = (*MODEL_FILES, STAMP_FILE)
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in ours
                     and not (p.name.endswith(".tmp") and p.name.startswith(ours))) if out_dir.is_dir() else []
    if foreign:
        raise ValueError(
            f"--out {out_dir} already holds files that are not a pdserve checkpoint "
            f"({', '.join(foreign[:5])}): pass a new or empty directory"
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def json_bytes(value: object) -> bytes:
    """Canonical JSON: sorted keys, two-space indent, trailing newline."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Readers see either the old file or the whole new one, never a partial write."""
    tmp = _tmp_path(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _tmp_path(path: Path) -> Path:
    """A per-process temporary name beside `path`, so concurrent identical builds never collide."""
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")
