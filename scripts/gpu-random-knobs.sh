#!/usr/bin/env bash
# gpu-random-knobs.sh — the forward token tiles' schedule knobs under random routing
# (`--routing random:SEED`, R +- sqrt(R) rows an expert, as a balanced router gives random
# tokens; session 42): the library's rules (tickets, as for any uneven tiles; the experts
# with most rows first) against the static schedule, experts in index order, and the
# 128-row ring (tiles cut at <= 128 rows), ours ms, one process a run, in turns, for SEEDS.
# Whether the rules chosen on exactly balanced and on Zipf rows suit near-balanced ones.
# Carry build/mok. Log: $OUT/log; a line a run (shape, seed, variant | kind ms ratio).
set -uo pipefail
OUT=${OUT:-/tmp/rknobs}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model kimi-k2.7-code|--model deepseek-v4-pro|--model glm-5.2"}
VARIANTS=${VARIANTS:-"rule|--sched static|--expert-order index|--tok-ring 128"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  IFS='|' read -ra S <<< "$SHAPES"
  IFS='|' read -ra V <<< "$VARIANTS"
  for s in "${S[@]}"; do
    for seed in ${SEEDS:-1 2}; do
      for v in "${V[@]}"; do
        opt=$v; [ "$v" = rule ] && opt=""
        echo "== $s random:$seed $v"
        timeout 120 build/mok bench gemm $s --routing random:$seed --vs-balanced off --vs-cublas-zipf off \
          --kinds gateup,down --iters 20 $opt 2>&1 | grep -E "^(down|gateup)|rror|FAIL"
      done
    done
  done
} > "$OUT/log" 2>&1
awk '/^==/{h=$0; next} /^(gateup|down)/{n=NF; print substr(h,4) " | " $1 " " $(n-6) " ms " $(n-2)}' "$OUT/log" \
  | sed 's/--model //;s/gateup+swiglu/gu/'
