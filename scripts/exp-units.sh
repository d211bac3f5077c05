#!/usr/bin/env bash
# exp-units.sh — session 40: token tiles of at most 128 rows (--tok-units 8) against the rule's
# 176 (11) under Zipf 1.2 and at the published loads, `mok bench gemm --iters 20`, one process
# a line, in turns. Log in $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
{
for rep in 1 2; do
  for m in ${MODELS:-deepseek-v4-pro kimi-k2.7-code glm-5.2 qwen3.5-397b-a17b}; do
    for u in 11 8; do
      echo "-- $m zipf units $u rep $rep"
      timeout 120 build/mok bench gemm --model $m --routing zipf:1.2 --vs-cublas-zipf off --kinds ${KINDS:-gateup,down} \
        --tok-units $u --iters 20 2>&1 | grep -E "^(gateup|down)|zipf / balanced" | cut -c1-150
    done
  done
done
} 2>&1 | tee "$OUT/log"
