#!/usr/bin/env bash
# gpu-s37c.sh — session 37's last call: (1) on an H200 only, issue 5's lines on the final
# tree (`PREBUILT=1 GEMM_ONLY=1 REPS=1 scripts/gpu-s36.sh`) and the L2-prefetch experiment's
# down line there (build/exp-mok-l2pf: branch exp/l2-pf-thread's first commit); (2) on any
# card, scripts/gpu-loopflake.sh (comm_loopback_ranks_1gpu alone, N runs a setting).
set -uo pipefail
OUT=${OUT:-/tmp/s37c}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if [[ "$GPU" == *H200* ]]; then
  OUT=$OUT/s36 PREBUILT=1 GEMM_ONLY=1 REPS=1 bash scripts/gpu-s36.sh > /dev/null 2>&1
  grep -E "^(--|gateup|down)|zipf / balanced" "$OUT/s36/gemm.log" | cut -c1-130
  for v in "ctl:8,0" "pf6:6" "pf8:8"; do
    echo "-- l2pf ${v%%:*}"
    timeout 100 build/exp-mok-l2pf bench gemm --model qwen3.5-397b-a17b --kinds down --iters 20 --seed 7 \
      --l2-pf ${v#*:} 2>&1 | grep -E "^down" | tee -a "$OUT/l2pf.log"
  done
fi
OUT=$OUT/flake N=${N:-15} bash scripts/gpu-loopflake.sh
