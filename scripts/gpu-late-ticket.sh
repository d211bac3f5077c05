#!/usr/bin/env bash
# gpu-late-ticket.sh — session 44: the standalone kernel's producer takes its next ticket
# after it has issued the current tile's loads, not before (the fused FFN and the megakernel
# already do): a CTA then takes a ticket about a ring's depth before it can start the tile,
# not a whole tile before, so the tiles of one weight block start together under uneven
# routing. A/B of two binaries (BASE, default build/mok-base: the parent's; build/mok: this
# tree's) in turns, one process a run, on random and Zipf 1.2 routing (balanced launches
# run the static schedule: no tickets, unchanged); then the full suite of this tree and a
# tile trace of qwen3.5 random rows. Log: $OUT/log; a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/late-ticket}; mkdir -p "$OUT"
BASE=${BASE:-build/mok-base}
CFGS=${CFGS:-"qwenR:--model qwen3.5-397b-a17b --routing random:1|dsR:--model deepseek-v4-pro --routing random:1|qwenZ:--model qwen3.5-397b-a17b --routing zipf:1.2|dsZ:--model deepseek-v4-pro --routing zipf:1.2|kimiZ:--model kimi-k2.7-code --routing zipf:1.2|glmZ:--model glm-5.2 --routing zipf:1.2"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  if [ "${SUITE:-1}" = 1 ]; then
    timeout 300 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(tail -1 "$OUT/suite.log")"
    grep -E "^FAIL" "$OUT/suite.log" | cut -c1-300
  fi
  IFS='|' read -ra C <<< "$CFGS"
  for r in $(seq ${REPS:-2}); do
    for cfg in "${C[@]}"; do
      for side in base new; do
        bin=build/mok; [ $side = base ] && bin=$BASE
        echo "== ${cfg%%:*} $side $r"
        timeout 120 $bin bench gemm ${cfg#*:} --kinds ${KINDS:-gateup,down} --iters 20 2>&1 | grep -E "^(gateup|down|dgrad|wgrad)|balanced rows|rror"
      done
    done
    [ "$SECONDS" -gt ${TMAX:-420} ] && { echo "stopped after round $r (time)"; break; }
  done
  if [ "$SECONDS" -lt 480 ]; then
    timeout 60 build/mok bench gemm --model qwen3.5-397b-a17b --routing random:1 --vs-balanced off --vs-cublas-zipf off \
      --kinds gateup --iters 5 --trace "$OUT/t-new-random.csv" > /dev/null 2>&1
    python3 scripts/trace-summary.py "$OUT/t-new-random.csv" 2>&1 | head -12
  fi
} > "$OUT/log" 2>&1
grep -E "^suite|^FAIL|^stopped|^==.*: " "$OUT/log"
# table: config side kind | ms ratio-to-cuBLAS | uneven/balanced (in turn)
awk '/^== /{h=$2" "$3" "$4; next}
     /^(gateup|down|dgrad|wgrad)/{k=$1; for (i = 2; i <= NF && $i !~ /^E[0-9]/; ++i) k = k "_" $i
       n=NF; ms=$(n-6); rat=$(n-2); if (uneven) next; printf "%s %-22s %s ms %s\n", h, k, ms, rat; next}
     /balanced rows/{split($0,a,"in turn: "); split(a[2],b," "); printf "%s %-22s %s ms %s | over balanced %s\n", h, k, ms, rat, b[1]}' uneven=0 "$OUT/log"
