#!/usr/bin/env bash
# gpu-s33.sh — session 33's device calls, by sections (SECTIONS="build gemm tests ..."):
#   build  make all and the tests (errors and warnings shown)
#   gemm   scripts/gpu-gemm.sh, every shape of issue 5 (log in $OUT/gemm/log); by default only
#          on an H200 (GEMM=1 forces it)
#   tests  the loopback comm test (3 runs), then `mok_tests ep_ schedule_ layer_mega`
#   ctas   the megakernel layer tests at one rank with MOK_MEGA_CTAS = 0 (the rule) and odd
#          counts (does the megakernel alone hang at some CTA count?)
#   loop4  layer_mega_matches_reference_loopback five times (the 4-rank flake)
#   lbctas the loopback layer tests with MOK_MEGA_CTAS = 130 and 128 (a share of them a rank:
#          65 / 32 at 2 / 4 ranks, which timed out in session 32)
#   lazy   lbctas's first test with CUDA_MODULE_LOADING=LAZY (session 34: mok loads its kernels ahead)
#   full   the full C suite
#   ep1    mok bench layer, mega beside nccl, qwen3.5 T=8192, one GPU
#   warm   the L2 warmer experiment (scripts/exp/l2-warm.diff patched into the tree; last)
# Everything goes to $OUT/log; the short lines last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s33-out}; mkdir -p "$OUT"
S=" ${SECTIONS:-build tests ctas ep1} "
has() { [[ "$S" == *" $1 "* ]]; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{
  date -u; nvidia-smi -L; echo "sections:$S"
  if has build; then
    t0=$(date +%s)
    make -j"$(nproc)" all build/mok_tests > "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; }
    grep -v "^\S*nvcc " "$OUT/build.log" | grep -E " error|warning" | head -20
    echo "build: $(( $(date +%s) - t0 )) s"
  fi
  if has gemm && { [[ "$GPU" == *H200* ]] || [ "${GEMM:-0}" = 1 ]; }; then
    t0=$(date +%s)
    OUT=$OUT/gemm ITERS=${ITERS:-20} bash scripts/gpu-gemm.sh > /dev/null 2>&1
    sed -n '/== tests/,$p' "$OUT/gemm/log" | grep -vE "^(-- |rc 0)"
    echo "gemm: $(( $(date +%s) - t0 )) s"
  elif has gemm; then echo "gemm: skipped ($GPU is not an H200; GEMM=1 forces it)"; fi
  if has tests; then
    t0=$(date +%s)
    for i in 1 2 3; do timeout 60 build/mok_tests comm_loopback_ranks_1gpu 2>&1 | grep -E "^(ok|FAIL)"; done
    timeout 300 build/mok_tests ep_ schedule_ layer_mega comm_loopback_loads 2>&1 | grep -vE "^ok " | tail -20
    echo "tests: $(( $(date +%s) - t0 )) s"
  fi
  if has ctas; then
    for c in ${CTAS:-0 131 66 65 50 49 33 25}; do
      echo "-- MOK_MEGA_CTAS=$c"
      MOK_MEGA_CTAS=$c timeout 60 build/mok_tests layer_mega_matches_reference_1gpu layer_mega_bitwise_nccl_1gpu 2>&1 | grep -E "^(ok|FAIL)|rror|timed out|passed" | head -6
    done
  fi
  if has loop4; then
    for i in 1 2 3 4 5; do timeout 90 build/mok_tests layer_mega_matches_reference_loopback 2>&1 | grep -E "^(ok|FAIL)|rror|timed out" | head -4; done
  fi
  if has lbctas; then
    for c in ${LBCTAS:-130 128}; do
      echo "-- MOK_MEGA_CTAS=$c (loopback)"
      MOK_MEGA_CTAS=$c timeout 120 build/mok_tests layer_mega_matches_reference_loopback layer_mega_recv_capacity_loopback 2>&1 | grep -E "^(ok|FAIL)|rror|timed out|passed" | head -8
    done
  fi
  if has lazy; then
    for c in ${LBCTAS:-130 128}; do
      echo "-- MOK_MEGA_CTAS=$c (loopback) CUDA_MODULE_LOADING=LAZY"
      CUDA_MODULE_LOADING=LAZY MOK_MEGA_CTAS=$c timeout 120 build/mok_tests layer_mega_matches_reference_loopback 2>&1 | grep -E "^(ok|FAIL)|rror|timed out|passed" | head -8
    done
  fi
  if has full; then
    t0=$(date +%s)
    echo "== full C suite"; timeout ${FULL_S:-330} stdbuf -oL build/mok_tests 2>&1 | grep -vE "^ok " | tail -30
    echo "full: $(( $(date +%s) - t0 )) s"
  fi
  if has ep1; then
    timeout 200 build/mok bench layer --impl mega,nccl --gpus 1 --model qwen3.5-397b-a17b --tokens 8192 --iters 20 2>&1 | tail -6
  fi
  if has warm && patch -p1 -s < scripts/exp/l2-warm.diff; then
    CUDA_MODULE_LOADING=EAGER REPS=${REPS:-1} bash scripts/gpu-warm.sh 2>&1 | grep -vE "^(name|NVIDIA)" | tail -40
  fi
} 2>&1 | tee "$OUT/log"
