"""Do engines on different cores slow each other? The co-run stretch of a prompt and of a decode step.

A 1P+1D cluster on two cores runs two engines at once. Each engine's tables are measured alone, but
under load a prompt is computed while the other core decodes, and a decode step runs while the
other core computes a prompt. Two vCPUs can share more than memory: an L2 or L3, memory bandwidth,
or one physical core (SMT siblings sold as two vCPUs). On an AVX-512 EPYC a 2,000-token prompt took
1.04-1.07x its time alone beside the other core's decode (`bench/corun.py`); on a Xeon, none.

`measure_corun` starts two processes, each bound to one worker's cores with one colocated engine
of the profile's settings (prefix caching off), as a 1P+1D cluster binds its workers, each engine
core tracing its steps (`pdserve.engine_step_trace`): the "prompt" side computes prompts of
`CorunPlan.prompt_tokens`, the "decode" side holds a batch decoding. The prompt's time alone sizes
the windows (`corun_fit.window_s`); then a phase per decode batch (the decode side holds the batch
throughout, the prompt side alternates a window of prompts back to back and a window idle) and one
for the prompt (the prompt side throughout, the decode side alternating a held batch and idle).
Which steps ran beside the other engine and which alone, and the ratios, are read off the two
traces by `planner.profiler.corun_fit` (pure).

The two processes take commands over a Unix socket (one JSON object per line; vLLM owns their
stdout): {"do": "measure"} -> {"seconds": s}, the prompt alone; {"do": "loop", "batch": n} ->
{"looping": true} once under way; {"do": "alternate", "batch": n, "window_s": w} -> {"start_s": t},
the first window's start; either then until {"do": "stop"} -> {"stopped": true} once the side's
trace is flushed; {"do": "exit"}.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from pdserve.engine import EngineSettings, engine_start_env
from planner.profiler.corun_fit import CorunMeasure, CorunPlan, decode_corun, phase_cycles, prompt_corun, window_s

ROLES = ("prompt", "decode")
START_TIMEOUT_S = 600.0   # an engine start on the slowest host kind takes ~1 min; a hang is not that




class _Peer:
    """One side's end of the socket, one JSON object per line; `exit_code` polls its process (None
    while it runs)."""

    def __init__(self, role: str, conn: socket.socket, exit_code: Callable[[], int | None] = lambda: None) -> None:
        self.role, self.conn, self.exit_code = role, conn, exit_code
        self._buffer = b""

    def send(self, message: dict) -> None:
        self.conn.sendall(json.dumps(message).encode() + b"\n")

    def recv(self, timeout_s: float = START_TIMEOUT_S) -> dict:
        """The next message; raises if the process exits or nothing comes within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if (code := self.exit_code()) is not None:
                raise RuntimeError(f"the co-run probe's {self.role} engine exited ({code})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the co-run probe's {self.role} engine sent nothing in {timeout_s:.0f} s")
            ready, _, _ = select.select([self.conn], [], [], 0.5)
            if ready:
                chunk = self.conn.recv(65536)
                if not chunk:
                    raise RuntimeError(f"the co-run probe's {self.role} engine closed its connection")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, message: dict) -> dict:
        self.send(message)
        return self.recv()


