#!/bin/bash
# ab-flags.sh — variants of `mok bench gemm` options on one build, in one device run:
# builds this tree, optionally runs tests ($TESTS: a test-name filter), then for each
# configuration given as an argument ("tag:options") runs every variant of $VARIANTS
# ("name=options;name=options;...") in turn, twice (V1 V2 .. V1 V2 ..). Full log in
# $OUT/log, JSON in $OUT/json; a table of TFLOP/s (both runs) and ratios to cuBLAS last.
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
grep -iE "warning" "$OUT/build.log" | head -5
if [ -n "$TESTS" ]; then timeout 200 build/mok_tests $TESTS 2>&1 | grep -v "^ok"; fi
J=$OUT/json; mkdir -p $J
IFS=';' read -ra VS <<< "$VARIANTS"
for cfg in "$@"; do
  tag=${cfg%%:*}; opts=${cfg#*:}
  for rep in 1 2; do
    for v in "${VS[@]}"; do
      name=${v%%=*}; vo=${v#*=}
      echo "-- $tag $name$rep: $opts $vo"
      timeout 120 build/mok bench gemm $opts $vo --kinds $KINDS --iters $ITERS --json $J/$tag.$name.$rep.json | tail -n +3
    done
  done
done
python3 - "$J" "$VARIANTS" <<'PY'
import json, glob, os, sys, collections
names = [v.split("=", 1)[0] for v in sys.argv[2].split(";") if v]
d = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    tag, name, rep = os.path.basename(f)[:-5].rsplit(".", 2)
    try: rs = json.load(open(f))["results"]
    except Exception as e: print(f, "unreadable", e); continue
    for r in rs: d[(tag, r["kind"])][(name, rep)] = (r["tflops"], r["cublas_tflops"], r["ok"])
print("%-12s %-8s" % ("config", "kind") + "".join(" %22s" % n for n in names) + "   (TFLOP/s run1 run2 / ratio to cuBLAS)")
for (tag, kind), v in sorted(d.items()):
    row = "%-12s %-8s" % (tag, kind)
    for n in names:
        a, b = v.get((n, "1"), (0, 1, True)), v.get((n, "2"), (0, 1, True))
        row += " %6.1f %6.1f %5.3f%s" % (a[0], b[0], (a[0] + b[0]) / max(a[1] + b[1], 1), "" if a[2] and b[2] else "!")
    print(row)
PY
