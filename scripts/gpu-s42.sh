#!/usr/bin/env bash
# gpu-s42.sh — session 42's closing device call: the full C suite and the Python tests on
# this tree; then the token-tile cut's change (one more tile only where the equal tiles
# keep >= 128 rows) on the balanced and Zipf shapes, this tree's build/mok against the
# parent's (build-base/mok), one process a run, in turns; the random-routing table of this
# tree (scripts/gpu-random.sh); the layer (mega, T=8192) both ways. Carry build/{mok,
# mok_tests,libmok.so}, build-base/mok. Logs under $OUT; short lines last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/s42}; mkdir -p "$OUT"
{
  date -u; nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 300 build/mok_tests > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(grep -E 'passed|failed' "$OUT/suite.log" | tail -1)"
  grep -E "^FAIL" "$OUT/suite.log" | cut -c1-300
  MOK_LIBRARY=$PWD/build/libmok.so timeout 300 python3 python/tests/test_mok.py > "$OUT/python.log" 2>&1
  echo "python rc=$? $(grep -E 'passed' "$OUT/python.log" | tail -1)"; grep -E "FAIL" "$OUT/python.log" | cut -c1-300
  for s in "--model qwen3.5-397b-a17b" "--model kimi-k2.7-code" "--model glm-5.2" "--model deepseek-v4-pro" \
           "--model deepseek-v4-pro --rows-per-expert 512" "--model qwen3.5-397b-a17b --rows-per-expert 512" \
           "--model qwen3.5-397b-a17b --routing zipf:1.2" "--model deepseek-v4-pro --routing zipf:1.2"; do
    for r in 1 2; do
      for b in build-base build; do
        echo "== $s $b ($r)"
        timeout 120 $b/mok bench gemm $s --kinds gateup,down --iters 20 --vs-cublas-zipf off 2>&1 \
          | grep -E "^(down|gateup)|balanced rows|rror|FAIL"
      done
    done
  done > "$OUT/ab.log"
  awk '/^==/{h=$0; next} /^(gateup|down)/{n=NF; print substr(h,4) " | " $1 " " $(n-6) " ms " $(n-2)} /zipf \/ balanced/{print substr(h,4) " | zipf/bal " $(NF-3)}' \
    "$OUT/ab.log" | sed 's/--model //;s/--rows-per-expert /R/;s/--routing zipf:1.2/zipf/;s/gateup+swiglu/gu/'
  OUT=$OUT/random bash scripts/gpu-random.sh > /dev/null 2>&1
  grep -E "^(gateup|down)|balanced rows|cuBLAS random" "$OUT/random/log" | sed 's/  */ /g' | cut -c1-150
  for b in build-base build; do
    echo "== layer $b"
    timeout 100 $b/mok bench layer --impl mega --gpus 1 --model glm-5.2,qwen3.5-397b-a17b --tokens 8192 --iters 10 \
      --check-tokens 1 2>&1 | grep -E "\] forward|rror" | sed 's/, device memory.*//'
  done
} 2>&1 | tee "$OUT/log"
