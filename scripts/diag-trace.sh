#!/bin/bash
# diag-trace.sh — per-tile timelines of forward token-tile launches: for each "tag:bench
# options" argument, `mok bench gemm ... --trace $OUT/trace-tag.csv` (one extra traced
# launch per kind), then scripts/trace-summary.py over them. Builds first unless NOBUILD=1;
# runs the tests named by $TESTS first if set. Log in $OUT/log.
OUT=${OUT:-/tmp/trace-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
export NCCL_NVLS_ENABLE=0
KINDS=${KINDS:-gateup,down}
date -u; nvidia-smi -L; git log --oneline -1
[ -n "$NOBUILD" ] || make -j16 all build/mok_tests > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
grep -iE "warning[: ]|error[: ]" "$OUT/build.log" | grep -v "^\S*nvcc " | grep -v 128-D | head -5
if [ -n "$TESTS" ]; then timeout 200 build/mok_tests $TESTS 2>&1 | grep -v "^ok"; fi
for cfg in "$@"; do
  tag=${cfg%%:*}; opts=${cfg#*:}
  echo "-- $tag: $opts"
  timeout 120 build/mok bench gemm $opts --kinds $KINDS --iters ${ITERS:-5} --trace "$OUT/trace-$tag.csv" | tail -n +3
done
python3 scripts/trace-summary.py "$OUT"/trace-*.csv
