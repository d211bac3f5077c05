#!/usr/bin/env bash
# gpu-dnrows.sh (branch exp/down-rows-m) — the down GEMM's 128-row token tiles with the rows
# as wgmma M (`--dn-tiles token-m`) against the rows as N (`token-n`) and against main's
# binary (build-base/mok: what the path costs the other tiles by being compiled in), one
# process a run, in turns (REPS); the bitwise test first. Carry build/mok, build/mok_tests,
# build-base/mok (main's). Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/dnrows}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b --rows-per-expert 512|--model glm-5.2|--model deepseek-v4-pro|--model kimi-k2.7-code --rows-per-expert 512|--model qwen3.5-397b-a17b|--model qwen3.5-397b-a17b --routing zipf:1.2"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 200 build/mok_tests gemm_gpu_down_rows_m gemm_gpu_gateup_rows_m gemm_gpu_token 2>&1 | grep -E "^FAIL|rows_m|passed"
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-2}"); do
      for v in base token-n token-m; do
        echo "== $s $v ($r)"
        if [ $v = base ]; then bin=build-base/mok; opt=""; else bin=build/mok; opt="--dn-tiles $v"; fi
        timeout 120 $bin bench gemm $s --kinds down $opt --iters 20 --vs-cublas-zipf off 2>&1 \
          | grep -E "^down|zipf / balanced|rror|FAIL"
      done
    done
  done
} 2>&1 | tee "$OUT/log"
