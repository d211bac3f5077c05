#!/usr/bin/env bash
# exp-fewest.sh — session 40's experiment on how token tiles cut an expert's rows, `mok bench
# gemm --iters 20`, ours / cuBLAS, processes in turns: build (the rule: the fewest tiles of
# <= 176 rows, or one more where that makes them equal), build-fewest (the fewest, never one
# more: 512 rows as 176 + 176 + 160) and build-min128 (one more only where the equal tiles
# keep >= 128 rows: 448 as 160 + 144 + 144, not 4 x 112). BUILDS, SPECS ("model rows" ...),
# ZIPF (models). Log in $OUT/log. The builds: `git apply scripts/exp/tok-cut-fewest.diff && make
# B=build-fewest build-fewest/mok; git checkout src/plan.h` (tok-cut-min128.diff alike), carried
# beside build/mok (run's carry). Results: docs/PERF.md, session 40.
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
BUILDS=${BUILDS:-build build-fewest}
SPECS=${SPECS:-deepseek-v4-pro:512 qwen3.5-397b-a17b:512 glm-5.2:512 kimi-k2.7-code:512 qwen3.5-397b-a17b:448}
ZIPF=${ZIPF:-qwen3.5-397b-a17b deepseek-v4-pro}
{
for rep in 1 2; do
  for spec in $SPECS; do
    for b in $BUILDS; do
      echo "-- $b ${spec%%:*} R${spec##*:} rep $rep"
      timeout 120 $b/mok bench gemm --model ${spec%%:*} --rows-per-expert ${spec##*:} --kinds gateup,down --iters 20 2>&1 |
        grep -E "^(gateup|down)" | cut -c1-110
    done
  done
  for m in $ZIPF; do
    for b in $BUILDS; do
      echo "-- $b $m zipf rep $rep"
      timeout 120 $b/mok bench gemm --model $m --routing zipf:1.2 --vs-cublas-zipf off --kinds gateup,down --iters 20 2>&1 |
        grep -E "^(gateup|down)|zipf / balanced" | cut -c1-150
    done
  done
done
} 2>&1 | tee "$OUT/log"
