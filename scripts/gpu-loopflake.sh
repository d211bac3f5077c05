#!/usr/bin/env bash
# gpu-loopflake.sh — how often comm_loopback_ranks_1gpu times out, run alone N times a
# setting: binaries build/mok_tests_<v> for v in VARIANTS (default "a b"), under the queue
# counts in QUEUES (CUDA_DEVICE_MAX_CONNECTIONS, default "32 8"). Prints pass counts, and for
# the first SHOW failures (default 3) their FAIL line, each rank's host steps and control block.
# Session 37: A = main's mok_tests, B = the same with 74322ca's host barrier in run_patterns
# (`git show 74322ca -- tests/test_comm.cu | git apply`, `make build/mok_tests`, copy, revert).
# Session 38: A and B with the control-block dump on failure (tests/test_comm.cu ctrl_print).
set -uo pipefail
OUT=${OUT:-/tmp/loopflake}; mkdir -p "$OUT"
N=${N:-20}
for q in ${QUEUES:-32 8}; do
  for v in ${VARIANTS:-a b}; do
    pass=0; fail=0; shown=0
    for i in $(seq $N); do
      o=$(CUDA_DEVICE_MAX_CONNECTIONS=$q timeout 60 build/mok_tests_$v comm_loopback_ranks_1gpu 2>&1)
      echo "$o" >> "$OUT/loopflake-$v-q$q.log"
      if echo "$o" | grep -q "^1 passed"; then pass=$((pass+1)); else
        fail=$((fail+1))
        if [ $shown -lt ${SHOW:-3} ]; then
          shown=$((shown+1)); echo "   run $i of $v, queues $q:"
          echo "$o" | grep -E "FAIL|host steps|rank [0-9]:" | cut -c1-260
        fi
      fi
    done
    echo "queues $q binary $v: $pass passed, $fail failed" | tee -a "$OUT/summary"
  done
done
