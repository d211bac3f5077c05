#!/usr/bin/env bash
# gpu-s36.sh — session 36's one device call: the build and the full C suite on the current
# tree (scripts/gpu-s33.sh "build full"), the hardware-queue experiment (scripts/gpu-s35.sh),
# then, on an H200 only (GEMM=1 forces it), `mok bench gemm` on issue 5's unmet lines, each
# in $REPS processes (processes differ by up to +-6%): qwen3.5 R320, deepseek-v4-pro R512, and
# Zipf 1.2 over balanced for qwen3.5 and deepseek-v4-pro. Logs under $OUT; short lines last.
# PREBUILT=1: build/mok and build/mok_tests came with the call (run's carry; built from this
# tree on the CPU machine, `make -q all build/mok_tests` clean there): no build here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s36-out}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
t0=$(date +%s)
B=build; [ "${PREBUILT:-0}" = 1 ] && [ -x build/mok_tests ] && [ -x build/mok ] && B=
mkdir -p "$OUT/s33" "$OUT/s35"; : > "$OUT/s33/log"; : > "$OUT/s35/log"
if [ "${GEMM_ONLY:-0}" != 1 ]; then  # GEMM_ONLY=1: the benchmarks alone
  OUT=$OUT/s33 SECTIONS="$B full" bash scripts/gpu-s33.sh > /dev/null 2>&1
  OUT=$OUT/s35 TARGETS=${B:+build/mok_tests} bash scripts/gpu-s35.sh > /dev/null 2>&1
fi
{
  if [[ "$GPU" == *H200* ]] || [ "${GEMM:-0}" = 1 ]; then
    for cfg in "qwen320:--model qwen3.5-397b-a17b" "dsv4512:--model deepseek-v4-pro --rows-per-expert 512" \
               "qwenzipf:--model qwen3.5-397b-a17b --routing zipf:1.2" "dsv4zipf:--model deepseek-v4-pro --routing zipf:1.2"; do
      for r in $(seq ${REPS:-2}); do
        echo "-- ${cfg%%:*} $r"
        timeout 120 build/mok bench gemm ${cfg#*:} --kinds gateup,down --iters 20 2>&1 | tail -n +3
      done
    done
  else echo "gemm: skipped ($GPU is not an H200; GEMM=1 forces it)"; fi
  echo "total: $(( $(date +%s) - t0 )) s"
} > "$OUT/gemm.log" 2>&1
cat "$OUT/s33/log" "$OUT/s35/log" "$OUT/gemm.log" > "$OUT/log"
tail -22 "$OUT/s33/log"; echo ==; cat "$OUT/s35/log"; echo ==; grep -vE "^\s*$" "$OUT/gemm.log" | tail -40