def measure_corun(settings: EngineSettings, cores: tuple[str, str], plan: CorunPlan, advance) -> list[CorunMeasure]:
    """The phases of the module's doc: `settings` (any `cpu_cores` replaced) bound to `cores[0]`
    for the prompt side and `cores[1]` for the decode side, each engine core tracing its steps.
    `advance(label)` after each step of `CorunPlan.steps`. A phase with no cycle of steps both
    beside and alone (`corun_fit`) is said so and left out."""
    from dataclasses import replace

    from pdserve.engine_step_trace import STEP_TRACE_ENV

    with tempfile.TemporaryDirectory(prefix="pdserve-corun-") as tmp:
        address = str(Path(tmp) / "probe.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(2)
        server.settimeout(0.5)
        processes: dict[str, subprocess.Popen] = {}
        peers: dict[str, _Peer] = {}
        traces = {role: Path(tmp) / role for role in ROLES}
        try:
            for role, core in zip(ROLES, cores):
                side = replace(settings, cpu_cores=core, enable_prefix_caching=False)
                traces[role].mkdir()
                processes[role] = subprocess.Popen(
                    [sys.executable, "-m", "planner.profiler.corun_probe", "--role", role, "--address", address,
                     "--settings", json.dumps(asdict(side)), "--plan", json.dumps(asdict(plan))],
                    stdout=subprocess.DEVNULL, start_new_session=True,   # its group holds vLLM's engine core too
                    # the environment its engine's processes need (its own core's binding in place of the
                    # one this process's engines left, which libgomp, preloaded, would refuse): its
                    # engine core then forks, as a worker's does, instead of importing vLLM again; and
                    # the step trace, which its engine core writes
                    env=engine_start_env(side, os.environ) | {STEP_TRACE_ENV: str(traces[role])})
            peers = _accept(server, processes)
            for peer in peers.values():
                peer.recv()   # {"ready": dtype}: its engine is up and warmed
            prompt_alone_s = peers["prompt"].ask({"do": "measure"})["seconds"]
            window = window_s(prompt_alone_s)
            cycles = phase_cycles(plan, window)
            advance(f"co-run: two engines up on cores {cores[0]} and {cores[1]}; a {plan.prompt_tokens}-token "
                    f"prompt alone {prompt_alone_s * 1e3:.0f} ms, so {cycles} cycles of {window:.2f} s on, "
                    f"{window:.2f} s off a phase")
            measures = []
            for what, batch in plan.phases:
                start_s = _phase(peers, what, batch, window, cycles)
                steps = {role: _read_trace(traces[role]) for role in ROLES}
                try:
                    if what == "decode":
                        measure = decode_corun(steps["decode"], steps["prompt"], start_s, 2 * window, cycles, batch)
                        label = f"a decode step of {batch} beside prompts"
                    else:
                        measure = prompt_corun(steps["prompt"], steps["decode"], start_s, 2 * window, cycles, batch)
                        label = f"a {plan.prompt_tokens}-token prompt beside a batch of {batch} decoding"
                except ValueError as error:   # said, and the other phases still count
                    advance(f"co-run: not measured: {error}")
                    continue
                advance(f"co-run: {label} {measure.shown()}")
                measures.append(measure)
            for peer in peers.values():
                peer.send({"do": "exit"})
            for process in processes.values():
                process.wait(timeout=120)
            return measures
        finally:
            server.close()
            for process in processes.values():
                try:
                    os.killpg(process.pid, signal.SIGKILL)   # what is left of its group after a failure
                except ProcessLookupError:
                    pass
                process.wait()


def _phase(peers: dict[str, _Peer], what: str, batch: int, window: float, cycles: int) -> float:
    """One phase: the side measured (`what`) works throughout, the other alternates `window` of work
    and `window` idle for `cycles` cycles; returns when the cycles started (monotonic seconds, the
    clock both traces keep). Each side's trace is flushed when it stops."""
    busy, alternating = (peers["decode"], peers["prompt"]) if what == "decode" else (peers["prompt"], peers["decode"])
    busy.ask({"do": "loop", "batch": batch})
    started = False
    try:
        start_s = alternating.ask({"do": "alternate", "window_s": window, "batch": batch})["start_s"]
        started = True
        time.sleep(max(0.0, start_s + 2 * window * cycles - time.monotonic()))
    finally:
        for peer in ((alternating, busy) if started else (busy,)):
            peer.ask({"do": "stop"})
    return start_s


def _read_trace(directory: Path) -> list:
    from pdserve.engine_step_trace import read_steps

    return [step for path in sorted(directory.glob("steps-*.csv")) for step in read_steps(path)]


def _accept(server: socket.socket, processes: dict[str, subprocess.Popen]) -> dict[str, _Peer]:
    peers: dict[str, _Peer] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(peers) < len(processes):
        failed = [role for role, p in processes.items() if p.poll() is not None]
        if failed:
            raise RuntimeError(f"the co-run probe's {', '.join(failed)} engine exited before it connected")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the co-run probe's engines did not connect in {START_TIMEOUT_S:.0f} s")
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        conn.setblocking(True)
        peer = _Peer("new", conn, _processes_alive(processes))
        peer.role = peer.recv()["role"]
        peer.exit_code = processes[peer.role].poll
        peers[peer.role] = peer
    return peers


def _processes_alive(processes: dict[str, subprocess.Popen]) -> Callable[[], int | None]:
    """Before a connection has said whose it is: the exit code of any of `processes` that exited."""
    return lambda: next((p.returncode for p in processes.values() if p.poll() is not None), None)


async def _serve(role: str, settings: EngineSettings, plan: CorunPlan, address: str) -> None:
    """One side: its engine, then the orchestrator's commands until "exit"."""
    import gc

    from pdserve.engine import start_engine
    from planner.profiler.engine_probe import EngineProbe

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)
    peer = _Peer(role, conn)
    peer.send({"role": role})
    engine = start_engine(settings, "colocated", fork_safe=True)   # nothing here has run OpenMP yet
    try:
        probe = EngineProbe(engine, int(engine.vllm_config.model_config.get_vocab_size()), seed=ROLES.index(role))
        await probe.warm_up()
        if role == "prompt":
            await probe.prefill_s(plan.prompt_tokens, 1)   # the measured shape warmed too
        else:
            await probe.decode(plan.prompt_batch, plan.hold_context_tokens, 8)
        peer.send({"ready": settings.dtype})
        while True:
            command = peer.recv(timeout_s=float("inf"))
            if command["do"] == "measure":
                peer.send({"seconds": await probe.prefill_s(plan.prompt_tokens, plan.repeats)})
            elif command["do"] in ("loop", "alternate"):
                await (_loop(role, probe, plan, peer, command["batch"]) if command["do"] == "loop" else
                       _alternate(role, probe, plan, peer, command["batch"], command["window_s"]))
                peer.recv()   # {"do": "stop"}
                await probe.prefill_s(8, 1)   # a step with nothing after it: the trace is flushed
                peer.send({"stopped": True})
            else:
                break
    finally:
        conn.close()
        engine.shutdown()
        del engine
        gc.collect()


