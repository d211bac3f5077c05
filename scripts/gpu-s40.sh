#!/usr/bin/env bash
# gpu-s40.sh — the combine inside the forward megakernel (session 40): the SASS of the
# megakernel (HGMMA count, no local memory, mega_combine a function of its own), the mega
# tests (C, Python), then `mok bench layer --impl mega` with the combine in the launch
# (MOK_MEGA_COMBINE=1, the default) and in its own launch after it (0), in turns (ORDER),
# and one profiled run of each (MOK_BASELINE_PROFILE=1: the launch and the combine apart).
# PREBUILT=1: build/mok, build/mok_tests, build/libmok.so carried. Short lines last; the
# whole log in $OUT/log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s40-out}; mkdir -p "$OUT"
MODELS=${MODELS:-qwen3.5-397b-a17b,glm-5.2}
TOKENS=${TOKENS:-2048,8192}
{
  date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  if [ "${PREBUILT:-0}" != 1 ]; then make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { echo "build failed"; exit 1; }; fi
  echo "== SASS (libmok.so)"
  cuobjdump -sass build/libmok.so > "$OUT/lib.sass" 2>/dev/null
  awk '/Function :/{f=$3} /HGMMA/{h[f]++} /LDL|STL/{l[f]++} /CALL/{c[f]++}
       END{for(k in h) if (k ~ /ffn_fwd_kernel/) print k, "HGMMA", h[k], "LDL/STL", l[k]+0, "CALL", c[k]+0;
           for(k in c) if (k ~ /ffn_fwd|mega_combine/) print "calls in", k, c[k]}' "$OUT/lib.sass"
  grep -c "Function : .*mega_combine" "$OUT/lib.sass" | sed 's/^/mega_combine functions: /'
  echo "== C tests"
  timeout 300 build/mok_tests ${TESTS:-layer_mega schedule_device cli_run_gpu layer_nccl_matches_reference_1gpu} 2>&1 | tail -14
  if [ "${PYTESTS:-1}" != - ]; then
    echo "== python tests"
    MOK_LIBRARY=$PWD/build/libmok.so timeout 200 python3 python/tests/test_mok.py moe_matches_reference_mega \
      mega_forward_in_cuda_graph forwards_in_flight_keep_their_contexts mega_bad_expert_id_reported_on_device 2>&1 | tail -6
  fi
  for v in ${ORDER:-1 0 1 0}; do
    echo "== MOK_MEGA_COMBINE=$v"
    MOK_MEGA_COMBINE=$v timeout 200 build/mok bench layer --impl mega --gpus 1 --model "$MODELS" --tokens "$TOKENS" \
      --iters "${ITERS:-10}" --check-tokens 1 2>&1 | grep -E "\] forward|rror"
  done
  for v in 1 0; do
    echo "== profile, MOK_MEGA_COMBINE=$v (qwen3.5 T=8192)"
    MOK_BASELINE_PROFILE=1 MOK_MEGA_COMBINE=$v timeout 100 build/mok bench layer --impl mega --gpus 1 \
      --model qwen3.5-397b-a17b --tokens 8192 --iters 3 --check-tokens 0 --check-experts 0 2>&1 | grep -E "fwd|forward" | tail -4
  done
} 2>&1 | tee "$OUT/log"
