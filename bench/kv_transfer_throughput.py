"""KV transfer throughput of pdserve's transports against the raw transport and memcpy. Run `--help`."""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch
import torch.distributed as dist

from kv_transfer.consumer import PullClient
from kv_transfer.layout import KVLayout
from kv_transfer.leases import Lease, LeaseTable
from kv_transfer.producer import TransferServer
from kv_transfer.sockets import recv_into_exactly, recvmsg_into_all, sendmsg_all, tune_bulk
from kv_transfer.wire import TransferError
from pdserve.make_model import spec_for

DESCRIPTION = """\
Moves the KV cache of one prompt of the `bench` model (12 layers, 4 KV heads, head_dim 64, bf16,
block 32: 384 KiB per block) from a producer process pinned to core 0 into a consumer process
pinned to core 1, as a prefill and a decode worker do, and times each way of moving the same bytes:

  pdserve tcp     PullClient -> TransferServer, transport `tcp` (what a decode worker runs)
  pdserve torch   the same, transport `torch` (gloo on CPU; the same code runs nccl on CUDA)
  raw socket      one contiguous buffer, one blocking sendall / recv_into(MSG_WAITALL) on a TCP
                  socket set up as pdserve's (TCP_NODELAY, cubic congestion control): the
                  reference for `pdserve tcp`
  raw socket xL   the same bytes in L = 12 parts spread like layers over a buffer, moved with
                  pdserve's own socket I/O (kv_transfer.sockets): `pdserve tcp` minus its protocol
  raw socket, host defaults   as `raw socket`, with the host's socket defaults (and TCP_NODELAY)
  raw gloo        one contiguous buffer, ProcessGroupGloo send / recv on a two-rank group
  raw gloo xL     the same L parts as one message each, all posted at once, each side waiting for
                  its messages in order: the naive way to move a prompt per layer with gloo
  memcpy          ctypes.memmove of the same bytes inside one process (a shared-memory bound)

Every pull is a request (PULL message, or a 16-byte request for the raw ways) followed by the
bytes, timed by the consumer from the request to the last byte written (for pdserve, to its DONE
sent; the pulls do not release the lease, so one lease serves every repeat). The caches use
vLLM-CPU's layout: each layer is [num_blocks, kv_heads, block_size, 2*head_dim] in one shared
buffer, so a prompt's blocks are 12 runs of contiguous bytes (one per layer). Methods are
interleaved within every repeat so host noise hits them alike, and before each transfer the
consumer writes 256 MiB of scratch so no method finds its bytes in the shared last-level cache;
the report uses medians and shows the interquartile range.
"""

EVICTION_BYTES = 256 << 20  # well above any last-level cache of a host this runs on


@dataclass(frozen=True)
class Geometry:
    num_layers: int
    kv_heads: int
    head_dim: int
    block_size: int = 32

    @property
    def bytes_per_block(self) -> int:
        return self.num_layers * self.kv_heads * self.block_size * 2 * self.head_dim * 2  # K and V, bf16

    def caches(self, num_blocks: int, seed: int) -> dict[str, torch.Tensor]:
        """Per-layer views of one shared buffer, shaped as vLLM-CPU's cache."""
        shape = (num_blocks, self.kv_heads, self.block_size, 2 * self.head_dim)
        per_layer = torch.Size(shape).numel()
        buffer = torch.empty(self.num_layers * per_layer, dtype=torch.bfloat16)
        buffer.view(torch.int16).random_(generator=torch.Generator().manual_seed(seed))
        return {f"model.layers.{i}.self_attn.attn": buffer[i * per_layer:(i + 1) * per_layer].view(shape)
                for i in range(self.num_layers)}


