#!/usr/bin/env bash
# gpu-queues.sh — what CUDA_DEVICE_MAX_CONNECTIONS costs the one-GPU layer: `mok bench layer`
# (every implementation, same data) in a process under each of $CONNS (default "8 32 1 8":
# CUDA's default, CUDA's most, Megatron-LM's setting, the default again for the drift), the
# model(s) $MODELS at $TOKENS tokens. Full log in $OUT/log, the timing rows last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/queues-out}; mkdir -p "$OUT"
{
  date -u; nvidia-smi -L
  [ -x build/mok ] || make -j"$(nproc)" build/mok > "$OUT/build.log" 2>&1 || echo "BUILD FAILED"
  for q in ${CONNS:-8 32 1 8}; do
    echo "-- CUDA_DEVICE_MAX_CONNECTIONS=$q"
    CUDA_DEVICE_MAX_CONNECTIONS=$q timeout ${BENCH_S:-120} build/mok bench layer --impl ${IMPLS:-mega,nccl,baseline} --gpus 1 \
      --model ${MODELS:-qwen3.5-397b-a17b} --tokens ${TOKENS:-8192} --iters ${ITERS:-10} --check-tokens 1 2>&1
    echo "rc $?"
  done
} 2>&1 | tee "$OUT/log" | grep -vE "^\s*$" | tail -${TAIL:-60}
