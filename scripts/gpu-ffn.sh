#!/usr/bin/env bash
# gpu-ffn.sh — the fused routed forward (mok_gemm_ffn_fwd) on one GPU: build, the GEMM GPU
# tests (the fused ones among them), then `mok bench gemm --kinds gateup,down --ffn on` on
# the issue-5 shapes, balanced and Zipf 1.2 (REPS processes each), the fused rows last as
# a table. Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
REPS=${REPS:-1}
TESTS=${TESTS-gemm_gpu} # empty: no tests; TEST_S, BENCH_S: their time limits (s), ITERS
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model kimi-k2.7-code|--model glm-5.2|--model deepseek-v4-pro|--model qwen3.5-397b-a17b --rows-per-expert 512"}
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  if [ -n "$TESTS" ]; then
    echo "== tests: $TESTS"
    timeout "${TEST_S:-200}" stdbuf -oL build/mok_tests $TESTS 2>&1 | grep -vE "^ok " | tail -25
  fi
  IFS='|' read -ra S <<< "$SHAPES"
  for r in $(seq "$REPS"); do
    for s in "${S[@]}"; do
      for routing in uniform zipf:1.2; do
        echo "== $s --routing $routing (process $r)"
        timeout "${BENCH_S:-120}" stdbuf -oL build/mok bench gemm $s --routing $routing --kinds gateup,down --ffn on \
          --iters "${ITERS:-20}" --vs-balanced off --vs-cublas-zipf off 2>&1 | grep -vE "^kind"
        [ "${PIPESTATUS[0]}" = 124 ] && { echo "TIMEOUT: $s $routing"; break 3; }
      done
    done
  done
} 2>&1 | tee "$OUT/log"
echo "== fused rows (shape, fused ms, TFLOP/s, two launches, fused/two, vs cuBLAS)"
grep -E "^== |^fused" "$OUT/log" | sed -E 's/two launches ([0-9.]+) ms \(([0-9.]+)\): fused \/ two ([0-9.]+); cuBLAS gate\+up \+ down ([0-9.]+) ms: ours fused \/ it ([0-9.]+); bitwise (\w+)/two \1 ms, fused\/two \3, cuBLAS \4 ms, fused\/cuBLAS \5, bitwise \6/'
