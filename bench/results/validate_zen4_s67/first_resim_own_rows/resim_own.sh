# The first validation resimulated with each shape's own traced prompt stretch over idle (stretch_by_batch.txt):
# how much of each miss the prompt step beside the streams explains, at most. Seconds.
set -e
cd "$(git rev-parse --show-toplevel)"
V=bench/results/validate_zen4_s67/first; P=bench/results/validate_zen4_s67/tiny_zen4.json
declare -A rows
rows[trace]="1:1.0267+5.2,2:1.1643+9.7,4:1.2077+12.7,8:1.6802+14.2,16:1.6092+24.3,32:1.7999+7.4"
rows[bursty]="1:1.3772,2:1.8307,4:3.1965,8:3.7603,16:3.9766,32:3.66"
rows[short-long]="1:1.2588,2:1.8131,4:1.7025,8:2.0769+0.6,16:3.3345,32:1.5685,64:1.904"
rows[long-short]="1:1.0692+3.8,2:1.0711+12.2"
for shape in trace bursty short-long long-short; do
  .venv/bin/python bench/validate_planner.py --resimulate $V/1P+1D/$shape --profile $P --transport shm --prompt-stretch "${rows[$shape]}" --out-dir out/resim_own/$shape > out/resim_own_$shape.log 2>&1
  grep -A8 "goodput" out/resim_own_$shape.log | grep "1P+1D" | tail -2
done
