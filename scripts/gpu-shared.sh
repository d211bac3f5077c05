#!/usr/bin/env bash
# gpu-shared.sh — the megakernel with the shared expert as tiles of the launch: build, the
# mega tests (C and Python), then `mok bench layer --impl mega` with the shared expert in
# the launch (MOK_MEGA_SHARED=1, the default) and on cuBLAS before it (0), in turns, and
# nccl once (MODELS, TOKENS). Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
TOKENS=${TOKENS:-2048,8192}
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  echo "== C tests"
  timeout 200 build/mok_tests schedule_device layer_mega layer_nccl_matches_reference_1gpu cli_run_gpu 2>&1 | tail -8
  echo "== python tests"
  MOK_LIBRARY=$PWD/build/libmok.so timeout 200 python3 python/tests/test_mok.py moe_matches_reference_mega \
    backward_after_another_forward mega_forward_in_cuda_graph fp32_main_grad_accumulates \
    mega_bad_expert_id_reported_on_device 2>&1 | tail -8
  for v in ${SHARED_ORDER:-1 0 1 0}; do
    echo "== MOK_MEGA_SHARED=$v"
    MOK_MEGA_SHARED=$v timeout 150 build/mok bench layer --impl mega --gpus 1 --model "$MODELS" --tokens "$TOKENS" \
      --iters "${ITERS:-10}" --check-tokens 1 2>&1 | grep -E "\] forward"
  done
  echo "== nccl"
  timeout 150 build/mok bench layer --impl nccl --gpus 1 --model "$MODELS" --tokens "$TOKENS" --iters "${ITERS:-10}" \
    --check-tokens 0 --check-experts 0 2>&1 | grep -E "\] forward"
} 2>&1 | tee "$OUT/log"
