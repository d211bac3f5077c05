#!/usr/bin/env bash
# gpu-near.sh — the down GEMM's near-balanced schedule rule (session 43, measured and not
# landed: scripts/exp/down-near-static.diff, grouped_gemm.cuh use_tickets NEAR: token tiles
# of rows within 25% of the mean run static round-robin, not by tickets; its test
# gemm_gpu_down_near_balanced_static, after its first run's wrong layout was fixed, not yet
# run on a GPU):
# build/mok (a tree with the diff) against BASE/mok (the parent tree), one process a run,
# in turns, down alone: random routing for SEEDS (R +- sqrt(R) rows an expert, where the
# rule takes effect), then Zipf 1.2 and balanced rows (where it must not: the same code
# path, level expected). The rule's tests first (TESTS=0: not). PREBUILT: carry build/mok,
# build/mok_tests, BASE/mok. Log: $OUT/log; short lines printed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/near}; mkdir -p "$OUT"
BASE=${BASE:-build-base}
SHAPES=${SHAPES:-"--model qwen3.5-397b-a17b|--model qwen3.5-397b-a17b --rows-per-expert 512|--model kimi-k2.7-code|--model glm-5.2|--model deepseek-v4-pro|--model deepseek-v4-pro --rows-per-expert 512"}
OTHER=${OTHER:-"--model qwen3.5-397b-a17b --routing zipf:1.2|--model deepseek-v4-pro --routing zipf:1.2|--model qwen3.5-397b-a17b|--model deepseek-v4-pro"}
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  [ "${TESTS:-1}" = 0 ] || timeout 240 build/mok_tests gemm_gpu_down gemm_gpu_schedule gemm_gpu_token 2>&1 \
    | grep -E "^FAIL|near|passed"
  run() { # $1: shape and routing options, $2: label
    for b in $BASE build; do
      echo "== $2 $b"
      timeout 120 $b/mok bench gemm $1 --vs-balanced off --vs-cublas-zipf off --kinds down --iters 20 2>&1 \
        | grep -E "^down|rror|FAIL"
    done
  }
  IFS='|' read -ra S <<< "$SHAPES"
  for s in "${S[@]}"; do
    for seed in ${SEEDS:-1 2 3}; do run "$s --routing random:$seed" "$s random:$seed"; done
  done
  IFS='|' read -ra S <<< "$OTHER"
  for s in "${S[@]}"; do run "$s" "$s"; done
} > "$OUT/log" 2>&1
grep -E "^(FAIL|[0-9]+ passed)" "$OUT/log"
awk '/^==/{h=$0; next} /^down/{n=NF; print substr(h,4) " | " $(n-6) " ms " $(n-2)}' "$OUT/log" | sed 's/--model //'
