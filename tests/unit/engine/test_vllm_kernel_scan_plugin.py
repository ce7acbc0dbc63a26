"""pdserve's vLLM plugin keeps vLLM's kernel-rebinding scan alive in a forked engine core
(`pdserve.vllm_plugin`, "Forked engine cores"): vLLM's own scan, a module holding an object whose
`__dict__` is not a mapping, as llvmlite's `binding.ffi.lib` is."""

from __future__ import annotations

import sys
import types

import pytest

from pdserve import vllm_plugin


class LibraryWrapper:
    """As llvmlite's `_lib_wrapper`: no instance dict, and every missing attribute is a symbol."""
    __slots__ = ()

    def __getattr__(self, name):
        return lambda *args: None


@pytest.fixture
def dispatcher_with_a_foreign_module(monkeypatch):
    from vllm.triton_utils import dispatcher

    monkeypatch.delattr(dispatcher, "vars", raising=False)   # vLLM's own: the builtin
    module = types.ModuleType("pdserve_test_foreign_library")
    module.lib = LibraryWrapper()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return dispatcher   # monkeypatch puts back whatever `vars` the dispatcher had


def test_vllms_scan_dies_on_such_a_module_and_survives_it_with_the_plugin(dispatcher_with_a_foreign_module):
    dispatcher = dispatcher_with_a_foreign_module
    with pytest.raises(AttributeError, match="has no attribute 'get'"):
        dispatcher._rebind_kernels([])
    vllm_plugin.tolerate_non_mapping_namespaces()
    dispatcher._rebind_kernels([])


def test_the_scan_still_rebinds_a_kernel_an_object_holds(monkeypatch):
    original, wrapper = object(), object()
    holder = types.SimpleNamespace(kernel=original)
    from vllm.triton_utils import dispatcher

    module = types.ModuleType("pdserve_test_kernel_holder")
    module.holder, module.copy = holder, original
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(dispatcher, "vars", vllm_plugin.mapping_vars, raising=False)
    dispatcher._rebind_kernels([(original, wrapper)])
    assert holder.kernel is wrapper and module.copy is wrapper


def test_mapping_vars_reads_a_non_mapping_namespace_as_empty():
    assert vllm_plugin.mapping_vars(LibraryWrapper()) == {}
    assert vllm_plugin.mapping_vars(types.SimpleNamespace(a=1)) == {"a": 1}
