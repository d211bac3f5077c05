#!/usr/bin/env bash
# gpu-next.sh — one device call for what session 42 left open (docs/PERF.md): (1) the full C
# suite and the Python binding's tests; (2) on an H200 only, issue 5's lines (gpu-s36.sh's
# GEMM part, REPS runs) with session 41-42's rows-as-M 128-row tiles (gate+up; down on the
# 128-row ring) and session 42's tile cut (one more tile only where the equal tiles keep >=
# 128 rows), all measured on H100s only, and the gate+up tile orientations at R512 / R256
# (scripts/gpu-rowsm.sh: row-grouped / token rows as N / rows as M, in turns); (3) on any
# GPU, the random-routing table (scripts/gpu-random.sh: R +- sqrt(R) rows an expert against
# exactly balanced rows, and cuBLAS on the same rows; scripts/gpu-random-knobs.sh: the
# schedule knobs under it; scripts/gpu-ddtok.sh: down dgrad on token tiles under it; the
# last two skipped when the call has run long); (4) where carried, branch exp/ddown-defer's
# build-dd/{mok,mok_tests} (scripts/gpu-ddefer.sh). PREBUILT=1: build/mok,
# build/mok_tests, build/libmok.so carried (run's carry), no build here. Short lines last;
# logs under $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/next-out}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if [ "${PREBUILT:-0}" != 1 ] || [ ! -x build/mok ] || [ ! -x build/mok_tests ] || [ ! -f build/libmok.so ]; then
  make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
fi
timeout 300 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(grep -E 'passed|failed' "$OUT/suite.log" | tail -1)"
grep -E "^FAIL|host steps|rank [0-9]:" "$OUT/suite.log" | cut -c1-300
MOK_LIBRARY=$PWD/build/libmok.so timeout 300 python3 python/tests/test_mok.py > "$OUT/python.log" 2>&1
echo "python rc=$? $(grep -E 'passed' "$OUT/python.log" | tail -1)"; grep -E "FAIL" "$OUT/python.log" | cut -c1-300
if [[ "$GPU" == *H200* ]]; then
  OUT=$OUT/s36 PREBUILT=1 GEMM_ONLY=1 REPS=${REPS:-2} bash scripts/gpu-s36.sh > /dev/null 2>&1
  grep -E "^(--|gateup|down)|zipf / balanced" "$OUT/s36/gemm.log" | cut -c1-130
  OUT=$OUT/rowsm TESTS=0 REPS=2 VARIANTS="grouped token-n token-m" \
    SHAPES="--model deepseek-v4-pro --rows-per-expert 512|--model deepseek-v4-pro|--model qwen3.5-397b-a17b --rows-per-expert 512" \
    bash scripts/gpu-rowsm.sh > /dev/null 2>&1
  grep -E "^==|^gateup" "$OUT/rowsm/log" | paste - - | sed 's/  */ /g' | cut -c1-150
fi
# branch exp/ddown-defer's binaries, where carried (build-dd/mok, build-dd/mok_tests): down
# dgrad's epilogue under the next tile's first k-blocks against the usual loop
if [ -x build-dd/mok ]; then
  OUT=$OUT/ddefer BIN=build-dd/mok TESTS=build-dd/mok_tests REPS=1 DEFER="on:2 on:3 on:4" bash scripts/gpu-ddefer.sh
fi
# the random-routing table (session 42) and the schedule knobs under it, on whatever GPU came
OUT=$OUT/random bash scripts/gpu-random.sh > /dev/null 2>&1
grep -E "^(gateup|down)|balanced rows" "$OUT/random/log" | sed 's/  */ /g' | cut -c1-130
if [ "$SECONDS" -lt 380 ]; then OUT=$OUT/rknobs bash scripts/gpu-random-knobs.sh; else echo "skipped: gpu-random-knobs.sh (time)"; fi
# down dgrad on token tiles under random routing (a host-count rule could pick them where the
# rows are near-balanced: +13% at the EP1 layer's balanced load in session 41, -8..-27% Zipf)
if [ "$SECONDS" -lt 440 ]; then
  OUT=$OUT/ddtok REPS=1 SHAPES="--hidden 4096 --inter 1024 --experts 512 --rows-per-expert 160 --routing random|--model qwen3.5-397b-a17b --routing random|--model kimi-k2.7-code --routing random|--model glm-5.2 --routing random|--model deepseek-v4-pro --routing random" \
    bash scripts/gpu-ddtok.sh > /dev/null 2>&1
  grep -E "^==|^dgrad down" "$OUT/ddtok/log" | paste - - | sed 's/  */ /g' | cut -c1-170
else echo "skipped: gpu-ddtok.sh (time)"; fi
