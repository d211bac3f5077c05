#!/usr/bin/env bash
# gpu-gurows.sh — the forward gate+up on the row-grouped 128-row tiles (rows as wgmma M, the
# weights as N = 256: each weight byte read by one wgmma a k-step, the rows by two) against
# token tiles (rows as N: the rows re-read by all four m64 wgmmas of a k-step) at the
# 512-row loads where the cut is 4 x 128 either way (`--gu-tiles rows|token`), and at R256;
# one process a run, in turns (REPS). Then the GEMM tests with the knob's own. PREBUILT=1:
# build/mok, build/mok_tests carried. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/gurows-out}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model deepseek-v4-pro --rows-per-expert 512|--model glm-5.2|--model qwen3.5-397b-a17b --rows-per-expert 512|--model kimi-k2.7-code --rows-per-expert 512|--model deepseek-v4-pro"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 200 build/mok_tests gemm 2>&1 | grep -E "^FAIL|gateup_row|passed"
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-2}"); do
      for m in rows token; do
        echo "== $s --gu-tiles $m ($r)"
        timeout 120 build/mok bench gemm $s --kinds gateup --gu-tiles $m --iters 20 2>&1 | grep -E "^gateup|rror|FAIL"
      done
    done
  done
} 2>&1 | tee "$OUT/log"
