#!/usr/bin/env bash
# Per-phase times of the baseline (MOK_BASELINE_PROFILE=1), rank 0, last pass of each kind.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
make -j"$(nproc)" all 2>&1 | grep -E " error" | head
for m in ${1:-qwen3.5-397b-a17b:2048 glm-5.2:8192}; do
  model=${m%:*}; T=${m#*:}
  echo "== $model T=$T"
  MOK_BASELINE_PROFILE=1 build/mok bench layer --model "$model" --tokens "$T" --iters 3 --warmup 1 \
    --check-tokens 0 2>"$OUT/prof-$model-$T.txt" | grep -A2 "^model"
  grep "rank 0" "$OUT/prof-$model-$T.txt" | grep " fwd " | tail -1
  grep "rank 0" "$OUT/prof-$model-$T.txt" | grep " bwd " | tail -1
done 2>&1 | tee "$OUT/log"
