#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
{
make -j"$(nproc)" all 2>&1 | grep -E " error" | head
echo "== standalone GEMMs at EP2 expert counts"
for a in "--hidden 6144 --inter 2048 --experts 128 --rows-per-expert 512" "--hidden 7168 --inter 2048 --experts 128 --rows-per-expert 1024" "--hidden 7168 --inter 3072 --experts 192 --rows-per-expert 256"; do
  timeout 60 build/mok bench gemm $a --iters 5 2>&1 | grep -E "^(gateup|down)" | awk -v m="$a" '{printf "%-60s %-14s ours %6s cuBLAS %6s ratio %s\n", m, $1, $(NF-5), $(NF-3), $(NF-2)}'
done
echo "== layer profile"
for model in glm-5.2 deepseek-v3; do for impl in nccl baseline; do
  echo "-- $model $impl"
  MOK_BASELINE_PROFILE=1 timeout 60 build/mok bench layer --impl $impl --model $model --tokens 8192 --iters 3 --warmup 2 --check-tokens 0 --check-experts 0 2>&1 | grep "rank 0" | tail -3
done; done
} 2>&1 | tee $OUT/log
