"""Run from the repository: `flock /tmp/pdserve-integration.lock .venv/bin/python bench/results/kv_transfer_checksums_amx/kernel_ab/ab_pull.py 1024 60` (then `8192 15`).
A/B in one process: tcp/torch pulls with the new summing kernel, the old one (the commit before this change), and unchecked,
interleaved per round; plus consumer CPU per pull and time in the checksum callback."""
import sys, time, statistics, collections, subprocess
from pathlib import Path
REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO)); sys.path.insert(0, str(REPO / "bench"))
import numpy as np
from numba import njit
import kv_transfer.checksum as cs
from kv_transfer.throughput.pair import open_pair
from kv_transfer_throughput import bench_geometry

old_src = subprocess.run(["git", "-C", str(REPO), "show", "3fe5db4d2c4cddeac2ba4414820a8a05d9010255:kv_transfer/checksum.py"], capture_output=True, text=True).stdout
ns = {"np": np}
exec(old_src[old_src.index("def _sums_python"):old_src.index("def _copy_sums_python")], ns)
old_kernel = njit(nogil=True, boundscheck=False)(ns["_sums_python"])
@njit(nogil=True, boundscheck=False)
def old_range(words, block_words, start, stop, out):
    old_kernel(words[start * block_words: stop * block_words], block_words, out[start:stop])
new_range = cs._sums_kernel

stats = collections.Counter()
orig_received = cs.ReceivedSums.received
def received(self, n):
    t = time.perf_counter(); orig_received(self, n); stats["cb_s"] += time.perf_counter() - t; stats["reads"] += 1
cs.ReceivedSums.received = received

def main():
    geometry = bench_geometry()
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    num_blocks = tokens // geometry.block_size
    ways = [("tcp new", "pdserve tcp", new_range), ("tcp old", "pdserve tcp", old_range), ("tcp off", "pdserve tcp, checksums off", None),
            ("torch new", "pdserve torch", new_range), ("torch old", "pdserve torch", old_range), ("torch off", "pdserve torch, checksums off", None),
            ("shm", "pdserve shm", None), ("shm off", "pdserve shm, checksums off", None)]
    with open_pair(geometry, 2 * num_blocks, num_blocks * geometry.bytes_per_block, eviction_bytes=256 << 20,
                   cores=(0, 1), unchecked=True) as consumer:
        consumer.grant("t0", num_blocks)
        methods = consumer.methods("t0", num_blocks)
        for _, method, kernel in ways:       # warm
            if kernel is not None: cs._sums_kernel = kernel
            methods[method]()
        times = {w[0]: [] for w in ways}; cpu = collections.Counter(); cb = collections.Counter(); reads = collections.Counter()
        for _ in range(reps):
            for label, method, kernel in ways:
                if kernel is not None: cs._sums_kernel = kernel
                consumer.evict_caches()
                stats.clear()
                c0 = time.thread_time()
                times[label].append(methods[method]())
                cpu[label] += time.thread_time() - c0; cb[label] += stats["cb_s"]; reads[label] += stats["reads"]
        for label, *_ in ways:
            print(f"{tokens} {label:10s} median {statistics.median(times[label])*1e3:6.2f} ms  p25-p75 "
                  f"{np.percentile(times[label], 25)*1e3:5.2f}-{np.percentile(times[label], 75)*1e3:5.2f}  consumer thread cpu {cpu[label]/reps*1e3:5.2f} ms  "
                  f"reads {reads[label]/reps:6.1f}  in checksum callback {cb[label]/reps*1e3:5.2f} ms", flush=True)

if __name__ == '__main__':
    main()
