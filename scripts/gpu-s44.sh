#!/usr/bin/env bash
# gpu-s44.sh — session 44's last device call, on the tree with tickets taken after the tile's
# loads (1e3cbe7): on an H200, issue 5's lines (gpu-s36.sh's GEMM part, REPS processes);
# on any GPU, tile traces of Zipf 1.2 gate+up (qwen3.5, deepseek-v4-pro) and of balanced
# rows by tickets (qwen3.5), summarised by scripts/trace-summary.py, for where Zipf still
# loses. PREBUILT=1 as gpu-next.sh. Log: $OUT/log; CSVs beside it.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s44-out}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if [ "${PREBUILT:-0}" != 1 ] || [ ! -x build/mok ]; then
  make -j16 all > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
fi
if [[ "$GPU" == *H200* ]] && [ "${LINES:-1}" = 1 ]; then  # LINES=0: traces only
  OUT=$OUT/s36 PREBUILT=1 GEMM_ONLY=1 REPS=${REPS:-1} bash scripts/gpu-s36.sh > /dev/null 2>&1
  grep -E "^(--|gateup|down)|zipf / balanced" "$OUT/s36/gemm.log" | cut -c1-130
fi
{
  for v in "qz|--model qwen3.5-397b-a17b --routing zipf:1.2" "dz|--model deepseek-v4-pro --routing zipf:1.2" \
           "qt|--model qwen3.5-397b-a17b --sched tickets"; do
    n=${v%%|*}
    timeout 60 build/mok bench gemm ${v#*|} --vs-balanced off --vs-cublas-zipf off --kinds gateup --iters 5 \
      --trace "$OUT/t-$n.csv" > /dev/null 2>&1
    python3 scripts/trace-summary.py "$OUT/t-$n.csv" 2>&1 | head -40
    gzip -f "$OUT/t-$n.csv"
  done
} > "$OUT/log" 2>&1
grep -E "^== " "$OUT/log" | sed "s|$OUT/||"
