#!/usr/bin/env bash
# gpu-s37d.sh — session 37: the full C suite on the final tree, then the loopback tests
# (every test named *loopback*) alone, REPS times under 32 queues and REPS8 times under 8.
set -uo pipefail
OUT=${OUT:-/tmp/s37d}; mkdir -p "$OUT"
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 300 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(grep -E 'passed|failed' "$OUT/suite.log" | tail -1)"
grep -E "^FAIL" "$OUT/suite.log" | cut -c1-300
for q in 32 8; do
  n=${REPS:-8}; [ $q = 8 ] && n=${REPS8:-4}
  ok=0; bad=0
  for i in $(seq $n); do
    o=$(CUDA_DEVICE_MAX_CONNECTIONS=$q timeout 120 build/mok_tests loopback 2>&1); echo "$o" >> "$OUT/loop-$q.log"
    if echo "$o" | grep -qE "^[0-9]+ passed, 0 failed"; then ok=$((ok+1)); else bad=$((bad+1)); echo "$o" | grep -E "^FAIL" | head -2 | cut -c1-250; fi
  done
  echo "queues $q: $ok of $n runs of the loopback tests all passed ($(echo "$o" | grep -E 'passed' | tail -1))"
done
