#!/usr/bin/env bash
# gpu-final.sh — a short closing check on all visible GPUs: the full test suite, the GEMM
# benchmark on the issue-5 shapes as an A/B against $BASE (scripts/ab-gemm.sh; skipped
# when $BASE has no tree), and the layer benchmark (nccl vs baseline) on two shapes. Log in
# $OUT/log (the A/B's own log beside it).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
BASE=${BASE:-.ab/base}
if [ -d "$BASE/src" ]; then
  OUT=$OUT/ab timeout 330 bash scripts/ab-gemm.sh "qwen320:--model qwen3.5-397b-a17b" "kimi341:--model kimi-k2.7-code" \
    "glm512:--model glm-5.2" "dsv4:--model deepseek-v4-pro" "qwen512:--model qwen3.5-397b-a17b --rows-per-expert 512" \
    "kimizipf:--model kimi-k2.7-code --routing zipf:1.2" "qwenzipf:--model qwen3.5-397b-a17b --routing zipf:1.2" \
    "glmzipf:--model glm-5.2 --routing zipf:1.2" "dsv4zipf:--model deepseek-v4-pro --routing zipf:1.2" \
    > /dev/null 2>&1
fi
{
  date -u; nvidia-smi -L; git log --oneline -1
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  echo "== full test suite"
  timeout 150 build/mok_tests 2>&1 | grep -vE "^ok " | tail -30
  echo "== layer bench"
  timeout 100 build/mok bench layer --impl nccl,baseline --model glm-5.2,qwen3.5-397b-a17b --tokens 8192 \
    --iters 10 --check-tokens 1 --json "$OUT/layer.json" 2>&1 | grep -A8 "^model"
  [ -f "$OUT/ab/log" ] && { echo "== A/B (B = $BASE, A = this tree)"; sed -n '/^config/,$p' "$OUT/ab/log"; }
} 2>&1 | tee "$OUT/log"
