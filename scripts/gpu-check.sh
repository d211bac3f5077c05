#!/usr/bin/env bash
# The session's GPU check: build, the full test suite (GPU tests included), `make run`
# on all GPUs, the layer benchmark on the published shapes, and the GEMM benchmark on
# the layout that once hung. Full log in $OUT/log; tables last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -E " error|Error " | head -20
  echo "== full test suite"
  timeout 300 build/mok_tests 2>&1 | grep -vE "^ok " | tail -30
  echo "== make run"
  timeout 60 make -s run 2>&1 | tail -14
  echo "== gemm bench, kimi zipf:1.2 (hung before)"
  timeout 90 build/mok bench gemm --model kimi-k2.7-code --routing zipf:1.2 --iters 5 2>&1 | tail -12
  echo "== layer bench"
  timeout 300 build/mok bench layer --model glm-5.2,kimi-k2.7-code,qwen3.5-397b-a17b,deepseek-v4-pro \
    --tokens 2048,8192 --check-tokens 1 --json "$OUT/layer-baseline.json" 2>&1 | grep -A12 "^MoE layer"
  timeout 120 build/mok bench layer --model deepseek-v3,qwen3-30b-a3b --tokens 16384 --check-tokens 1 \
    --json "$OUT/layer-baseline-16k.json" 2>&1 | grep -A4 "^model"
} 2>&1 | tee "$OUT/log"
