#!/usr/bin/env bash
# gpu-ab-bins.sh — A/B/C... of several prebuilt `mok` binaries (run's carry) on `mok bench
# gemm` configurations, in turns, one process a run, so that each binary meets the same
# machine state. BINS: "name:path ..." (default base:build/mok-base new:build/mok); CFGS:
# "tag:bench options|..." (default Zipf 1.2 on four models); KINDS (default gateup,down);
# REPS rounds (default 2), stopping after a round past TMAX seconds (default 480); TRACE=1:
# then a gate+up tile trace of qwen3.5 Zipf per binary (trace-summary.py). Log: $OUT/log;
# the table last: config, binary, kind, ms, ratio to cuBLAS, and the uneven rows' time over
# the balanced rows' in the same process where the bench prints it.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/ab-bins}; mkdir -p "$OUT"
BINS=${BINS:-"base:build/mok-base new:build/mok"}
CFGS=${CFGS:-"qwenZ:--model qwen3.5-397b-a17b --routing zipf:1.2|dsZ:--model deepseek-v4-pro --routing zipf:1.2|kimiZ:--model kimi-k2.7-code --routing zipf:1.2|glmZ:--model glm-5.2 --routing zipf:1.2"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  for b in $BINS; do [ -x "${b#*:}" ] || echo "missing binary: ${b#*:}"; done
  IFS='|' read -ra C <<< "$CFGS"
  for r in $(seq ${REPS:-2}); do
    for cfg in "${C[@]}"; do
      for b in $BINS; do
        echo "== ${cfg%%:*} ${b%%:*} $r"
        timeout 120 ${b#*:} bench gemm ${cfg#*:} --kinds ${KINDS:-gateup,down} --vs-cublas-zipf off --iters 20 2>&1 |
          grep -E "^(gateup|down|dgrad|wgrad)|balanced rows|rror"
      done
    done
    [ "$SECONDS" -gt ${TMAX:-480} ] && { echo "stopped after round $r (time)"; break; }
  done
  if [ "${TRACE:-0}" = 1 ]; then
    for b in $BINS; do
      echo "== trace ${b%%:*}"
      timeout 60 ${b#*:} bench gemm --model qwen3.5-397b-a17b --routing zipf:1.2 --vs-balanced off --vs-cublas-zipf off \
        --kinds gateup --iters 5 --trace "$OUT/t-${b%%:*}.csv" > /dev/null 2>&1
      python3 scripts/trace-summary.py "$OUT/t-${b%%:*}.csv" 2>&1 | head -3
      gzip -f "$OUT/t-${b%%:*}.csv"
    done
  fi
} > "$OUT/log" 2>&1
grep -E "^missing|^stopped|^== trace|gateup: " "$OUT/log"
awk '/^== /{h=$2" "$3" "$4; next}
     /^(gateup|down|dgrad|wgrad)/{k=$1; for (i = 2; i <= NF && $i !~ /^E[0-9]/; ++i) k = k "_" $i
       n=NF; ms=$(n-6); rat=$(n-2); next}
     /balanced rows/{split($0,a,"in turn: "); split(a[2],b," "); printf "%s %-14s %s ms %s | over balanced %s\n", h, k, ms, rat, b[1]}' "$OUT/log"
