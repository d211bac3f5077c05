#!/usr/bin/env bash
# gpu-ddefer.sh — for branch exp/ddown-defer's binaries (BIN, TESTS): down dgrad's 128 x 128
# tiles with each tile's SwiGLU' epilogue under the next tile's first k-blocks (`--ddown-defer
# on --defer-blocks N`) against the usual loop (off), one process a run, in turns (REPS); the
# experiment's test first (float64 chain, bitwise against the usual loop). `mok bench gemm
# --kinds ddown`, ours beside cuBLAS's dY W_down (no SwiGLU'). DEFER: the variants beside off
# (on:N; default on:3). Log: $OUT/log; short lines printed.
set -uo pipefail
OUT=${OUT:-/tmp/ddefer}; mkdir -p "$OUT"
BIN=${BIN:-build/mok}; TESTS=${TESTS:-build/mok_tests}
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model kimi-k2.7-code|--model glm-5.2|--model deepseek-v4-pro|--model qwen3.5-397b-a17b --rows-per-expert 512|--model qwen3.5-397b-a17b --routing random|--model qwen3.5-397b-a17b --routing zipf:1.2|--model deepseek-v4-pro --routing zipf:1.2"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -x "$TESTS" ] && timeout 200 $TESTS gemm_gpu_ddown gemm_gpu_token gemm_validation 2>&1 | grep -E "^FAIL|ddown|passed"
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-2}"); do
      for m in off ${DEFER:-on:3}; do
        opt="--ddown-defer off"; [ "$m" != off ] && opt="--ddown-defer on --defer-blocks ${m#on:}"
        echo "== $s $m ($r)"
        timeout 120 $BIN bench gemm $s --kinds ddown $opt --iters 20 --vs-cublas-zipf off 2>&1 \
          | grep -E "^dgrad down|(zipf|random) / balanced|rror|FAIL"
      done
    done
  done
} > "$OUT/log" 2>&1
grep -E "^(FAIL|[0-9]+ passed)" "$OUT/log"
awk '/^==/{h=$0; next} /^dgrad down/{n=NF; print substr(h,4) " | " $(n-6) " ms " $(n-2)}' "$OUT/log" | sed 's/--model //'
