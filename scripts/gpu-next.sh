#!/usr/bin/env bash
# gpu-next.sh — the next device call (session 46; docs/PERF.md "Session 45"): on an H200
# first, issue 5's lines; then, on any GPU, the split mix order's classes taken in reverse
# (MOK_EXP_MIXREV, build variants) against this tree on Zipf 1.2, in turns, with tile traces
# (both by scripts/gpu-s45.sh); then the full C suite while time lasts. Before the call, on
# the CPU machine: make all build/mok_tests && bash scripts/build-mixrev.sh; carry
# build/mok, build/mok_tests, build-r1/mok, build-r2/mok. Logs under $OUT; short lines last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/next-out}; mkdir -p "$OUT"
OUT=$OUT/s45 bash scripts/gpu-s45.sh
if [ "$SECONDS" -lt 470 ] && [ -x build/mok_tests ]; then
  timeout 120 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(grep -E 'passed|failed' "$OUT/suite.log" | tail -1)"
  grep -E "^FAIL" "$OUT/suite.log" | cut -c1-300
else echo "skipped: the suite (time)"; fi
