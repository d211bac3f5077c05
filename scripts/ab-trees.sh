#!/bin/bash
# ab-trees.sh — `mok bench gemm` of several source trees in one device run, in turn (T1 T2 ..
# T1 T2 ..), to bisect a change whose parts each need their own build. TREES="tag=dir;
# tag=dir;..." (each dir a source tree, e.g. `git archive <commit> | tar -x -C .ab/x`; carry
# them); arguments as ab-gemm.sh: "tag:bench options". Full log in $OUT/log, the medians'
# TFLOP/s and ratios to cuBLAS of both runs in a table last.
# Example: TREES="base=.ab/base;P=.ab/P" scripts/ab-trees.sh "glm512:--model glm-5.2"
OUT=${OUT:-/tmp/ab-trees}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
ITERS=${ITERS:-20}
KINDS=${KINDS:-gateup,down}
IFS=';' read -ra TS <<< "${TREES:?TREES=\"tag=dir;...\"}"
pids=()
for t in "${TS[@]}"; do
  d=${t#*=}
  ( cd "$d" && make -j$(( $(nproc) / ${#TS[@]} + 1 )) build/mok > "$OUT/build-${t%%=*}.log" 2>&1 || echo "$d: build failed" ) &
  pids+=($!)
done
wait "${pids[@]}" # (by pid: a bare `wait` also waits for the tee above, forever)
J=$OUT/json; mkdir -p "$J"
for cfg in "$@"; do
  tag=${cfg%%:*}; opts=${cfg#*:}
  for rep in 1 2; do
    for t in "${TS[@]}"; do
      name=${t%%=*}; d=${t#*=}
      echo "-- $tag $name$rep: $opts"
      timeout 120 "$d/build/mok" bench gemm $opts --kinds $KINDS --iters $ITERS --json "$J/$tag.$name.$rep.json" | tail -n +3
    done
  done
done
python3 scripts/ab-table.py "$J" "$TREES"
