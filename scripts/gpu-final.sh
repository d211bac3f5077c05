#!/usr/bin/env bash
# Last check of a session: full suite, then the layer with mok's GEMMs as its expert
# GEMM engine beside the cuBLAS engine, same run, all visible GPUs.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
{
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -E " error" | head
  timeout 120 build/mok_tests 2>&1 | grep -vE "^ok " | tail -12
  for gemm in mok cublas; do
    timeout 60 build/mok bench layer --gemm $gemm --model qwen3.5-397b-a17b,glm-5.2 --tokens 2048,8192 \
      --iters 10 --check-tokens 1 --json "$OUT/layer-$gemm.json" 2>&1 | grep -A4 "^model"
  done
} 2>&1 | tee "$OUT/log"
