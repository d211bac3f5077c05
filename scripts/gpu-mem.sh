#!/usr/bin/env bash
# gpu-mem.sh — device memory that follows the rows: build; the C suite (TESTS; " " = all of
# it, "" = none); `mok bench layer` (IMPLS, MODELS, TOKENS) with each run's device memory
# (layer block, comm scratch) beside its times. Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
TOKENS=${TOKENS:-8192}
IMPLS=${IMPLS:-mega,nccl}
TESTS=${TESTS-" "}
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  if [ -n "$TESTS" ]; then
    echo "== C tests: $TESTS"
    timeout "${TEST_S:-330}" stdbuf -oL build/mok_tests $TESTS 2>&1 | grep -vE "^ok " | tail -14
  fi
  echo "== bench"
  timeout "${BENCH_S:-240}" build/mok bench layer --impl "$IMPLS" --gpus 1 --model "$MODELS" --tokens "$TOKENS" \
    --iters "${ITERS:-10}" --check-tokens 1 --json "$OUT/layer.json" 2>&1 | grep -E "\] forward|^model|ok$|WRONG|FAIL"
} 2>&1 | tee "$OUT/log"