def bench_geometry() -> Geometry:
    spec = spec_for("bench")
    return Geometry(spec.num_layers, spec.num_kv_heads, spec.hidden_size // spec.num_attention_heads)


# ---- the producer process (core 0) -------------------------------------------------------------
def producer_main(geometry: Geometry, num_blocks: int, max_bytes: int, conn) -> None:
    _pin(0)
    caches = geometry.caches(num_blocks, seed=1)
    layout = KVLayout(caches, num_blocks)
    leases = LeaseTable()
    server = TransferServer(layout, layout.compat("bench", geometry.block_size), leases, "127.0.0.1", 0)
    raw = torch.empty(max_bytes, dtype=torch.uint8).random_()
    listeners = {name: socket.create_server(("127.0.0.1", 0)) for name in ("raw", "raw_default")}
    for name, listener in listeners.items():
        threading.Thread(target=_serve_raw_socket, args=(listener, raw, name == "raw"), daemon=True).start()
    store = dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=timedelta(seconds=60),
                          wait_for_workers=False)
    gloo = threading.Thread(target=_serve_raw_gloo, args=(store, raw))  # until a 0-byte request
    gloo.start()
    conn.send({"kv": f"127.0.0.1:{server.start()}", "store": store.port,
               **{name: listener.getsockname()[1] for name, listener in listeners.items()}})
    for transfer_id, count in iter(conn.recv, None):  # one lease per prompt size, pulled many times
        leases.grant(Lease(transfer_id, transfer_id, tuple(range(count)), count * geometry.block_size,
                           time.monotonic() + 3600))
        conn.send("granted")
    gloo.join()
    server.stop()


def _raw(sock: socket.socket, tuned: bool) -> socket.socket:
    """Tuned: the settings pdserve gives its own sockets (`kv_transfer.sockets.tune_bulk`: no Nagle,
    congestion control), so the raw way differs only in having no protocol around the bytes.
    Otherwise the host's defaults, with TCP_NODELAY."""
    if tuned:
        tune_bulk(sock)
    else:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _serve_raw_socket(listener: socket.socket, raw: torch.Tensor, tuned: bool) -> None:
    """Answers (nbytes, parts) requests: one sendall, or one sendmsg of `parts` spread parts."""
    sock, _ = listener.accept()
    _raw(sock, tuned)
    payload = memoryview(raw.numpy()).cast("B")
    header = bytearray(16)
    while True:
        try:
            recv_into_exactly(sock, memoryview(header))
        except (TransferError, OSError):
            return  # the consumer is done
        nbytes, parts = struct.unpack("!QQ", header)
        if parts == 1:
            sock.sendall(payload[:nbytes])
        else:
            sendmsg_all(sock, [memoryview(part.numpy()) for part in _split(raw, nbytes, parts)], 60.0)


def _serve_raw_gloo(store, raw: torch.Tensor) -> None:
    """Answers (nbytes, messages) requests: `messages` sends splitting nbytes, posted at once."""
    group = _gloo_group(store, rank=0)
    request = torch.zeros(2, dtype=torch.int64)
    while True:
        group.recv([request], 1, 0).wait()
        nbytes, messages = (int(v) for v in request)
        if nbytes == 0:
            return
        for work in [group.send([part], 1, 1 + tag) for tag, part in enumerate(_split(raw, nbytes, messages))]:
            work.wait()


def _split(buffer: torch.Tensor, nbytes: int, messages: int) -> list[torch.Tensor]:
    """`messages` equal parts of `nbytes`, spread over `buffer` as layers are over a cache."""
    part, stride = nbytes // messages, buffer.numel() // messages
    return [buffer[i * stride: i * stride + part] for i in range(messages)]


def _gloo_group(store, rank: int):
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=60)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore("raw", store), rank, 2, options)


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and core < os.cpu_count():
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)


