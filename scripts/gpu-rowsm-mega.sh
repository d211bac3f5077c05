#!/usr/bin/env bash
# gpu-rowsm-mega.sh — the rows-as-M 128-row gate+up tiles in the megakernel (session 41):
# the GEMM and mega tests (bitwise against the rows as N, against mokImplNccl, float64),
# then `mok bench layer --impl mega` of this tree against the parent's binary
# (build-base/mok) in turns, glm-5.2 (R256 at T=8192: 2 x 128-row tiles) and qwen3.5 (R160:
# none). build/mok, build/mok_tests, build-base/mok carried. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/rowsm-mega}; mkdir -p "$OUT"
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 250 build/mok_tests gemm layer_mega layer_nccl 2>&1 | grep -E "^FAIL|rows_m|bitwise|passed"
  for r in 1 2; do
    for b in build-base/mok build/mok; do
      echo "== $b ($r)"
      timeout 100 $b bench layer --impl mega --gpus 1 --model glm-5.2,qwen3.5-397b-a17b --tokens 8192 --iters 10 \
        --check-tokens 1 2>&1 | grep -E "\] forward|rror" | sed 's/, device memory.*//'
    done
  done
} 2>&1 | tee "$OUT/log"
