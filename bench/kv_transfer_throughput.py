"""KV transfer throughput of pdserve's transports against the raw transport and memcpy. Run `--help`.

The pair, the methods and the summary live in `kv_transfer.throughput`; this script picks the
`bench` model's geometry, runs it and writes the results."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.progress import Progress

from kv_transfer.geometry import BlockGeometry
from kv_transfer.throughput.measure import measure
from kv_transfer.throughput.report import cost_table, markdown_table, plot, rows_json
from loadgen.proc_cpu import OtherLoad, wait_for_quiet
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

With --checksums-off-too, every pdserve transport also runs as "pdserve <name>, checksums off"
(the consumer does not verify block checksums; the producer took them once, at the lease's grant,
as a prefill worker does), right after its checked run: the checksums' cost, side by side.
--methods picks some of the methods above (by name) to shorten a run.

With --security-too, `pdserve tcp` also runs against a second server that holds a cluster secret
(kv_transfer.auth), each right after the other in every round:

  pdserve tcp, authenticated        the consumer proves the secret (once per connection), in clear
  pdserve tcp, encrypted            the same with kv_encryption=on: AES-256-GCM records both ways
  pdserve tcp, new connection       no secret, a new connection for every pull (handshake timed)
  pdserve tcp, authenticated, new connection    the same with the secret
  pdserve tcp, encrypted, new connection        the same, encrypted

and a second table gives the costs as ratios of medians (authenticated / plain, encrypted /
authenticated, ...). A decode worker keeps its connection to a producer for its lifetime, so the
"new connection" rows bound what a handshake adds to a pull; the others are what every pull pays.

Noise guard: before measuring, the script waits up to --quiet-wait-s for other processes to use at
most --quiet-cores, then measures how much they used during the run; both go into the JSON and the
Markdown ("other load"), so a noisy run says so.

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


# The security costs (--security-too): each method against the way it adds one thing to.
SECURITY_COSTS = (("pdserve tcp, authenticated", "pdserve tcp"),
                  ("pdserve tcp, encrypted", "pdserve tcp, authenticated"),
                  ("pdserve tcp, authenticated, new connection", "pdserve tcp, new connection"),
                  ("pdserve tcp, new connection", "pdserve tcp"),
                  ("pdserve tcp, authenticated, new connection", "pdserve tcp, authenticated"),
                  ("pdserve tcp, encrypted, new connection", "pdserve tcp, encrypted"))


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
    parser.add_argument("--checksums-off-too", action="store_true",
                        help="also run each pdserve transport without verifying block checksums")
    parser.add_argument("--security-too", action="store_true",
                        help="also run pdserve tcp authenticated, encrypted and on new connections")
    parser.add_argument("--quiet-cores", type=float, default=0.25,
                        help="other processes' CPU above which the run is reported noisy (default: %(default)s)")
    parser.add_argument("--quiet-wait-s", type=float, default=60.0,
                        help="longest wait for a quiet machine before measuring (default: %(default)s)")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="only these methods (default: all), e.g. 'pdserve tcp' 'pdserve shm' memcpy")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results",
                        help="folder for kv_transfer_throughput.{json,md,png}")
    args = parser.parse_args(argv)

    waited_s, before_cores = wait_for_quiet(args.quiet_cores, args.quiet_wait_s)
    meter = OtherLoad.start()
    with Progress() as progress:
        task = progress.add_task("transfers", total=args.repeats * len(set(args.prompt_tokens)))
        rows = measure(bench_geometry(), args.prompt_tokens, args.repeats, methods=args.methods,
                       on_round=lambda: progress.advance(task), unchecked=args.checksums_off_too,
                       secured=args.security_too)
    other_cores = meter.stop()
    noise = (f"other load: {other_cores:.2f} cores during the run ({'noisy' if other_cores > args.quiet_cores else 'quiet'}"
             f" against --quiet-cores {args.quiet_cores}); {before_cores:.2f} before it, after waiting {waited_s:.0f} s")
    table = markdown_table(rows)
    if args.security_too:
        table += "\n\n" + cost_table(rows, SECURITY_COSTS)
    table += f"\n\n{noise}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv_transfer_throughput.json").write_text(rows_json(rows))
    (args.out / "noise.json").write_text(json.dumps({"other_load_cores": round(other_cores, 3),
                                                     "before_cores": round(before_cores, 3), "waited_s": round(waited_s, 1),
                                                     "quiet_cores": args.quiet_cores, "noisy": other_cores > args.quiet_cores}))
    (args.out / "kv_transfer_throughput.md").write_text(table + "\n")
    plot(rows, args.out / "kv_transfer_throughput.png", PLOT_TITLE)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
