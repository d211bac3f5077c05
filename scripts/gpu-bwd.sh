#!/usr/bin/env bash
# gpu-bwd.sh — mokImplMega's backward: build; the C suite (TESTS; " " = all of it) and the
# binding's tests (PYTESTS; "-" = none); `mok bench layer --impl mega` (MODELS, TOKENS);
# then a per-phase profile of the passes (MOK_BASELINE_PROFILE, T = the last of TOKENS,
# the last pass of each model). Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
TOKENS=${TOKENS:-2048,8192}
TESTS=${TESTS-" "}
{
  date -u; nvidia-smi -L; git log --oneline -1
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  if [ -n "$TESTS" ]; then
    echo "== C tests: $TESTS"
    timeout "${TEST_S:-330}" stdbuf -oL build/mok_tests $TESTS 2>&1 | grep -vE "^ok " | tail -14
  fi
  if [ "${PYTESTS:-}" != "-" ]; then
    echo "== python tests"
    MOK_LIBRARY=$PWD/build/libmok.so timeout 200 python3 python/tests/test_mok.py ${PYTESTS:-} 2>&1 | grep -E "FAIL|python:|Error" | tail -8
  fi
  echo "== bench"
  timeout 150 build/mok bench layer --impl mega --gpus 1 --model "$MODELS" --tokens "$TOKENS" \
    --iters "${ITERS:-10}" --check-tokens 1 2>&1 | grep -E "\] forward"
  for m in ${MODELS//,/ }; do
    echo "== profile $m T=${TOKENS##*,}"
    MOK_BASELINE_PROFILE=1 timeout 100 build/mok bench layer --impl mega --gpus 1 --model "$m" \
      --tokens "${TOKENS##*,}" --iters 3 --check-tokens 0 2>&1 | grep -E "mok baseline (fwd|bwd)" | tail -2
  done
} 2>&1 | tee "$OUT/log"
