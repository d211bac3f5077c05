#!/usr/bin/env bash
# gpu-next.sh — one device call for what sessions 43-44 left open (docs/PERF.md; session 44
# landed tickets taken after the tile's loads, measured on H100s only): (1) on an H200 only,
# first (so that a call cut short still has them), issue 5's lines (gpu-s36.sh's GEMM part,
# REPS runs) and the gate+up tile orientations at R512 / R256 (scripts/gpu-rowsm.sh:
# row-grouped / token rows as N / rows as M, in turns, one round); (2) on any GPU, balanced
# launches under the static rule against tickets (scripts/gpu-sched-ab.sh: with tickets
# taken late, can tickets replace the stagger where it costs, deepseek-v4-pro R512?);
# (3) the full C suite and the Python binding's tests; (4) the random-routing table
# (scripts/gpu-random.sh) and Zipf gate+up tile traces (scripts/gpu-s44.sh), while time
# lasts. PREBUILT=1: build/mok, build/mok_tests, build/libmok.so carried (run's carry), no
# build here. Short lines last; logs under $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/next-out}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if [ "${PREBUILT:-0}" != 1 ] || [ ! -x build/mok ] || [ ! -x build/mok_tests ] || [ ! -f build/libmok.so ]; then
  make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
fi
if [[ "$GPU" == *H200* ]]; then
  OUT=$OUT/s36 PREBUILT=1 GEMM_ONLY=1 REPS=${REPS:-2} bash scripts/gpu-s36.sh > /dev/null 2>&1
  grep -E "^(--|gateup|down)|zipf / balanced" "$OUT/s36/gemm.log" | cut -c1-130
  OUT=$OUT/rowsm TESTS=0 REPS=1 VARIANTS="grouped token-n token-m" \
    SHAPES="--model deepseek-v4-pro --rows-per-expert 512|--model deepseek-v4-pro|--model qwen3.5-397b-a17b --rows-per-expert 512" \
    bash scripts/gpu-rowsm.sh > /dev/null 2>&1
  grep -E "^==|^gateup" "$OUT/rowsm/log" | paste - - | sed 's/  */ /g' | cut -c1-150
fi
OUT=$OUT/sched bash scripts/gpu-sched-ab.sh | sed 's/  */ /g'
timeout 300 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(grep -E 'passed|failed' "$OUT/suite.log" | tail -1)"
grep -E "^FAIL|host steps|rank [0-9]:" "$OUT/suite.log" | cut -c1-300
MOK_LIBRARY=$PWD/build/libmok.so timeout 300 python3 python/tests/test_mok.py > "$OUT/python.log" 2>&1
echo "python rc=$? $(grep -E 'passed' "$OUT/python.log" | tail -1)"; grep -E "FAIL" "$OUT/python.log" | cut -c1-300
# the random-routing table (session 42), on whatever GPU came, then Zipf gate+up traces
if [ "$SECONDS" -lt 470 ]; then
  OUT=$OUT/random bash scripts/gpu-random.sh > /dev/null 2>&1
  grep -E "^(gateup|down)|balanced rows" "$OUT/random/log" | sed 's/  */ /g' | cut -c1-130
else echo "skipped: gpu-random.sh (time)"; fi
if [ "$SECONDS" -lt 540 ]; then OUT=$OUT/trace PREBUILT=1 LINES=0 bash scripts/gpu-s44.sh | grep -v "^gpu:"; else echo "skipped: traces (time)"; fi
