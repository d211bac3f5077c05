#!/usr/bin/env bash
# gpu-py.sh — the PyTorch binding on the device: build, its tests (python/tests/test_mok.py;
# PYTESTS picks some), the C suite (TESTS; " " = all of it, "" = none), then
# python/bench_torch.py: mok.MoE (IMPLS) beside the layer in plain PyTorch on the same weights
# (MODELS, TOKENS, ROUTING: "" skips it; GRAD_DTYPE bf16 or fp32). Log in $OUT/log, JSON in
# $OUT/torch-*.json.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
TESTS=${TESTS-" "}
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
TOKENS=${TOKENS:-2048,8192}
IMPLS=${IMPLS:-mega,auto}
{
  date -u; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.nccl.version())"
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  echo "== python tests"
  MOK_LIBRARY=$PWD/build/libmok.so timeout "${PY_S:-240}" python3 python/tests/test_mok.py ${PYTESTS:-} 2>&1 | tail -60
  if [ -n "$TESTS" ]; then
    echo "== C tests: $TESTS"
    timeout "${TEST_S:-300}" stdbuf -oL build/mok_tests $TESTS 2>&1 | grep -vE "^ok " | tail -30
  fi
  for r in ${ROUTING-uniform}; do
    echo "== bench_torch.py routing $r"
    MOK_LIBRARY=$PWD/build/libmok.so timeout "${BENCH_S:-240}" python3 python/bench_torch.py --models "$MODELS" \
      --tokens "$TOKENS" --impls "$IMPLS" --routing "$r" --iters "${ITERS:-10}" --grad-dtype "${GRAD_DTYPE:-bf16}" \
      --json "$OUT/torch-${r/:/}-${GRAD_DTYPE:-bf16}.json" 2>&1 | tail -20
  done
} 2>&1 | tee "$OUT/log"
