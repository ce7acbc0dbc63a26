#!/bin/bash
# The cluster's TTFT and TPOT with the code of the earlier Zen 3 run (1330999, in a worktree at
# /work/wt_old) against this session's (3a84d13, /work/wt), the same requests (shapes and seed),
# two rounds in turn: new, old, new, old. (As run, the first round's old side was run again after a
# wrong profile path; the order below is the order that produced the files.) Each side simulates
# with a profile its code reads; only the measured side is compared (ab_read.py -> ab_read.txt).
set -u
OUT=${OUT:-bench/results/validate_zen3_s66/ab}
for spec in new:1 old:1 new:2 old:2; do
  who=${spec%:*}; round=${spec#*:}
  if [ $who = old ]; then dir=/work/wt_old; prof=/work/main/bench/results/validate_shapes_zen3_shm/tiny_2cpu_epyc_zen3_served.json; extra=""
  else dir=/work/wt; prof=/work/main/bench/results/validate_zen3_s66/tiny_zen3.json; extra="--refine 0"; fi
  (cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python bench/validate_planner.py --model models/tiny --profile $prof \
    --shape long-short --shape short-long --topology 1P+1D --transport shm --rates 0.65,2.06 --duration-s 30 \
    --min-requests 30 --ttft-slo-ms 1000 --tpot-slo-ms 25 $extra --out-dir /work/main/$OUT/${who}_$round)
done
