#!/usr/bin/env bash
# gpu-mega.sh — the forward megakernel (mokImplMega, one GPU) on the device: build, the
# tests (TESTS; " " = the full suite), then `mok bench layer` with mega beside nccl and
# baseline on the same data (MODELS, TOKENS), a sweep of the comm CTAs (CTAS), a per-phase
# profile (MOK_BASELINE_PROFILE; PROFILE= skips it) and mega beside nccl under Zipf 1.2 routing
# (ZIPF= skips it). The bench lines print each run's device memory (layer, comm scratch).
# Log in $OUT/log, JSON in $OUT/*.json.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mok-out}; mkdir -p "$OUT"
TESTS=${TESTS-schedule_device layer_mega layer_nccl_matches_reference_1gpu}
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
TOKENS=${TOKENS:-2048,8192}
IMPLS=${IMPLS:-mega,nccl,baseline}
CTAS=${CTAS:-8 32}
{
  date -u; git rev-parse --short HEAD; nvidia-smi -L
  make -j"$(nproc)" all build/mok_tests 2>&1 | grep -v "^\S*nvcc " | grep -E " error|Error |warning" | head -20
  if [ -n "$TESTS" ]; then
    echo "== tests: $TESTS"
    timeout "${TEST_S:-240}" stdbuf -oL build/mok_tests $TESTS 2>&1 | grep -vE "^ok " | tail -30
  fi
  echo "== layer bench: $IMPLS"
  timeout "${BENCH_S:-300}" build/mok bench layer --impl "$IMPLS" --gpus 1 --model "$MODELS" --tokens "$TOKENS" \
    --iters "${ITERS:-10}" --check-tokens 1 --json "$OUT/layer-mega.json" 2>&1
  for c in $CTAS; do
    echo "== comm CTAs $c"
    MOK_MEGA_COMM_CTAS=$c timeout 120 build/mok bench layer --impl mega --gpus 1 --model "$MODELS" \
      --tokens "${TOKENS##*,}" --iters "${ITERS:-10}" --check-tokens 1 2>&1 | tail -4
  done
  [ -n "${PROFILE-1}" ] && echo "== per-phase profile (MOK_BASELINE_PROFILE; T = the last token count; ms)"
  for i in ${PROFILE-mega nccl}; do
    for m in ${MODELS//,/ }; do
      MOK_BASELINE_PROFILE=1 timeout 120 build/mok bench layer --impl $i --gpus 1 --model "$m" --tokens "${TOKENS##*,}" \
        --iters 3 --warmup 1 --check-tokens 0 --check-experts 0 2>&1 | grep -E "mok baseline (fwd|bwd)" | tail -2 | sed "s/^/$i $m: /"
    done
  done
  if [ -n "${ZIPF-1}" ]; then
    echo "== zipf 1.2"
    timeout 200 build/mok bench layer --impl mega,nccl --gpus 1 --model "$MODELS" --tokens "${TOKENS##*,}" \
      --routing zipf:1.2 --iters "${ITERS:-10}" --check-tokens 1 2>&1 | tail -6
  fi
} 2>&1 | tee "$OUT/log"