# ---- the consumer (this process, core 1) -------------------------------------------------------
class Consumer:
    """Every way of receiving `num_blocks` blocks, each a callable returning seconds."""

    def __init__(self, geometry: Geometry, num_blocks: int, max_bytes: int, endpoints: dict):
        self.geometry = geometry
        caches = geometry.caches(num_blocks, seed=2)
        self.layout = KVLayout(caches, num_blocks)
        compat = self.layout.compat("bench", geometry.block_size)
        self.kv_address = endpoints["kv"]
        self.pull_clients = {name: PullClient(self.layout, compat, name) for name in ("tcp", "torch")}
        self.raw_socks = {tuned: _raw(socket.create_connection(("127.0.0.1", endpoints[name])), tuned)
                          for tuned, name in ((True, "raw"), (False, "raw_default"))}
        self.raw_target = torch.empty(max_bytes, dtype=torch.uint8)
        store = dist.TCPStore("127.0.0.1", endpoints["store"], world_size=2, is_master=False,
                              timeout=timedelta(seconds=60))
        self.gloo = _gloo_group(store, rank=1)
        self.memcpy_source = torch.empty(max_bytes, dtype=torch.uint8).random_()
        self._scratch = torch.zeros(EVICTION_BYTES, dtype=torch.uint8)

    def evict_caches(self) -> None:
        """Writes a buffer larger than this host's last-level cache, so no method starts with its
        bytes cache-hot because the method before it touched the same memory (the raw ways share
        their buffers; a prefill engine's KV is never hot in the decode engine's cache either)."""
        self._scratch.add_(1)

    def methods(self, transfer_id: str, num_blocks: int) -> dict:
        local = list(range(num_blocks, 2 * num_blocks))  # other blocks than the producer's, as in life
        nbytes = num_blocks * self.geometry.bytes_per_block
        remote = list(range(num_blocks))
        return {
            "pdserve tcp": lambda: self._pull("tcp", transfer_id, remote, local),
            "pdserve torch": lambda: self._pull("torch", transfer_id, remote, local),
            "raw socket": lambda: self._raw_socket(nbytes, 1),
            f"raw socket x{self.geometry.num_layers}": lambda: self._raw_socket(nbytes, self.geometry.num_layers),
            "raw socket, host defaults": lambda: self._raw_socket(nbytes, 1, tuned=False),
            "raw gloo": lambda: self._raw_gloo(nbytes, 1),
            f"raw gloo x{self.geometry.num_layers}": lambda: self._raw_gloo(nbytes, self.geometry.num_layers),
            "memcpy": lambda: self._memcpy(nbytes),
        }

    def _pull(self, transport: str, transfer_id: str, remote: list[int], local: list[int]) -> float:
        """One pull as a decode worker runs it, minus the release (the lease serves every repeat)."""
        return self.pull_clients[transport].pull(self.kv_address, transfer_id, remote, local).seconds

    def _raw_socket(self, nbytes: int, parts: int, tuned: bool = True) -> float:
        sock = self.raw_socks[tuned]
        started = time.perf_counter()
        sock.sendall(struct.pack("!QQ", nbytes, parts))
        if parts == 1:
            recv_into_exactly(sock, memoryview(self.raw_target.numpy()).cast("B")[:nbytes])
        else:
            recvmsg_into_all(sock, [memoryview(p.numpy()) for p in _split(self.raw_target, nbytes, parts)])
        return time.perf_counter() - started

    def _raw_gloo(self, nbytes: int, messages: int) -> float:
        started = time.perf_counter()
        self.gloo.send([torch.tensor([nbytes, messages], dtype=torch.int64)], 0, 0).wait()
        parts = _split(self.raw_target, nbytes, messages)
        for work in [self.gloo.recv([part], 0, 1 + tag) for tag, part in enumerate(parts)]:
            work.wait()
        return time.perf_counter() - started

    def _memcpy(self, nbytes: int) -> float:
        started = time.perf_counter()
        ctypes.memmove(self.raw_target.data_ptr(), self.memcpy_source.data_ptr(), nbytes)
        return time.perf_counter() - started

    def close(self) -> None:
        self.gloo.send([torch.zeros(2, dtype=torch.int64)], 0, 0).wait()
        for client in self.pull_clients.values():
            client.close()
        for sock in self.raw_socks.values():
            sock.close()


@dataclass
class Row:
    prompt_tokens: int
    num_bytes: int
    method: str
    median_s: float
    gb_per_s: float
    seconds: list[float]


