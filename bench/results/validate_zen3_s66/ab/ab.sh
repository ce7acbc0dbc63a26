#!/bin/bash
# The cluster's TTFT and TPOT with the code of the earlier Zen 3 run (1330999) against this
# session's (3a84d13), the same requests (shapes and seed), two rounds in turn: new, old, new, old.
# (As run, the first round's old side was run again after a wrong profile path; the order below is
# the order that produced the files.) Each side simulates with a profile its code reads; only the
# measured side is compared (ab_read.py -> ab_read.txt). Run from the repository's root, with a
# worktree of each commit (its models/ linked to this checkout's) and this checkout's venv:
#   git worktree add ../old 1330999 && git worktree add ../new 3a84d13
#   OLD_TREE=../old NEW_TREE=../new bench/results/validate_zen3_s66/ab/ab.sh
set -eu
ROOT=$(pwd)
OUT=$ROOT/bench/results/validate_zen3_s66/ab
PYTHON=$ROOT/.venv/bin/python
for spec in new:1 old:1 new:2 old:2; do
  who=${spec%:*}; round=${spec#*:}
  if [ $who = old ]; then tree=$OLD_TREE; prof=$ROOT/bench/results/validate_shapes_zen3_shm/tiny_2cpu_epyc_zen3_served.json; extra=""
  else tree=$NEW_TREE; prof=$ROOT/bench/results/validate_zen3_s66/tiny_zen3.json; extra="--refine 0"; fi
  (cd "$tree" && PYTHONPATH=$(pwd) "$PYTHON" bench/validate_planner.py --model models/tiny --profile "$prof" \
    --shape long-short --shape short-long --topology 1P+1D --transport shm --rates 0.65,2.06 --duration-s 30 \
    --min-requests 30 --ttft-slo-ms 1000 --tpot-slo-ms 25 $extra --out-dir "$OUT/${who}_$round")
done
