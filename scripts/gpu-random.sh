#!/usr/bin/env bash
# gpu-random.sh — the forward kinds under random routing (`mok bench gemm --routing
# random`: each row to a uniformly drawn expert, R +- sqrt(R) rows an expert, as random
# tokens under a balanced router) against the same kinds on exactly balanced rows in turn,
# and cuBLAS on the same rows (grouped call and a GEMM an expert), at the models' loads and
# at 512 rows. SUITE=1: the full C suite first. Carry build/mok (+ build/mok_tests). Log:
# $OUT/log; the short table last.
set -uo pipefail
OUT=${OUT:-/tmp/random}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model qwen3.5-397b-a17b --rows-per-expert 512|--model kimi-k2.7-code|--model glm-5.2|--model deepseek-v4-pro|--model deepseek-v4-pro --rows-per-expert 512"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  if [ "${SUITE:-0}" = 1 ]; then
    timeout 300 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(grep -E 'passed|failed' "$OUT/suite.log" | tail -1)"
    grep -E "^FAIL" "$OUT/suite.log" | cut -c1-300
  fi
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-1}"); do
      echo "== $s ($r)"
      timeout 120 build/mok bench gemm $s --routing random${SEED:+:$SEED} --kinds gateup,down --iters 20 2>&1 \
        | grep -E "^(down|gateup)|balanced rows|cuBLAS random|rror|FAIL"
    done
  done
} 2>&1 | tee "$OUT/log"
