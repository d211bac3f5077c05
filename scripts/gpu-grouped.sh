#!/usr/bin/env bash
# Baseline expert GEMMs: grouped cuBLAS call vs one call per expert, per pass.
# A: forward per-expert, backward grouped; B: forward grouped, backward per-expert.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
make -j"$(nproc)" all 2>&1 | grep -E "error" | head
for mask in 0x1f8 0x007; do
  echo "== MOK_BASELINE_GROUPED=$mask"
  MOK_BASELINE_GROUPED=$mask timeout 250 build/mok bench layer --model glm-5.2,kimi-k2.7-code,qwen3.5-397b-a17b,deepseek-v4-pro \
    --tokens 2048,8192 --iters 10 --check-tokens 1 --json "$OUT/grouped-$mask.json" 2>&1 | grep -A20 "^model"
done 2>&1 | tee "$OUT/log"
