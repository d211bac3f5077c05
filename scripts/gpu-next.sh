#!/usr/bin/env bash
# gpu-next.sh — one device call for what session 37 left open (docs/PERF.md, "Session 37"):
# (1) scripts/probe-hostcalls.cu under 32 and 8 hardware queues (which host calls wait for
# another thread's running kernel; which fresh stream shares its queue); (2) the full C suite
# (its loopback test prints each rank's host steps if it times out); (3) on an H200 only,
# issue 5's lines (gpu-s36.sh's GEMM part) and, where build/exp-mok-l2pf exists (branch
# exp/l2-pf-thread's `mok`), its prefetch line there. PREBUILT=1: build/mok, build/mok_tests
# carried (run's carry), no build here. Short lines last; logs under $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/next-out}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if [ "${PREBUILT:-0}" != 1 ] || [ ! -x build/mok ] || [ ! -x build/mok_tests ]; then
  make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
fi
nvcc -O2 -arch=sm_90a -o build/probe-hostcalls scripts/probe-hostcalls.cu -lpthread > "$OUT/probe-build.log" 2>&1 &&
  for q in 32 8; do for c in 1 132; do CUDA_DEVICE_MAX_CONNECTIONS=$q timeout 120 build/probe-hostcalls 1000 40 $c 2>&1 | tee -a "$OUT/probe.log"; done; done
timeout 300 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(grep -E 'passed|failed' "$OUT/suite.log" | tail -1)"
grep -E "^FAIL|host steps|rank [0-9]:" "$OUT/suite.log" | cut -c1-300
if [[ "$GPU" == *H200* ]]; then
  OUT=$OUT/s36 PREBUILT=1 GEMM_ONLY=1 REPS=${REPS:-2} bash scripts/gpu-s36.sh > /dev/null 2>&1
  grep -E "^(--|gateup|down)|zipf / balanced" "$OUT/s36/gemm.log" | cut -c1-130
  if [ -x build/exp-mok-l2pf ]; then
    for v in "ctl:8,0" "pf6:6"; do
      echo "-- l2pf ${v%%:*}"
      timeout 100 build/exp-mok-l2pf bench gemm --model qwen3.5-397b-a17b --kinds down --iters 20 --seed 7 \
        --l2-pf ${v#*:} 2>&1 | grep -E "^down"
    done
  fi
fi
