#!/usr/bin/env bash
# gpu-s45.sh — the split mix order's experiment (built first on the CPU machine:
# scripts/build-mixrev.sh). On an H200 first, issue 5's lines (gpu-s36.sh's GEMM part, REPS
# runs, build/mok carried); then, on any GPU, scripts/gpu-ab-bins.sh on Zipf 1.2 (CFGS) with
# tile traces: base = build/mok (this tree); r1 = build-r1/mok, the one-tile experts' tiles
# fewest rows first; r2 = build-r2/mok, the multi-tile experts' fewest rows first
# (-DMOK_EXP_MIXREV=1 / 2); rounds until AB_END s (default 380). Logs under $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s45-out}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if [[ "$GPU" == *H200* ]]; then
  OUT=$OUT/s36 PREBUILT=1 GEMM_ONLY=1 REPS=${REPS:-2} bash scripts/gpu-s36.sh > /dev/null 2>&1
  grep -E "^(--|gateup|down)|zipf / balanced|balanced rows" "$OUT/s36/gemm.log" | sed 's/  */ /g' | cut -c1-130
fi
OUT=$OUT/ab BINS="base:build/mok r1:build-r1/mok r2:build-r2/mok" REPS=3 TMAX=$(( SECONDS < ${AB_END:-380} - 80 ? ${AB_END:-380} - SECONDS : 80 )) TRACE=1 \
  bash scripts/gpu-ab-bins.sh
