#!/usr/bin/env bash
# gpu-dnrows.sh — the down GEMM's 128-row token tiles with the rows as wgmma M (`--dn-tiles
# token-m`, the rule since session 42) against the rows as N (`token-n`) and against the
# parent tree's binary (build-base/mok: what the path costs the other tiles by being
# compiled in), one process a run, in turns (REPS); then (MEGA=1) `mok bench layer --impl
# mega` of this tree against build-base/mok, glm-5.2 (R256 at T=8192: 2 x 128-row tiles) and
# qwen3.5 (R160: none). TESTS=1: the GEMM and layer tests first (bitwise against the rows as
# N, mega against nccl, float64). Carry build/mok, build/mok_tests, build-base/mok. Log:
# $OUT/log. KINDS: bench gemm's --kinds (default down).
set -uo pipefail
OUT=${OUT:-/tmp/dnrows}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b --rows-per-expert 512|--model glm-5.2|--model deepseek-v4-pro|--model deepseek-v4-pro --rows-per-expert 512|--model kimi-k2.7-code --rows-per-expert 512|--model kimi-k2.7-code|--model qwen3.5-397b-a17b|--model qwen3.5-397b-a17b --routing zipf:1.2|--model deepseek-v4-pro --routing zipf:1.2"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  if [ "${TESTS:-1}" = 1 ]; then
    timeout 300 build/mok_tests gemm layer_mega layer_nccl layer_matches 2>&1 | grep -E "^FAIL|rows_m|bitwise|128_row|passed"
  fi
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-2}"); do
      for v in base token-n token-m; do
        echo "== $s $v ($r)"
        if [ $v = base ]; then bin=build-base/mok; opt=""; else bin=build/mok; opt="--dn-tiles $v"; fi
        timeout 120 $bin bench gemm $s --kinds ${KINDS:-down} $opt --iters 20 --vs-cublas-zipf off 2>&1 \
          | grep -E "^(down|gateup)|zipf / balanced|rror|FAIL"
      done
    done
  done
  if [ "${MEGA:-1}" = 1 ]; then
    for r in 1 2; do
      for b in build-base/mok build/mok; do
        echo "== layer $b ($r)"
        timeout 100 $b bench layer --impl mega --gpus 1 --model glm-5.2,qwen3.5-397b-a17b --tokens 8192 --iters 10 \
          --check-tokens 1 2>&1 | grep -E "\] forward|rror" | sed 's/, device memory.*//'
      done
    done
  fi
} 2>&1 | tee "$OUT/log"
