"""KV transfer throughput of pdserve's transports against the raw transport and memcpy. Run `--help`.

The pair, the methods and the summary live in `kv_transfer.throughput`; this script picks the
`bench` model's geometry, runs it and writes the results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.progress import Progress

from kv_transfer.geometry import BlockGeometry
from kv_transfer.throughput.measure import measure
from kv_transfer.throughput.report import markdown_table, plot, rows_json
from pdserve.make_model import spec_for

REPO = Path(__file__).resolve().parents[1]

DESCRIPTION = """\
Moves the KV cache of one prompt of the `bench` model (12 layers, 4 KV heads, head_dim 64, bf16,
block 32: 384 KiB per block) from a producer process pinned to core 0 into a consumer process
pinned to core 1, as a prefill and a decode worker do, and times each way of moving the same bytes:

  pdserve tcp     PullClient -> TransferServer, transport `tcp` (what a decode worker runs)
  pdserve torch   the same, transport `torch` (gloo on CPU; the same code runs nccl on CUDA)
  pdserve shm     the same, transport `shm`, from a producer whose cache is a shared-memory segment
                  (/dev/shm): the consumer maps it once per connection and copies the blocks itself
                  (one memmove per layer run); the producer only answers PULL and DONE
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
sent, and for shm to the producer's DONE_OK; the pulls do not release the lease, so one lease
serves every repeat). The caches use
vLLM-CPU's layout: each layer is [num_blocks, kv_heads, block_size, 2*head_dim] in one shared
buffer, so a prompt's blocks are 12 runs of contiguous bytes (one per layer). Methods are
interleaved within every repeat so host noise hits them alike, and before each transfer the
consumer writes 256 MiB of scratch so no method finds its bytes in the shared last-level cache;
the report uses medians and shows the interquartile range.
"""

PLOT_TITLE = "KV transfer, bench model, producer core 0 -> consumer core 1"


def bench_geometry() -> BlockGeometry:
    spec = spec_for("bench")
    return BlockGeometry(spec.num_layers, spec.num_kv_heads, spec.hidden_size // spec.num_attention_heads,
                         block_size=32, dtype="bfloat16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[1024, 8192],
                        help="prompt lengths whose KV is moved (default: 1024 8192)")
    parser.add_argument("--repeats", type=int, default=100,
                        help="timed transfers per method and size (default: 100, about 35 s)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results",
                        help="folder for kv_transfer_throughput.{json,md,png}")
    args = parser.parse_args(argv)

    with Progress() as progress:
        task = progress.add_task("transfers", total=args.repeats * len(set(args.prompt_tokens)))
        rows = measure(bench_geometry(), args.prompt_tokens, args.repeats, on_round=lambda: progress.advance(task))
    table = markdown_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv_transfer_throughput.json").write_text(rows_json(rows))
    (args.out / "kv_transfer_throughput.md").write_text(table + "\n")
    plot(rows, args.out / "kv_transfer_throughput.png", PLOT_TITLE)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