async def _until_readable(conn: socket.socket, work) -> None:
    """Runs `work` (a coroutine or task) until a line arrives on `conn` (read by the caller), then
    cancels it (a cancelled request is aborted by the engine)."""
    task = asyncio.ensure_future(work)
    try:
        while not select.select([conn], [], [], 0)[0]:
            if task.done():
                task.result()   # it failed: say so rather than wait for "stop"
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _work(role: str, probe, plan: CorunPlan, batch: int, until_s: float = math.inf) -> None:
    """The side's own work until `until_s` (monotonic) or cancelled: prompts back to back (none
    started after `until_s`), or `batch` requests held decoding."""
    if role == "prompt":
        while time.monotonic() < until_s:
            await probe.prefill_s(plan.prompt_tokens, 1)
        return
    hold = asyncio.ensure_future(probe.hold_decoding(batch, plan.hold_context_tokens, plan.hold_tokens,
                                                     asyncio.Event(), [0]))
    try:
        await asyncio.wait_for(asyncio.shield(hold), None if until_s == math.inf else max(0.0, until_s - time.monotonic()))
    except asyncio.TimeoutError:
        pass
    finally:
        hold.cancel()
        await asyncio.gather(hold, return_exceptions=True)


async def _loop(role: str, probe, plan: CorunPlan, peer: _Peer, batch: int) -> None:
    """The side's own work throughout, until "stop": answers {"looping": true} once it is under way
    (a prompt computed, or the batch past its prefill)."""
    if role == "prompt":
        await probe.prefill_s(plan.prompt_tokens, 1)
        peer.send({"looping": True})
        await _until_readable(peer.conn, _work(role, probe, plan, batch))
        return
    decoding = asyncio.Event()
    hold = asyncio.ensure_future(probe.hold_decoding(batch, plan.hold_context_tokens, plan.hold_tokens,
                                                     decoding, [0]))
    waiting = asyncio.ensure_future(decoding.wait())
    await asyncio.wait([hold, waiting], return_when=asyncio.FIRST_COMPLETED)
    if hold.done():   # it failed before the batch decoded
        waiting.cancel()
        hold.result()
    peer.send({"looping": True})
    await _until_readable(peer.conn, hold)


async def _alternate(role: str, probe, plan: CorunPlan, peer: _Peer, batch: int, window: float) -> None:
    """`window` seconds of the side's own work, then `window` idle, from a start it answers at once
    ({"start_s": monotonic seconds}) until "stop": every window starts on schedule, whatever the
    one before overran."""
    start_s = time.monotonic() + 0.05
    peer.send({"start_s": start_s})

    async def cycles() -> None:
        k = 0
        while True:
            on_s = start_s + 2 * window * k
            await asyncio.sleep(max(0.0, on_s - time.monotonic()))
            await _work(role, probe, plan, batch, until_s=on_s + window)
            k += 1

    await _until_readable(peer.conn, cycles())


def main(argv: list[str] | None = None) -> int:
    """A side's process (started by `measure_corun`, not by hand)."""
    import argparse

    from pdserve.cpu_placement import bind_this_process

    parser = argparse.ArgumentParser(description="One engine of the co-run probe (started by measure_corun).")
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--address", required=True, help="the orchestrator's Unix socket")
    parser.add_argument("--settings", required=True, help="the engine's EngineSettings as JSON")
    parser.add_argument("--plan", required=True, help="the CorunPlan as JSON")
    args = parser.parse_args(argv)
    data = json.loads(args.settings)
    settings = EngineSettings(**(data | {"preload": tuple(data.get("preload", ()))}))
    bind_this_process(settings.cpu_cores)   # as a worker binds itself, before vLLM starts its processes
    plan = json.loads(args.plan)
    plan["decode_batches"] = tuple(plan["decode_batches"])
    asyncio.run(_serve(args.role, settings, CorunPlan(**plan), args.address))
    return 0


if __name__ == "__main__":
    from pdserve.process_exit import exit_without_teardown

    exit_without_teardown(main())   # its engine stopped: the orchestrator need not wait out vLLM's teardown
