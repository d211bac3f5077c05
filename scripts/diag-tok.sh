#!/bin/bash
# diag-tok.sh — one device run (1 GPU): build, GEMM tests, SASS check, then the forward
# GEMMs with and without expert counts and raster groups, and the weight-gradient kinds,
# each beside cuBLAS. Full log in $OUT/log, a short table last.
# Usage (device machine, repo root): bash scripts/diag-tok.sh [quick]
OUT=${OUT:-/tmp/diag-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
set -o pipefail
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
echo "== build"
make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "== tests"
timeout 240 build/mok_tests gemm 2>&1 | tail -14
echo "== SASS"
cuobjdump --dump-sass build/obj/src/gemm.cu.o > /tmp/gemm.sass 2>/dev/null
echo "HGMMA: $(grep -c HGMMA /tmp/gemm.sass)  LDL/STL: $(grep -cE '\bLDL|\bSTL' /tmp/gemm.sass)"
echo "== bench"
J=/tmp/diag-json; rm -rf $J; mkdir -p $J
ITERS=${ITERS:-20}
run() { local tag=$1; shift; echo "-- $tag: $*"; timeout 120 build/mok bench gemm "$@" --iters $ITERS --json "$J/$tag.json" | tail -n +2; echo "rc $?"; }
F="--kinds gateup,down"
run kimi341        --model kimi-k2.7-code $F
run kimi341-nocnt  --model kimi-k2.7-code $F --counts off
run kimi341-u8     --model kimi-k2.7-code $F --tok-units 8
run qwen320        --model qwen3.5-397b-a17b $F
run glm512         --model glm-5.2 $F
run glm512-u8      --model glm-5.2 $F --tok-units 8
run dsv4256        --model deepseek-v4-pro $F
run qwenzipf       --model qwen3.5-397b-a17b $F --routing zipf:1.2
run kimizipf       --model kimi-k2.7-code $F --routing zipf:1.2
if [ "$1" != quick ]; then
  run kimi512      --model kimi-k2.7-code $F --rows-per-expert 512
  run kimi512-u8   --model kimi-k2.7-code $F --rows-per-expert 512 --tok-units 8
  run qwen512      --model qwen3.5-397b-a17b $F --rows-per-expert 512
  run qwen512-u8   --model qwen3.5-397b-a17b $F --rows-per-expert 512 --tok-units 8
  run dsv4512      --model deepseek-v4-pro $F --rows-per-expert 512
fi
echo "== summary (ratio = ours / cuBLAS TFLOP/s)"
tar -C /tmp -czf "$OUT/json.tgz" diag-json
python3 - "$J" <<'PY'
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    for r in d["results"]:
        print("%-14s %-20s ours %6.1f cuBLAS %6.1f ratio %5.2f GB/s %5.0f err %.1e %s" % (os.path.basename(f)[:-5], r["kind"], r["tflops"], r["cublas_tflops"], r["ratio"], r["hbm_gbs"], r["rel_err"], "" if r["ok"] else "WRONG"))
PY
