#!/usr/bin/env bash
# gpu-trace-random.sh — where gate+up loses under random routing (session 43: random /
# balanced 0.885 at qwen3.5 R320, 0.903 at deepseek-v4-pro R256 on an H100): the tile trace
# (`--trace`, diagnostics instance) of one forward launch on balanced rows, on random rows,
# and on balanced rows by tickets (`--sched tickets`), summarised by scripts/trace-summary.py;
# then the same three timed (lean instances), one process a run, in turns. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/trace-random}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model deepseek-v4-pro"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  IFS='|' read -ra S <<< "$SHAPES"
  i=0
  for s in "${S[@]}"; do
    i=$((i + 1))
    for v in "balanced|" "random|--routing random:1" "tickets|--sched tickets"; do
      name=${v%%|*}; opt=${v#*|}
      timeout 120 build/mok bench gemm $s $opt --vs-balanced off --vs-cublas-zipf off --kinds ${KINDS:-gateup} \
        --iters 5 --trace "$OUT/t$i-$name.csv" > /dev/null 2>&1
      python3 scripts/trace-summary.py "$OUT/t$i-$name.csv" 2>&1 | head -${TLINES:-40}
    done
    for r in 1 2; do
      for v in "balanced|" "random|--routing random:1" "tickets|--sched tickets" "random-static|--routing random:1 --sched static"; do
        echo "== $s ${v%%|*} ($r)"
        timeout 120 build/mok bench gemm $s ${v#*|} --vs-balanced off --vs-cublas-zipf off --kinds ${KINDS:-gateup} \
          --iters 20 2>&1 | grep -E "^(gateup|down)|rror|FAIL"
      done
    done
  done
} > "$OUT/log" 2>&1
grep -E "^== .*: " "$OUT/log" | sed "s|$OUT/||"
awk '/^== /{h=$0; next} /^(gateup|down)/{n=NF; print substr(h,4) " | " $1 " " $(n-6) " ms " $(n-2)}' "$OUT/log" | sed 's/--model //'
