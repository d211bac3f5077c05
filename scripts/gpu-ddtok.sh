#!/usr/bin/env bash
# gpu-ddtok.sh — down dgrad (dA + SwiGLU') on token tiles (--ddown-tok on, the experiment of
# sessions 16-17) against the 128 x 128 tiles (off, the rule), at the layer's EP1 loads (qwen3.5
# 512 experts x 160 rows, glm-5.2 256 x 256: T = 8192 on one GPU), at the issue's shapes, and
# under Zipf 1.2 (SHAPES may add `--routing random`, session 42). One process a run, on / off in turns (REPS). `mok bench gemm --kinds ddown`,
# ours beside cuBLAS's dY W_down (no SwiGLU'). PREBUILT=1: build/mok carried. Log: $OUT/log.
set -uo pipefail
OUT=${OUT:-/tmp/ddtok-out}; mkdir -p "$OUT"
SHAPES=${SHAPES:-"--hidden 4096 --inter 1024 --experts 512 --rows-per-expert 160|--hidden 4096 --inter 1024 --experts 512 --rows-per-expert 160 --routing zipf:1.2|--model qwen3.5-397b-a17b|--model qwen3.5-397b-a17b --routing zipf:1.2|--hidden 6144 --inter 2048 --experts 256 --rows-per-expert 256|--model glm-5.2|--model kimi-k2.7-code|--model deepseek-v4-pro|--model deepseek-v4-pro --routing zipf:1.2"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for r in $(seq "${REPS:-2}"); do
      for m in on off; do
        echo "== $s --ddown-tok $m ($r)"
        timeout 120 build/mok bench gemm $s --kinds ddown --ddown-tok $m --iters 20 --vs-cublas-zipf off 2>&1 \
          | grep -E "^dgrad down|(zipf|random) / balanced|rror|FAIL"
      done
    done
  done
} 2>&1 | tee "$OUT/log"
