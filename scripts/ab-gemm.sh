#!/bin/bash
# ab-gemm.sh — A/B of the expert GEMMs in one device run: builds this tree and the tree
# in $BASE (default .ab/base, e.g. `git archive <commit> | tar -x -C .ab/base`), then runs
# `mok bench gemm` of both in turn (B, A, B, A) on each configuration given as arguments
# ("tag:options"). Full log in $OUT/log; a table of TFLOP/s and ratios last.
OUT=${OUT:-/tmp/ab-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
BASE=${BASE:-.ab/base}
ITERS=${ITERS:-20}
KINDS=${KINDS:-gateup,down}
# (wait on the two builds by pid: a bare `wait` also waits for the tee above, forever)
( make -j8 all > "$OUT/build-a.log" 2>&1 || echo "A build failed" ) & pa=$!
( cd "$BASE" && make -j8 build/mok > "$OUT/build-b.log" 2>&1 || echo "B build failed" ) & pb=$!
wait $pa $pb
[ -x build/mok ] && [ -x "$BASE/build/mok" ] || { tail -5 "$OUT"/build-*.log; exit 1; }
if [ -n "$TESTS" ]; then make -j16 build/mok_tests >/dev/null 2>&1; timeout 100 build/mok_tests $TESTS 2>&1 | grep -v "^ok"; fi
J=/tmp/ab-json; rm -rf $J; mkdir -p $J
for cfg in "$@"; do
  tag=${cfg%%:*}; opts=${cfg#*:}
  for rep in 1 2; do
    for side in B A; do
      bin=build/mok; [ $side = B ] && bin=$BASE/build/mok
      o=$opts; [ $side = B ] && o=$(echo "$opts" | sed -E 's/--(counts|tok-units|raster) [^ ]+//g')
      echo "-- $tag $side$rep: $o"
      timeout 120 $bin bench gemm $o --kinds $KINDS --iters $ITERS --json $J/$tag.$side$rep.json | tail -n +3
    done
  done
done
python3 - "$J" <<'PY'
import json, glob, os, sys, collections
d = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    tag, run = os.path.basename(f)[:-5].rsplit(".", 1)
    try: rs = json.load(open(f))["results"]
    except Exception as e: print(f, "unreadable", e); continue
    for r in rs: d[(tag, r["kind"])][run] = (r["tflops"], r["cublas_tflops"], r["ok"])
print("%-16s %-16s %18s %18s %14s" % ("config", "kind", "B TFLOP/s (2 runs)", "A TFLOP/s (2 runs)", "A/cuBLAS"))
for (tag, kind), v in sorted(d.items()):
    g = lambda k: v.get(k, (0, 0, True))
    cub = [g(k)[1] for k in ("A1", "A2") if k in v]
    bad = "" if all(x[2] for x in v.values()) else " WRONG"
    print("%-16s %-16s %8.1f %8.1f %8.1f %8.1f %6.3f %6.3f%s" % (tag, kind, g("B1")[0], g("B2")[0], g("A1")[0], g("A2")[0],
          g("A1")[0] / max(g("A1")[1], 1), g("A2")[0] / max(g("A2")[1], 1), bad))
PY
