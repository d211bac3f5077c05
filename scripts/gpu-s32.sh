#!/usr/bin/env bash
# gpu-s32.sh — session 32's first checks: the loopback fix (comm_loopback_ranks_1gpu, several
# seeds), the expert-parallel GPU tests (the megakernel reading every source's rows among
# them), the megakernel layer tests at EP1, mega beside nccl at qwen3.5 T=8192 (EP1 unchanged?),
# then (WARM=1: branch exp/l2-warm as a diff, scripts/exp/l2-warm.diff, patched into the tree)
# the L2 warmer experiment. FULL=0 skips the full C suite (run before the bench).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s32-out}; mkdir -p "$OUT"
{
  date -u; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  for i in 1 2 3 4 5 6; do timeout 60 build/mok_tests comm_loopback_ranks_1gpu 2>&1 | grep -E "^(ok|FAIL)"; done
  timeout 300 build/mok_tests ep_ schedule_ layer_mega 2>&1 | tail -14
  if [ "${FULL:-1}" = 1 ]; then echo "== full C suite"; timeout 330 stdbuf -oL build/mok_tests 2>&1 | grep -vE "^ok " | tail -30; fi
  timeout 200 build/mok bench layer --impl mega,nccl --gpus 1 --model qwen3.5-397b-a17b --tokens 8192 --iters 20 2>&1 | tail -6
  if [ "${WARM:-0}" = 1 ] && patch -p1 -s < scripts/exp/l2-warm.diff; then REPS=1 bash scripts/gpu-warm.sh 2>&1 | grep -vE "^(name|NVIDIA)" | tail -40; fi
} 2>&1 | tee "$OUT/log"
