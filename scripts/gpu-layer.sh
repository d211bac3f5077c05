#!/usr/bin/env bash
# GPU check of the layer (baseline path): build, the layer's GPU tests, then the layer
# benchmark on the published shapes (EP over all local GPUs). Full log in $OUT/log,
# JSON in $OUT/layer-*.json; the benchmark's table comes last.
#   scripts/gpu-layer.sh [models] [tokens]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}
mkdir -p "$OUT"
models=${1:-glm-5.2,kimi-k2.7-code,qwen3.5-397b-a17b,deepseek-v4-pro}
tokens=${2:-2048,8192}
{
  date -u; git rev-parse --short HEAD; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E "error|warning|Error" | head -20
  timeout 300 build/mok_tests layer generate comm_ 2>&1 | tail -20
  timeout 420 build/mok bench layer --model "$models" --tokens "$tokens" --json "$OUT/layer-baseline.json"
} 2>&1 | tee "$OUT/log"
