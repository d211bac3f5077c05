#!/usr/bin/env bash
# gpu-rowsm.sh — gate+up token tiles of 128 rows with the rows as wgmma M (session 41,
# tok_consume_rows_m, `--gu-tiles token-m`) against the rows as N (`token-n`, the tiles
# as before), the row-grouped tiles (`grouped`) and the parent tree's binary (`base`,
# build-base/mok: what the new code costs the other tiles by being there), one process a
# run, in turns (REPS; VARIANTS picks); the GEMM tests first (TESTS=0: not).
# PREBUILT: build/mok, build/mok_tests, build-base/mok carried. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/rowsm-out}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model deepseek-v4-pro --rows-per-expert 512|--model qwen3.5-397b-a17b --rows-per-expert 512|--model kimi-k2.7-code --rows-per-expert 512|--model glm-5.2|--model deepseek-v4-pro|--model qwen3.5-397b-a17b|--model deepseek-v4-pro --routing zipf:1.2|--model qwen3.5-397b-a17b --routing zipf:1.2"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  [ "${TESTS:-1}" = 0 ] || timeout 200 build/mok_tests gemm 2>&1 | grep -E "^FAIL|gateup_row|passed"
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-2}"); do
      for v in ${VARIANTS:-base token-n token-m}; do
        echo "== $s $v ($r)"
        if [ $v = base ]; then bin=build-base/mok; opt=""; else bin=build/mok; opt="--gu-tiles $v"; fi
        timeout 120 $bin bench gemm $s --kinds gateup $opt --iters 20 --vs-cublas-zipf off 2>&1 \
          | grep -E "^gateup|zipf / balanced|rror|FAIL"
      done
    done
  done
} 2>&1 | tee "$OUT/log"
