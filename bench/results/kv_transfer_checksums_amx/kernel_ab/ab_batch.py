"""Run from the repository: `flock /tmp/pdserve-integration.lock .venv/bin/python bench/results/kv_transfer_checksums_amx/kernel_ab/ab_batch.py 1024 60` (then `8192 15`).
tcp pulls: the sum after every read (as shipped), after every >= 1 MiB landed, or after the last byte."""
import sys, statistics
from pathlib import Path
REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO)); sys.path.insert(0, str(REPO / "bench"))
import numpy as np
import kv_transfer.checksum as cs
from kv_transfer.throughput.pair import open_pair
from kv_transfer_throughput import bench_geometry

orig = cs.ReceivedSums.received
MODE = {"min": 0}
def received(self, n):
    if MODE["min"] and n < self._total_bytes and n - getattr(self, "_last", 0) < MODE["min"]:
        return
    self._last = n
    orig(self, n)
cs.ReceivedSums.received = received

def main():
    geometry = bench_geometry()
    tokens, reps = int(sys.argv[1]), int(sys.argv[2])
    num_blocks = tokens // geometry.block_size
    ways = [("every read", "pdserve tcp", 0), ("each 1 MiB", "pdserve tcp", 1 << 20), ("each 4 MiB", "pdserve tcp", 4 << 20),
            ("at the end", "pdserve tcp", 1 << 40), ("off", "pdserve tcp, checksums off", 0)]
    with open_pair(geometry, 2 * num_blocks, num_blocks * geometry.bytes_per_block, eviction_bytes=256 << 20,
                   cores=(0, 1), unchecked=True) as consumer:
        consumer.grant("t0", num_blocks)
        methods = consumer.methods("t0", num_blocks)
        times = {w[0]: [] for w in ways}
        for r in range(reps + 1):
            for label, method, minimum in ways:
                MODE["min"] = minimum
                consumer.evict_caches()
                t = methods[method]()
                if r:
                    times[label].append(t)
        for label, *_ in ways:
            v = times[label]
            print(f"{tokens} tcp {label:11s} median {statistics.median(v)*1e3:6.2f} ms  p25-p75 "
                  f"{np.percentile(v, 25)*1e3:5.2f}-{np.percentile(v, 75)*1e3:5.2f}", flush=True)

if __name__ == "__main__":
    main()
