#!/usr/bin/env bash
# gpu-s35.sh — session 35: do loopback ranks' waiting kernels meet in one hardware work
# queue? The loopback comm test and the loopback megakernel layer test, standalone
# processes, under CUDA_DEVICE_MAX_CONNECTIONS 8 (CUDA's default; mok_tests sets 32 where the
# variable is unset, so 8 is named), 32 and 1 (every stream in one queue:
# kernels that wait for each other must then time out); CONNS="value:runs ...". Then the one-GPU
# layer and EP tests under CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM's setting; ONE=
# names them, ONE=" " skips). Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s35-out}; mkdir -p "$OUT"
{
  date -u; nvidia-smi -L
  t0=$(date +%s)
  T=${TARGETS-build/mok_tests}  # TARGETS="": no build (binaries carried)
  [ -n "$T" ] && { make -j"$(nproc)" $T > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; }; }
  echo "build: $(( $(date +%s) - t0 )) s"
  for cr in ${CONNS:-8:3 32:3 1:1}; do  # value:runs
    conn=${cr%:*}
    echo "-- CUDA_DEVICE_MAX_CONNECTIONS=$conn"
    for i in $(seq ${cr#*:}); do
      if [ "$conn" = unset ]; then env -u CUDA_DEVICE_MAX_CONNECTIONS timeout 60 build/mok_tests ${TESTS:-comm_loopback_ranks_1gpu} 2>&1 | grep -E "^(ok|FAIL)" | cut -c1-420
      else CUDA_DEVICE_MAX_CONNECTIONS=$conn timeout 60 build/mok_tests ${TESTS:-comm_loopback_ranks_1gpu} 2>&1 | grep -E "^(ok|FAIL)" | cut -c1-420; fi
    done
  done
  [ -n "${LAYER32:-1}" ] && { echo "-- CUDA_DEVICE_MAX_CONNECTIONS=32: layer_mega_matches_reference_loopback";
    CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 60 build/mok_tests layer_mega_matches_reference_loopback 2>&1 | grep -E "^(ok|FAIL)" | cut -c1-420; }
  ONE=${ONE-_1gpu ep_}
  if [ -n "${ONE// /}" ]; then  # what a Megatron-style process (one queue) meets
    echo "-- CUDA_DEVICE_MAX_CONNECTIONS=1: $ONE"
    CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 300 build/mok_tests $ONE 2>&1 | grep -vE "^ok " | cut -c1-250
  fi
} 2>&1 | tee "$OUT/log"
