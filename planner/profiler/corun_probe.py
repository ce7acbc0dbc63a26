"""Do engines on different cores slow each other? The co-run stretch of a prompt and of a decode step.

A 1P+1D cluster on two cores runs two engines at once. Each engine's tables are measured alone, but
under load a prompt is computed while the other core decodes, and a decode step runs while the
other core computes a prompt. Two vCPUs can share more than memory: an L2 or L3, memory bandwidth,
or one physical core (SMT siblings sold as two vCPUs). On an AVX-512 EPYC a 2,000-token prompt took
1.04-1.07x its time alone beside the other core's decode (`bench/corun.py`); on a Xeon, none.

`measure_corun` starts two processes, each bound to one worker's cores with one colocated engine
of the profile's settings (prefix caching off), as a 1P+1D cluster binds its workers: the "prompt"
side computes prompts of `CorunPlan.prompt_tokens`, the "decode" side decodes `batch` requests of
`context_tokens`. Per round, in this order:
  1. the prompt alone (the other engine idle): median of `repeats` prefills;
  2. the decode alone: one run's step (`EngineProbe.decode`);
  3. the decode side keeps a batch decoding; once it is past its prefill, the prompt is measured again;
  4. the prompt side computes prompts back to back; after the first, the decode is measured again;
  5. the prompt alone and the decode alone once more.
How each round is judged and turned into the profile's two ratios is `planner.profiler.corun_fit`'s
(pure).

The two processes take commands over a Unix socket (one JSON object per line; vLLM owns their
stdout): {"do": "measure"} -> {"seconds": s}; {"do": "loop"} -> {"looping": true} after the first
iteration, then iterations until {"do": "stop"} -> {"stopped": n}; {"do": "exit"}.
"""

from __future__ import annotations

import asyncio
import json
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
from planner.profiler.corun_fit import CorunPlan, CorunRound, more_rounds_needed, steady_round

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


