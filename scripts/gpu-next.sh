#!/usr/bin/env bash
# gpu-next.sh — one device call for what session 41 left open (docs/PERF.md): (1) the full C
# suite and the Python binding's tests; (2) on an H200 only, issue 5's lines (gpu-s36.sh's
# GEMM part, REPS runs) with the rows-as-M 128-row gate+up tiles (on by rule since a3321c0,
# measured on H100s only), and the gate+up tile orientations at R512 / R256 on the H200
# (scripts/gpu-rowsm.sh: row-grouped / token rows as N / rows as M, in turns): whether the
# row-grouped tiles' lead at deepseek-v4-pro R512 (0.962 against 0.933 on an H100) holds
# there. PREBUILT=1: build/mok, build/mok_tests, build/libmok.so carried (run's carry), no
# build here. Short lines last; logs under $OUT. (3) On any GPU, where their binaries are
# carried: branch exp/gu-ring128's build-gr/mok (gate+up on the 128-row ring, `--tok-ring-gu
# 128`) and exp/down-rows-m's build-dn/mok (`--dn-tiles token-m`; its bitwise test needs
# build-dn/mok_tests: scripts/gpu-dnrows.sh there), each against this tree's build/mok in
# turns. Carry at most 64 MiB: build/{mok,mok_tests,libmok.so}, build-gr/mok, build-dn/mok.
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
for x in "build-gr/mok|--tok-ring-gu 128|gateup|--model qwen3.5-397b-a17b --rows-per-expert 512,--model deepseek-v4-pro --rows-per-expert 512" \
         "build-dn/mok|--dn-tiles token-m|down|--model qwen3.5-397b-a17b --rows-per-expert 512,--model glm-5.2,--model deepseek-v4-pro,--model qwen3.5-397b-a17b"; do
  IFS='|' read -r bin opt kind shapes <<< "$x"
  [ -x "$bin" ] || continue
  IFS=',' read -ra S <<< "$shapes"
  for s in "${S[@]}"; do
    for r in 1 2; do
      for v in main branch; do
        if [ $v = main ]; then b=build/mok; o=""; else b=$bin; o=$opt; fi
        printf "%-8s %-55s " "$v" "$s"
        timeout 60 $b bench gemm $s --kinds $kind $o --iters 20 2>&1 | grep -E "^(gateup|down)" | sed 's/  */ /g' | cut -c1-90 | tr -d '\n'; echo
      done
    done
  done
done 2>&1 | tee "$OUT/branches.log"
