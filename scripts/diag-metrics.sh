#!/bin/bash
# diag-metrics.sh — named Nsight Compute metrics of the first launch of a kernel (regex) in
# `mok bench gemm` runs: tensor-pipe activity, shared-memory bank traffic, L2 and the L2 ->
# SM crossbar, DRAM. Which of the wanted metrics this ncu knows is read from
# `ncu --query-metrics` first (unknown names would fail the whole collection); the list
# used is printed. Arguments as diag-ncu.sh: "tag|kernel regex|bench options". Builds
# first unless NOBUILD=1. Log in $OUT/log.
# Example: scripts/diag-metrics.sh "ours down qwen R320|grouped_gemm|--model qwen3.5-397b-a17b --kinds down" \
#            "cuBLAS down qwen R320|nvjet|--model qwen3.5-397b-a17b --kinds down"
OUT=${OUT:-/tmp/diag-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
[ -n "$NOBUILD" ] || make -j16 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
NCU=/usr/local/cuda/bin/ncu
$NCU --query-metrics --chip gh100 > "$OUT/metrics.txt" 2>&1 || $NCU --query-metrics > "$OUT/metrics.txt" 2>&1
# base names wanted (a suffix is added below); kept where the query lists them
WANT="sm__pipe_tensor_op_gmma_cycles_active sm__inst_executed_pipe_tensor_op_gmma sm__throughput
l1tex__data_bank_reads l1tex__data_bank_writes l1tex__data_pipe_lsu_wavefronts_mem_shared l1tex__throughput
l1tex__m_xbar2l1tex_read_bytes lts__t_bytes lts__t_sectors_srcunit_tex lts__throughput lts__t_sector_hit_rate
dram__bytes_read dram__bytes_write dram__throughput gpc__cycles_elapsed sm__cycles_active smsp__cycles_active"
M=""
for w in $WANT; do
  if grep -qE "^ *$w( |$)" "$OUT/metrics.txt"; then
    case $w in
      *_rate) M="$M,$w.pct" ;;
      *throughput) M="$M,$w.avg.pct_of_peak_sustained_elapsed" ;;
      *bytes*) M="$M,$w.sum,$w.sum.per_second" ;;
      *cycles_elapsed|*cycles_active) M="$M,$w.max,$w.avg" ;;
      *) M="$M,$w.sum,$w.avg.pct_of_peak_sustained_elapsed" ;;
    esac
  else
    echo "(not known to this ncu: $w)"
  fi
done
M=${M#,}
echo "metrics: $M"
for spec in "$@"; do
  IFS='|' read -r tag k opts <<< "$spec"
  echo "== $tag"
  timeout 150 $NCU --clock-control none -k "regex:$k" -c 1 --metrics "$M" build/mok bench gemm $opts --iters 1 2>&1 |
    grep -vE "^==PROF==|^ *$" | grep -E "__|Duration|==ERR|rror" | cut -c1-140
done