def measure_corun(settings: EngineSettings, cores: tuple[str, str], plan: CorunPlan, advance) -> list[CorunRound]:
    """The rounds of the module's doc: `settings` (any `cpu_cores` replaced) bound to `cores[0]`
    for the prompt side and `cores[1]` for the decode side. `advance(label)` after each step."""
    from dataclasses import replace

    with tempfile.TemporaryDirectory(prefix="pdserve-corun-") as tmp:
        address = str(Path(tmp) / "probe.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(2)
        server.settimeout(0.5)
        processes: dict[str, subprocess.Popen] = {}
        peers: dict[str, _Peer] = {}
        try:
            for role, core in zip(ROLES, cores):
                side = replace(settings, cpu_cores=core, enable_prefix_caching=False)
                processes[role] = subprocess.Popen(
                    [sys.executable, "-m", "planner.profiler.corun_probe", "--role", role, "--address", address,
                     "--settings", json.dumps(asdict(side)), "--plan", json.dumps(asdict(plan))],
                    stdout=subprocess.DEVNULL, start_new_session=True,   # its group holds vLLM's engine core too
                    # the environment its engine's processes need (its own core's binding in place of the
                    # one this process's engines left, which libgomp, preloaded, would refuse): its
                    # engine core then forks, as a worker's does, instead of importing vLLM again
                    env=engine_start_env(side, os.environ))
            peers = _accept(server, processes)
            for peer in peers.values():
                peer.recv()   # {"ready": dtype}: its engine is up and warmed
            advance(f"co-run: two engines up on cores {cores[0]} and {cores[1]}")
            rounds: list[CorunRound] = []
            while not rounds or more_rounds_needed(rounds, plan.rounds, plan.max_rounds):
                rounds.append(_round(peers, len(rounds), plan.rounds, advance))
            for peer in peers.values():
                peer.send({"do": "exit"})
            for process in processes.values():
                process.wait(timeout=120)
            return rounds
        finally:
            server.close()
            for process in processes.values():
                try:
                    os.killpg(process.pid, signal.SIGKILL)   # what is left of its group after a failure
                except ProcessLookupError:
                    pass
                process.wait()


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


def _round(peers: dict[str, _Peer], n: int, rounds: int, advance) -> CorunRound:
    prompt, decode = peers["prompt"], peers["decode"]
    label = f"co-run round {n + 1}/{rounds}" if n < rounds else f"co-run round {n + 1} (one more: a round drifted)"
    prompt_alone = prompt.ask({"do": "measure"})["seconds"]
    advance(f"{label}: prompt alone {prompt_alone * 1e3:.0f} ms")
    step_alone = decode.ask({"do": "measure"})["seconds"]
    advance(f"{label}: decode step alone {step_alone * 1e3:.1f} ms")
    prompt_together, tokens = _beside(prompt, decode)
    advance(f"{label}: prompt beside decode {prompt_together * 1e3:.0f} ms "
            f"({prompt_together / prompt_alone:.3f}x)")
    step_together, prompts = _beside(decode, prompt)
    advance(f"{label}: decode step beside prompts {step_together * 1e3:.1f} ms "
            f"({step_together / step_alone:.3f}x)")
    prompt_after = prompt.ask({"do": "measure"})["seconds"]
    advance(f"{label}: prompt alone again {prompt_after * 1e3:.0f} ms")
    step_after = decode.ask({"do": "measure"})["seconds"]
    measured = CorunRound(prompt_alone, prompt_together, step_alone, step_together, tokens, prompts,
                          prompt_after, step_after)
    advance(f"{label}: decode step alone again {step_after * 1e3:.1f} ms"
            + ("" if steady_round(measured) else " (the host's speed moved within the round: not counted)"))
    return measured


def _beside(measured: _Peer, busy: _Peer) -> tuple[float, int]:
    """`measured`'s measurement while `busy` loops its own work, and what `busy` got done meanwhile."""
    busy.ask({"do": "loop"})
    stopped = False
    try:
        seconds = measured.ask({"do": "measure"})["seconds"]
        iterations = busy.ask({"do": "stop"})["stopped"]
        stopped = True
        return seconds, iterations
    finally:
        if not stopped:
            busy.send({"do": "stop"})


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

        async def measure() -> float:
            if role == "prompt":
                return await probe.prefill_s(plan.prompt_tokens, plan.repeats)
            return (await probe.decode(plan.batch, plan.context_tokens, plan.decode_steps)).step_s

        await measure()   # the measured shapes warmed too
        peer.send({"ready": settings.dtype})
        while True:
            command = peer.recv(timeout_s=float("inf"))["do"]
            if command == "measure":
                peer.send({"seconds": await measure()})
            elif command == "loop":
                done = await _loop(role, probe, plan, peer)
                peer.recv()   # {"do": "stop"}
                peer.send({"stopped": done})
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
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _loop(role: str, probe, plan: CorunPlan, peer: _Peer) -> int:
    """The side's own work until "stop": prompts back to back, or a batch held decoding. Answers
    {"looping": true} once it is under way (a prompt computed, the batch past its prefill); returns
    what it finished after that answer: prompts computed, or tokens the batch's slowest request
    decoded (a prompt cut off by "stop" is not counted)."""
    if role == "prompt":
        computed = 0

        async def prompts() -> None:
            nonlocal computed
            while True:
                await probe.prefill_s(plan.prompt_tokens, 1)
                computed += 1

        await probe.prefill_s(plan.prompt_tokens, 1)
        peer.send({"looping": True})
        await _until_readable(peer.conn, prompts())
        return computed
    decoding, tokens = asyncio.Event(), [0]
    hold = asyncio.ensure_future(probe.hold_decoding(plan.batch, plan.hold_context_tokens, plan.hold_tokens,
                                                     decoding, tokens))
    waiting = asyncio.ensure_future(decoding.wait())
    await asyncio.wait([hold, waiting], return_when=asyncio.FIRST_COMPLETED)
    if hold.done():   # it failed before the batch decoded
        waiting.cancel()
        hold.result()
    peer.send({"looping": True})
    decoded_before = tokens[0]
    await _until_readable(peer.conn, hold)
    return tokens[0] - decoded_before


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
    asyncio.run(_serve(args.role, settings, CorunPlan(**json.loads(args.plan)), args.address))
    return 0


if __name__ == "__main__":
    from pdserve.process_exit import exit_without_teardown

    exit_without_teardown(main())   # its engine stopped: the orchestrator need not wait out vLLM's teardown
