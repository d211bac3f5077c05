#!/bin/bash
# diag-sched.sh — one device run: GEMM TFLOP/s with static vs run-time (ticket) tile
# schedules at several rows per expert, to see what tail tiles and the schedule cost.
# Usage (device machine, repo root): bash scripts/diag-sched.sh
OUT=${OUT:-/tmp/diag-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
make -j16 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
ITERS=${ITERS:-10}
T=/tmp/diag-sum; : > $T
run() {
  local tag=$1; shift
  build/mok bench gemm "$@" --iters $ITERS > /tmp/one.txt 2>&1; echo "rc $?" >> /tmp/one.txt
  cat /tmp/one.txt
  awk -v t="$tag" '/ E[0-9]+ H[0-9]+ / { k=substr($0, 1, 20); sub(/ +$/, "", k); print t "\t" k "\t" $0 }' /tmp/one.txt >> $T
}
for t in split one; do
  for s in auto static tickets; do
    run "qwen R320 $s $t" --model qwen3.5-397b-a17b --rows-per-expert 320 --sched $s --tail $t
    run "kimi zipf $s $t" --model kimi-k2.7-code --routing zipf:1.2 --sched $s --tail $t
  done
  run "qwen zipf auto $t" --model qwen3.5-397b-a17b --routing zipf:1.2 --tail $t
  run "dsv4 zipf auto $t" --model deepseek-v4-pro --routing zipf:1.2 --tail $t
done
for m in kimi-k2.7-code glm-5.2 deepseek-v4-pro; do run "$m auto" --model $m; done
run "qwen R256 auto" --model qwen3.5-397b-a17b --rows-per-expert 256
echo "== summary: tag | kind | TFLOP/s ours | cuBLAS | ratio"
awk -F'\t' '{ n=split($3, f, " +"); print $1 " | " $2 " | " f[n-5] " | " f[n-3] " | " f[n-2] }' $T | grep -v "wgrad.*fp32"
