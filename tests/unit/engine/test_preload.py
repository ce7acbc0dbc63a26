"""Which libraries a worker preloads into vLLM's processes, found where the registries put them."""

from __future__ import annotations

import os

from pdserve.preload import Preload, find_preload, loaded_libraries


def _touch(folder, name):
    (folder / name).write_bytes(b"")
    return str(folder / name)


def test_both_libraries_are_found_and_tcmalloc_goes_first(tmp_path):
    venv_lib, system_lib = tmp_path / "venv-lib", tmp_path / "usr-lib"
    venv_lib.mkdir(), system_lib.mkdir()
    iomp = _touch(venv_lib, "libiomp5.so")
    tcmalloc = _touch(system_lib, "libtcmalloc_minimal.so.4")
    preload = find_preload(search_dirs=(str(venv_lib), str(system_lib)), machine="x86_64")
    assert preload == Preload((tcmalloc, iomp), {})
    assert preload.summary() == "preloading libtcmalloc_minimal.so.4, libiomp5.so into vLLM's processes"


def test_a_missing_library_is_skipped_with_how_to_get_it(tmp_path):
    iomp = _touch(tmp_path, "libiomp5.so")
    preload = find_preload(search_dirs=(str(tmp_path),), machine="x86_64")
    assert preload.paths == (iomp,)
    assert preload.summary().endswith("skipped: tcmalloc not found (apt-get install libtcmalloc-minimal4)")


def test_intel_openmp_is_x86_only(tmp_path):
    _touch(tmp_path, "libiomp5.so")
    tcmalloc = _touch(tmp_path, "libtcmalloc.so.4")
    assert find_preload(search_dirs=(str(tmp_path),), machine="aarch64") == Preload((tcmalloc,), {})


def test_the_environment_keeps_what_was_preloaded_already_once():
    preload = Preload(("/l/libtcmalloc_minimal.so.4", "/v/libiomp5.so"))
    env = preload.env({"LD_PRELOAD": "/x/libfoo.so /v/libiomp5.so", "HOME": "/h"})
    assert env == {"LD_PRELOAD": "/l/libtcmalloc_minimal.so.4:/v/libiomp5.so:/x/libfoo.so", "HOME": "/h"}
    assert Preload().env({"HOME": "/h"}) == {"HOME": "/h"}


def test_loaded_libraries_reads_this_process_maps():
    assert any(name.startswith("libc.so") or name.startswith("libc-") for name in loaded_libraries(os.getpid()))


def test_the_default_preload_is_the_measured_choice_and_unknown_names_are_refused(tmp_path):
    import pytest

    from pdserve.engine import EngineSettings
    from pdserve.preload import DEFAULT_LIBRARIES

    _touch(tmp_path, "libiomp5.so")
    tcmalloc = _touch(tmp_path, "libtcmalloc_minimal.so.4")
    assert DEFAULT_LIBRARIES == ("tcmalloc",) and EngineSettings(model="/m").preload == ("tcmalloc",)
    assert find_preload(search_dirs=(str(tmp_path),), machine="x86_64", names=DEFAULT_LIBRARIES) == \
        Preload((tcmalloc,), {})
    with pytest.raises(ValueError, match="cannot preload jemalloc: choose among tcmalloc, iomp5"):
        EngineSettings(model="/m", preload=("jemalloc",))
