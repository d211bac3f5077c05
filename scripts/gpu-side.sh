#!/usr/bin/env bash
# gpu-side.sh — mokImplMega with the shared expert on a side stream (MOK_MEGA_SIDE: bit 0
# forward, bit 1 backward): build, the mega tests with the side stream on, then `mok bench
# layer --impl mega` for each SIDES value (in the order given, so repeats show the noise), and
# mega beside nccl on MODELS2 (other shapes). Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
TOKENS=${TOKENS:-8192}
SIDES=${SIDES:-0 3 1 2 0 3}
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  echo "== tests, MOK_MEGA_SIDE=3"
  MOK_MEGA_SIDE=3 timeout 200 build/mok_tests layer_mega cli_run_gpu 2>&1 | tail -4
  MOK_MEGA_SIDE=3 MOK_LIBRARY=$PWD/build/libmok.so timeout 200 python3 python/tests/test_mok.py \
    moe_matches_reference_mega backward_after_another_forward mega_forward_in_cuda_graph fp32_main_grad_accumulates 2>&1 | tail -6
  for sd in $SIDES; do
    echo "== MOK_MEGA_SIDE=$sd"
    MOK_MEGA_SIDE=$sd timeout 150 build/mok bench layer --impl mega --gpus 1 --model "$MODELS" --tokens "$TOKENS" \
      --iters "${ITERS:-10}" --check-tokens 0 --check-experts 0 2>&1 | grep -E "^\[" | tail -4
  done
  if [ -n "${MODELS2-kimi-k2.7-code,deepseek-v4-pro}" ]; then
    echo "== mega beside nccl: ${MODELS2-kimi-k2.7-code,deepseek-v4-pro}"
    timeout 280 build/mok bench layer --impl mega,nccl --gpus 1 --model "${MODELS2-kimi-k2.7-code,deepseek-v4-pro}" \
      --tokens 2048,8192 --iters "${ITERS:-10}" --check-tokens 1 --json "$OUT/layer-mega2.json" 2>&1 | tail -14
  fi
} 2>&1 | tee "$OUT/log"
