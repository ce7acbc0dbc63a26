#!/bin/bash
set -u
while pgrep -f "out-dir /tmp/s66/ab/new_1" > /dev/null; do sleep 2; done
echo "$(date) new 1 finished"
for spec in old:1 new:2 old:2; do
  who=${spec%:*}; round=${spec#*:}
  if [ $who = old ]; then dir=/work/wt_old; prof=/work/main/bench/results/validate_shapes_zen3_shm/tiny_2cpu_epyc_zen3_served.json; extra=""
  else dir=/work/wt; prof=/tmp/s66/tiny_zen3.json; extra="--refine 0"; fi
  cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python bench/validate_planner.py --model models/tiny --profile $prof \
    --shape long-short --shape short-long --topology 1P+1D --transport shm --rates 0.65,2.06 --duration-s 30 --min-requests 30 \
    --ttft-slo-ms 1000 --tpot-slo-ms 25 $extra --out-dir /tmp/s66/ab/${who}_$round > /tmp/s66/ab_${who}_$round.log 2>&1
  echo "$(date) done $who $round"
done
