#!/usr/bin/env bash
# gpu-final.sh — a short closing check on all visible GPUs when little device time is
# left: build, the full test suite, the GEMM benchmark on the issue-5 shapes (gate+up and
# down rows), and the layer benchmark (nccl vs baseline) on two shapes. Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -E " error|Error " | head -20
  echo "== full test suite"
  timeout 200 build/mok_tests 2>&1 | grep -vE "^ok " | tail -30
  echo "== gemm bench (ours vs cuBLAS TFLOP/s, one GPU)"
  for m in "qwen3.5-397b-a17b" "kimi-k2.7-code" "glm-5.2" "deepseek-v4-pro" "qwen3.5-397b-a17b --rows-per-expert 512" \
           "kimi-k2.7-code --routing zipf:1.2" "qwen3.5-397b-a17b --routing zipf:1.2" \
           "kimi-k2.7-code --kinds ddown,dgateup,wgateup,wdown,wgateup32,wdown32"; do
    case "$m" in *--kinds*) k="";; *) k="--kinds gateup,down";; esac
    timeout 60 build/mok bench gemm --model $m $k --iters 20 2>&1 | grep -E "^(gateup|down|dgrad|wgrad)" | \
      awk -v m="$m" '{printf "%-40s %-20s ours %6s cuBLAS %6s ratio %s GB/s %s err %s\n", substr(m,1,40), ($1 ~ /grad/ ? $1" "$2" "$3 : $1), $(NF-5), $(NF-3), $(NF-2), $(NF-1), $NF}'
  done
  echo "== layer bench"
  timeout 120 build/mok bench layer --impl nccl,baseline --model glm-5.2,qwen3.5-397b-a17b --tokens 8192 \
    --iters 10 --check-tokens 1 --json "$OUT/layer.json" 2>&1 | grep -A8 "^model"
} 2>&1 | tee "$OUT/log"
