#!/bin/bash
# diag-ncu.sh — Nsight Compute speed-of-light, memory and warp-state sections of the first
# launch of a kernel (regex) in `mok bench gemm` runs. Arguments: "tag|kernel regex|bench
# options", e.g. "ours down qwen R320|grouped_gemm|--model qwen3.5-397b-a17b --kinds down"
# or "cuBLAS down|nvjet|--model qwen3.5-397b-a17b --kinds down". Builds first unless
# NOBUILD=1. Log in $OUT/log.
OUT=${OUT:-/tmp/diag-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
[ -n "$NOBUILD" ] || make -j16 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
NCU=/usr/local/cuda/bin/ncu
KEEP="Duration|Throughput|Pipe|Issue Slots|Warp Cycles Per Issued|Eligible|L2 Hit|L1/TEX Hit|SM Frequency|Executed Ipc|Stall|Bank|Busy"
for spec in "$@"; do
  IFS='|' read -r tag k opts <<< "$spec"
  echo "== $tag"
  timeout 150 $NCU --clock-control none -k "regex:$k" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section WarpStateStats build/mok bench gemm $opts --iters 1 2>&1 | \
    grep -E "$KEEP" | cut -c1-120
done
