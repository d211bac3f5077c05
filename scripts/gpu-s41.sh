#!/usr/bin/env bash
# gpu-s41.sh — the layer on the machine at hand (session 41): `mok bench layer` with mega, nccl
# and the cuBLAS baseline side by side (uniform; Zipf 1.2 for mega and nccl), one profiled run
# of mega a model (MOK_BASELINE_PROFILE=1: the forward's launch, the backward's four GEMM kinds,
# the shared expert with the combine), and the combine inside the forward launch against its
# own launch (MOK_MEGA_COMBINE 1 / 0 in turns). PREBUILT=1: build/mok carried. Short lines
# last; the whole log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s41-out}; mkdir -p "$OUT"
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
{
  date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  if [ "${PREBUILT:-0}" != 1 ]; then make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { echo "build failed"; exit 1; }; fi
  echo "== uniform, mega / nccl / baseline"
  timeout 280 build/mok bench layer --impl mega,nccl,baseline --gpus 1 --model "$MODELS" --tokens "${TOKENS:-2048,8192}" \
    --iters "${ITERS:-10}" --check-tokens 1 --json "$OUT/layer-uniform.json" 2>&1 | grep -E "\] forward|rror|check"
  echo "== zipf:1.2, mega / nccl"
  timeout 150 build/mok bench layer --impl mega,nccl --gpus 1 --model "$MODELS" --tokens 8192 --routing zipf:1.2 \
    --iters "${ITERS:-10}" --check-tokens 1 --json "$OUT/layer-zipf.json" 2>&1 | grep -E "\] forward|rror|check"
  for m in ${MODELS//,/ }; do
    echo "== profile mega $m T=8192"
    MOK_BASELINE_PROFILE=1 timeout 100 build/mok bench layer --impl mega --gpus 1 --model "$m" --tokens 8192 --iters 3 \
      --check-tokens 0 --check-experts 0 2>&1 | grep -E "mok baseline (fwd|bwd)" | tail -2
  done
  for v in ${ORDER:-1 0 1 0}; do
    echo "== MOK_MEGA_COMBINE=$v"
    MOK_MEGA_COMBINE=$v timeout 120 build/mok bench layer --impl mega --gpus 1 --model "$MODELS" --tokens 8192 \
      --iters "${ITERS:-10}" --check-tokens 1 2>&1 | grep -E "\] forward|rror"
  done
} 2>&1 | tee "$OUT/log"
