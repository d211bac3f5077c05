#!/usr/bin/env bash
# gpu-rowsm-knobs.sh — what makes the row-grouped gate+up tiles faster than token tiles of
# the same 4 x 128 rows at R512 (session 41): token-m beside the row-grouped tiles with one
# knob changed at a time (stagger off, tickets, four 2-D weight boxes, 32-row boxes). One
# process a run, in turns (REPS). build/mok carried. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/rowsm-knobs}; mkdir -p "$OUT"
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  for s in "--model deepseek-v4-pro --rows-per-expert 512" "--model qwen3.5-397b-a17b --rows-per-expert 512"; do
    for r in $(seq "${REPS:-2}"); do
      for v in "grouped" "token-m" "token-m --stagger off" "token-m --sched tickets" "token-m --gu-box four" "token-m --row-box 32"; do
        echo "== $s --gu-tiles $v ($r)"
        timeout 120 build/mok bench gemm $s --kinds gateup --gu-tiles $v --iters 20 2>&1 | grep -E "^gateup|rror|FAIL"
      done
    done
  done
} 2>&1 | tee "$OUT/log"
