#!/usr/bin/env bash
# gpu-stagger.sh — the stagger rule (expert 0's token tiles half as large under the static
# schedule, session 6) on and off, gate+up (with the rows-as-M 128-row tiles, --gu-tiles
# token-m) and down, at the issue's balanced shapes (session 41). One process a run, in
# turns (REPS). build/mok carried. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/stagger}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model qwen3.5-397b-a17b --rows-per-expert 512|--model kimi-k2.7-code|--model kimi-k2.7-code --rows-per-expert 512|--model glm-5.2|--model deepseek-v4-pro|--model deepseek-v4-pro --rows-per-expert 512"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-2}"); do
      for v in on off; do
        echo "== $s --stagger $v ($r)"
        timeout 120 build/mok bench gemm $s --kinds gateup,down --gu-tiles token-m --stagger $v --iters 20 2>&1 \
          | grep -E "^(gateup|down)|rror|FAIL"
      done
    done
  done
} 2>&1 | tee "$OUT/log"
