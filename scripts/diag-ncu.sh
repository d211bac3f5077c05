#!/bin/bash
# diag-ncu.sh — Nsight Compute speed-of-light of our gate+up kernel (qwen3.5 R320 with
# tail tiles, R384 without) and of cuBLAS's kernel for the same work (first nvjet launch).
OUT=${OUT:-/tmp/diag-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
make -j16 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
NCU=/usr/local/cuda/bin/ncu
KEEP="Duration|Throughput|Pipe|Issue Slots|Warp Cycles Per Issued|Eligible|L2 Hit|DRAM Frequency|SM Frequency|Executed Ipc|Stall|Bank"
prof() { local tag=$1 k=$2; shift 2
  echo "== $tag"
  timeout 150 $NCU --clock-control none -k "regex:$k" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section WarpStateStats build/mok bench gemm "$@" --iters 1 2>&1 | \
    grep -E "$KEEP" | cut -c1-120
}
prof "ours gate+up qwen R320" "grouped_gemm" --model qwen3.5-397b-a17b --rows-per-expert 320
prof "ours gate+up qwen R384" "grouped_gemm" --model qwen3.5-397b-a17b --rows-per-expert 384
prof "cuBLAS (first nvjet) qwen R320" "nvjet" --model qwen3.5-397b-a17b --rows-per-expert 320
