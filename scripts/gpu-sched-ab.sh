#!/usr/bin/env bash
# gpu-sched-ab.sh — balanced launches under the schedule rule (static round-robin with the
# stagger) against run-time tickets (`--sched tickets`), in turns, one process a run, ours /
# cuBLAS strided-batched. Session 44 moved the ticket after the tile's loads (the tiles of a
# weight block now start together); before that, tickets lost 3-8% on balanced rows
# (docs/PERF.md sessions 21, 41, 44) except deepseek-v4-pro R512 gate+up, where the stagger
# costs (session 41: tickets 0.951-0.964 of cuBLAS vs the rule's 0.918-0.934). If tickets now
# match static everywhere, that shape's line (650 TFLOP/s on an H200) may follow. Log:
# $OUT/log; a table last (shape variant kind: ms, ratio).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/sched-ab}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"q320:--model qwen3.5-397b-a17b|q512:--model qwen3.5-397b-a17b --rows-per-expert 512|kimi:--model kimi-k2.7-code|glm:--model glm-5.2|ds256:--model deepseek-v4-pro|ds512:--model deepseek-v4-pro --rows-per-expert 512"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  IFS='|' read -ra S <<< "$SHAPES"
  for r in $(seq "${REPS:-2}"); do
    for s in "${S[@]}"; do
      for v in "rule|" "tickets|--sched tickets"; do
        echo "== ${s%%:*} ${v%%|*} $r"
        timeout 120 build/mok bench gemm ${s#*:} ${v#*|} --kinds gateup,down --iters 20 2>&1 | grep -E "^(gateup|down)|rror"
      done
    done
  done
} > "$OUT/log" 2>&1
awk '/^== /{h=$2" "$3" "$4; next} /^(gateup|down)/{n=NF; printf "%-18s %-14s %s ms %s TFLOP/s %s\n", h, $1, $(n-6), $(n-5), $(n-2)}' "$OUT/log" |
  sort -k1,1 -k4,4 -k2,2 -s
