#!/usr/bin/env bash
# gpu-mega-ep.sh — mokImplMega at N > 1 (stage A) on every visible GPU (2 or more): build,
# the multi-GPU tests (comm, the layer's three implementations against the float64
# reference, refusals), the two-process PyTorch test, then `mok bench layer` with mega beside
# nccl and baseline on the same data at EP over all GPUs, and mega with the y rows pushed
# inside the launch (MOK_MEGA_PUSH=1, session 40) against after it. Full log in $OUT/log, JSON in
# $OUT/layer-ep.json; the bench table last. Run with kind nvidia-h100-x2 (or -x8).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mega-ep-out}; mkdir -p "$OUT"
{
  date -u; nvidia-smi -L; git rev-parse --short HEAD 2>/dev/null
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  echo "== multi-GPU and loopback tests"
  timeout 400 build/mok_tests comm_ layer_ ep_ 2>&1 | grep -vE "^ok " | tail -20
  echo "== python (two processes among them)"
  timeout 300 python3 python/tests/test_mok.py moe_two_processes 2>&1 | tail -6
  echo "== layer bench, EP over all GPUs"
  timeout "${BENCH_S:-420}" build/mok bench layer --impl mega,nccl,baseline --model "${MODELS:-qwen3.5-397b-a17b,glm-5.2}" \
    --tokens "${TOKENS:-2048,8192}" --iters "${ITERS:-10}" --check-tokens 1 --json "$OUT/layer-ep.json" 2>&1 | tail -30
  echo "== mega with the push inside the launch (MOK_MEGA_PUSH=1) against after it (0), in turns"
  for v in 1 0 1 0; do
    echo "-- MOK_MEGA_PUSH=$v"
    MOK_MEGA_PUSH=$v timeout 300 build/mok bench layer --impl mega --model "${MODELS:-qwen3.5-397b-a17b,glm-5.2}" \
      --tokens "${TOKENS:-2048,8192}" --iters "${ITERS:-10}" --check-tokens 1 2>&1 | grep -E "\] forward|rror"
  done
} 2>&1 | tee "$OUT/log"
