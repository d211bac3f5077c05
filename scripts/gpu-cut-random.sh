#!/usr/bin/env bash
# gpu-cut-random.sh — how token tiles cut an expert's rows (src/plan.h mok_plan_tok_split),
# timed under random routing (`--routing random:SEED`, R +- sqrt(R) rows an expert) and on
# the balanced shapes: build/mok (the rule) against build-min128/mok (one more tile only
# where the equal tiles keep >= 128 rows: scripts/exp/tok-cut-min128.diff), one process a
# run, in turns, for SEEDS. Carry build/mok, build-min128/mok. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/cut}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model qwen3.5-397b-a17b --rows-per-expert 512|--model kimi-k2.7-code|--model glm-5.2|--model deepseek-v4-pro|--model deepseek-v4-pro --rows-per-expert 512"}
BUILDS=${BUILDS:-build build-min128}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for seed in ${SEEDS:-1 2}; do
      for b in $BUILDS; do
        echo "== $s random:$seed $b"
        timeout 120 $b/mok bench gemm $s --routing random:$seed --vs-balanced off --vs-cublas-zipf off \
          --kinds gateup,down --iters 20 2>&1 | grep -E "^(down|gateup)|rror|FAIL"
      done
    done
  done
} 2>&1 | tee "$OUT/log"
