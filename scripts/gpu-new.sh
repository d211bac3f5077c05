#!/usr/bin/env bash
# gpu-new.sh — the first device call after session 31: its probe and the GPU tests it wrote
# without a device (the expert-parallel schedule and data movement with simulated ranks,
# loopback ranks on one GPU, the two-streams probe), then the full C suite (TESTS=" ") or
# none (TESTS=""). Log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/new-out}; mkdir -p "$OUT"
{
  date -u; nvidia-smi -L; echo "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-(unset)}"
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  echo "== mok bench stream --two-streams"
  timeout 60 build/mok bench stream --two-streams 2>&1 | tail -12
  echo "== new GPU tests"
  timeout 240 build/mok_tests schedule_device_ep_matches_reference ep_push_to_source_slots ep_pull_dy_from_sources \
    cli_bench_stream_two_streams comm_loopback_ranks_1gpu 2>&1 | tail -20
  if [ -n "${TESTS- }" ]; then
    echo "== C tests: ${TESTS- }"
    timeout "${TEST_S:-330}" stdbuf -oL build/mok_tests ${TESTS- } 2>&1 | grep -vE "^ok " | tail -30
  fi
} 2>&1 | tee "$OUT/log"
