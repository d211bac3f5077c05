#!/bin/bash
# ab-flags.sh — variants of `mok bench gemm` options on one build, in one device run:
# builds this tree, optionally runs tests ($TESTS: a test-name filter), then for each
# configuration given as an argument ("tag:options") runs every variant of $VARIANTS
# ("name=options;name=options;...") in turn, $REPS times (default 2: V1 V2 .. V1 V2 ..;
# each a process of its own, and processes differ by up to +-6%: docs/PERF.md, session
# 17). Full log in $OUT/log, JSON in $OUT/json; a table of TFLOP/s and ratios to cuBLAS last.
# Example: VARIANTS="pp=--pingpong on;coop=--pingpong off" scripts/ab-flags.sh \
#            "qwen320:--model qwen3.5-397b-a17b" "kimi:--model kimi-k2.7-code"
OUT=${OUT:-/tmp/ab-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
ITERS=${ITERS:-20}
KINDS=${KINDS:-gateup,down}
VARIANTS=${VARIANTS:-default=}
export NCCL_NVLS_ENABLE=0
date -u; nvidia-smi -L; git log --oneline -1
make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
grep -iE "warning[: ]|error[: ]" "$OUT/build.log" | grep -v "^\S*nvcc " | head -5
if [ -n "$TESTS" ]; then timeout 200 build/mok_tests $TESTS 2>&1 | grep -v "^ok"; fi
J=$OUT/json; mkdir -p $J
IFS=';' read -ra VS <<< "$VARIANTS"
for cfg in "$@"; do
  tag=${cfg%%:*}; opts=${cfg#*:}
  for rep in $(seq 1 "${REPS:-2}"); do
    for v in "${VS[@]}"; do
      name=${v%%=*}; vo=${v#*=}
      echo "-- $tag $name$rep: $opts $vo"
      timeout 120 build/mok bench gemm $opts $vo --kinds $KINDS --iters $ITERS --json $J/$tag.$name.$rep.json | tail -n +3
    done
  done
done
python3 scripts/ab-table.py "$J" "$VARIANTS"
