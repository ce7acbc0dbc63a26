#!/bin/bash
# Served A/B: a 1P+1D bench cluster with vLLM's layout (mp) and the model in the engine core (uni),
# ABBA, the same trace requests at the same rate; client-side TTFT/TPOT/ITL.
cd "$(dirname "$0")/../../../.."   # the checkout this script sits in
OUT=/tmp/served_ab; mkdir -p $OUT
i=0
for ex in mp uni uni mp; do
  i=$((i+1))
  .venv/bin/pdserve up --model models/bench --vllm-executor $ex --no-prefix-caching --grpc-port 52051 --http-port 58080 \
     --log-dir $OUT/logs_${i}_$ex > $OUT/up_${i}_$ex.log 2>&1 &
  UP=$!
  started=$(date +%s.%N)
  for t in $(seq 1 600); do curl -sf -X POST http://127.0.0.1:58080/v1/completions -H 'Content-Type: application/json' \
     -d '{"model":"bench","prompt":[11,12,13],"max_tokens":2}' >/dev/null 2>&1 && break; sleep 0.5; done
  echo "$ex run $i: up after $(echo "$(date +%s.%N) - $started" | bc) s"
  sleep 5
  .venv/bin/pdserve load --target http://127.0.0.1:58080 --workload trace --num-prompts 40 --arrival poisson \
     --request-rate 0.5 --seed 7 --max-input-len 1900 --max-output-len 140 --warmup 2 --ttft-slo-ms 4000 --tpot-slo-ms 100 --output-dir $OUT --label run${i}_$ex --no-progress \
     > $OUT/load_${i}_$ex.txt 2>&1
  kill -INT $UP; wait $UP
  sleep 5
done
