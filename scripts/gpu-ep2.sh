#!/usr/bin/env bash
# The session's GPU check on all visible GPUs: build, the full test suite, `make run`, a
# quick GEMM benchmark (tail-heavy shapes), then the layer benchmark with both
# implementations side by side on the same data (nccl = NCCL all-to-all + mok's grouped
# GEMMs, baseline = NCCL all-to-all + cuBLAS) on the published shapes.
# Full log in $OUT/log; tables last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
ITERS=${ITERS:-20}
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -E " error|Error " | head -20
  echo "== full test suite"
  timeout 300 build/mok_tests 2>&1 | grep -vE "^ok " | tail -30
  echo "== make run"
  timeout 60 make -s run 2>&1 | tail -6
  echo "== gemm bench (ours vs cuBLAS, TFLOP/s)"
  for m in "kimi-k2.7-code" "glm-5.2" "qwen3.5-397b-a17b" "deepseek-v4-pro" "kimi-k2.7-code --routing zipf:1.2"; do
    tag=$(echo "$m" | tr ' :.' '___')
    timeout 60 build/mok bench gemm --model $m --iters 10 --json "$OUT/gemm-$tag.json" 2>&1 | grep -E "^(gateup|down|dgrad|wgrad)" | \
      awk -v m="$m" '{printf "%-36s %-20s ours %6s cuBLAS %6s ratio %s\n", m, $1" "$2, $(NF-5), $(NF-3), $(NF-2)}'
  done
  echo "== layer bench"
  timeout 300 build/mok bench layer --impl nccl,baseline --model glm-5.2,kimi-k2.7-code,qwen3.5-397b-a17b,deepseek-v4-pro \
    --tokens 2048,8192 --iters "$ITERS" --check-tokens 1 --json "$OUT/layer.json" 2>&1 | grep -A20 "^MoE layer"
  timeout 150 build/mok bench layer --impl nccl,baseline --model deepseek-v3,qwen3-30b-a3b --tokens 16384 \
    --iters "$ITERS" --check-tokens 1 --json "$OUT/layer-16k.json" 2>&1 | grep -A8 "^model"
} 2>&1 | tee "$OUT/log"
