#!/bin/bash
# diag-token.sh (branch exp/token-tiles) — the down GEMM with 256 x 160 token tiles
# (MOK_DIAG_TOKEN160=1) vs the normal 128-row tiles, on layouts whose segments are
# multiples of 160 (qwen3.5 at 160 / 320 / 480 rows per expert, kimi at 320).
OUT=${OUT:-/tmp/diag-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
make -j16 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
b() { build/mok bench gemm "$@" --iters 10 2>&1 | grep -E "^down |rows after"; }
for a in "qwen3.5-397b-a17b --rows-per-expert 320" "qwen3.5-397b-a17b --rows-per-expert 160" \
         "qwen3.5-397b-a17b --rows-per-expert 480" "kimi-k2.7-code --rows-per-expert 320" "glm-5.2 --rows-per-expert 320"; do
  echo "-- $a normal"; b --model $a
  echo "-- $a token160"; MOK_DIAG_TOKEN160=1 b --model $a
done
