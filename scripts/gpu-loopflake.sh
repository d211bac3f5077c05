#!/usr/bin/env bash
# gpu-loopflake.sh — how often comm_loopback_ranks_1gpu times out, run alone N times a
# setting: binaries A (build/mok_tests_a) and B (build/mok_tests_b), under 32 and 8 hardware
# queues (CUDA_DEVICE_MAX_CONNECTIONS). Prints pass counts and the first failure of each.
# Session 37: A = main's mok_tests, B = the same with 74322ca's host barrier in run_patterns
# (`git show 74322ca -- tests/test_comm.cu | git apply`, `make build/mok_tests`, copy, revert).
set -uo pipefail
OUT=${OUT:-/tmp/loopflake}; mkdir -p "$OUT"
N=${N:-20}
for q in 32 8; do
  for v in ${VARIANTS:-a b}; do
    pass=0; fail=0; first=""
    for i in $(seq $N); do
      o=$(CUDA_DEVICE_MAX_CONNECTIONS=$q timeout 60 build/mok_tests_$v comm_loopback_ranks_1gpu 2>&1)
      if echo "$o" | grep -q "^1 passed"; then pass=$((pass+1)); else fail=$((fail+1)); [ -z "$first" ] && first=$(echo "$o" | grep -E "FAIL" | head -1 | cut -c1-300); fi
    done
    echo "queues $q binary $v: $pass passed, $fail failed ${first:+| $first}" | tee -a "$OUT/log"
  done
done
