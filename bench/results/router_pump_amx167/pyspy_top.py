"""Sums a `py-spy record --format raw` file: the top frames by own samples and by samples under them.
    python3 pyspy_top.py RAW [N_SELF] [N_INCLUSIVE]"""
import collections, sys
self_c = collections.Counter(); incl = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    line = line.rstrip()
    if not line: continue
    stack, n = line.rsplit(" ", 1); n = int(n)
    frames = stack.split(";"); total += n
    self_c[frames[-1]] += n
    for f in set(frames): incl[f] += n
print("total", total)
print("--- top self")
for f, n in self_c.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 20): print(f"{n:6d} {100*n/total:5.1f}% {f[:140]}")
print("--- top inclusive")
for f, n in incl.most_common(int(sys.argv[3]) if len(sys.argv) > 3 else 50): print(f"{n:6d} {100*n/total:5.1f}% {f[:140]}")