def measure(prompt_tokens: list[int], repeats: int) -> list[Row]:
    from rich.progress import Progress

    geometry = bench_geometry()
    counts = {n: -(-n // geometry.block_size) for n in prompt_tokens}
    num_blocks = 2 * max(counts.values())
    max_bytes = max(counts.values()) * geometry.bytes_per_block
    parent, child = mp.get_context("spawn").Pipe()
    producer = mp.get_context("spawn").Process(target=producer_main, args=(geometry, num_blocks, max_bytes, child),
                                               daemon=True)
    producer.start()
    _pin(1 if os.cpu_count() > 1 else 0)
    consumer = Consumer(geometry, num_blocks, max_bytes, parent.recv())
    for tokens, count in counts.items():
        parent.send((f"prompt-{tokens}", count))
        parent.recv()
    samples: dict[tuple[int, str], list[float]] = {}
    with Progress() as progress:
        task = progress.add_task("transfers", total=repeats * len(counts))
        for repeat in range(repeats + 1):  # the first round warms connections and caches up
            for tokens, count in counts.items():
                for method, run in consumer.methods(f"prompt-{tokens}", count).items():
                    consumer.evict_caches()
                    seconds = run()
                    if repeat:
                        samples.setdefault((tokens, method), []).append(seconds)
                if repeat:
                    progress.advance(task)
    consumer.close()
    parent.send(None)
    producer.join(timeout=30)
    rows = []
    for (tokens, method), seconds in samples.items():
        nbytes = counts[tokens] * geometry.bytes_per_block
        median = statistics.median(seconds)
        rows.append(Row(tokens, nbytes, method, median, nbytes / median / 1e9, seconds))
    return rows


def report(rows: list[Row], out: Path) -> str:
    by = {(r.prompt_tokens, r.method): r for r in rows}
    lines = ["| prompt | bytes | method | median ms | p25-p75 ms | GB/s | vs raw socket | vs raw gloo | vs memcpy |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        ratio = lambda other: f"{by[(row.prompt_tokens, other)].median_s / row.median_s:.2f}"  # noqa: E731
        ordered = sorted(row.seconds)
        spread = f"{ordered[len(ordered) // 4] * 1000:.2f}-{ordered[(3 * len(ordered)) // 4] * 1000:.2f}"
        lines.append(f"| {row.prompt_tokens} | {row.num_bytes / 2**20:.0f} MiB | {row.method} | "
                     f"{row.median_s * 1000:.2f} | {spread} | {row.gb_per_s:.2f} | {ratio('raw socket')} | "
                     f"{ratio('raw gloo')} | {ratio('memcpy')} |")
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kv_transfer_throughput.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    (out / "kv_transfer_throughput.md").write_text(table + "\n")
    _plot(rows, out / "kv_transfer_throughput.png")
    return table


def _plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.prompt_tokens for r in rows})
    methods = list(dict.fromkeys(r.method for r in rows))
    by = {(r.prompt_tokens, r.method): r for r in rows}
    figure, axes = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        xs = [j + i * width for j in range(len(sizes))]
        axes.bar(xs, [by[(s, method)].gb_per_s for s in sizes], width, label=method)
    axes.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))])
    axes.set_xticklabels([f"{s}-token prompt\n({by[(s, methods[0])].num_bytes / 2**20:.0f} MiB)" for s in sizes])
    axes.set_ylabel("GB/s (median)")
    axes.set_title("KV transfer, bench model, producer core 0 -> consumer core 1")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[1024, 8192],
                        help="prompt lengths whose KV is moved (default: 1024 8192)")
    parser.add_argument("--repeats", type=int, default=100,
                        help="timed transfers per method and size (default: 100, about 35 s)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results",
                        help="folder for kv_transfer_throughput.{json,md,png}")
    args = parser.parse_args(argv)
    rows = measure(args.prompt_tokens, args.repeats)
    print(report(rows, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
