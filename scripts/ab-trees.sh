#!/bin/bash
# ab-trees.sh — `mok bench gemm` of several source trees in one device run, in turn (T1 T2 ..
# T1 T2 ..), to bisect a change whose parts each need their own build. TREES="tag=dir;
# tag=dir;..." (each dir a source tree, e.g. `git archive <commit> | tar -x -C .ab/x`; carry
# them); arguments as ab-gemm.sh: "tag:bench options". Full log in $OUT/log, the medians'
# TFLOP/s and ratios to cuBLAS of the runs in a table last. $REPS: the rounds (default 2;
# each run a process of its own: processes differ by up to +-6%, docs/PERF.md session 17).
# An entry "tag=dir|options" adds bench options for that entry (a knob of one build: each dir
# is built once). $TESTS: a test-name filter run on the first entry's build first.
# Example: TREES="base=.ab/base;P=.ab/P;Pk=.ab/P|--knob on" scripts/ab-trees.sh "glm512:--model glm-5.2"
# A patch into such a tree: (cd .ab/P && patch -p1 < F.diff). Not `git apply`: inside .ab/ (a
# folder of this checkout) it takes paths from the repository root and skips them all, silently.
OUT=${OUT:-/tmp/ab-trees}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
ITERS=${ITERS:-20}
KINDS=${KINDS:-gateup,down}
IFS=';' read -ra TS <<< "${TREES:?TREES=\"tag=dir;...\"}"
export NCCL_NVLS_ENABLE=0
date -u; nvidia-smi -L; git log --oneline -1
pids=(); dirs=" "
for t in "${TS[@]}"; do
  d=${t#*=}; d=${d%%|*}
  case "$dirs" in *" $d "*) continue;; esac
  dirs="$dirs$d "
  tgt=build/mok; [ -n "$TESTS" ] && [ "$dirs" = " $d " ] && tgt="build/mok build/mok_tests"
  ( cd "$d" && make -j$(( $(nproc) / ${#TS[@]} + 1 )) $tgt > "$OUT/build-${t%%=*}.log" 2>&1 || echo "$d: build failed" ) &
  pids+=($!)
done
wait "${pids[@]}" # (by pid: a bare `wait` also waits for the tee above, forever)
if [ -n "$TESTS" ]; then d=${TS[0]#*=}; d=${d%%|*}; (cd "$d" && timeout 200 build/mok_tests $TESTS 2>&1 | grep -v "^ok"); fi
J=$OUT/json; mkdir -p "$J"
for cfg in "$@"; do
  tag=${cfg%%:*}; opts=${cfg#*:}
  for rep in $(seq 1 "${REPS:-2}"); do
    for t in "${TS[@]}"; do
      name=${t%%=*}; d=${t#*=}; xo=; case "$d" in *"|"*) xo=${d#*|};; esac; d=${d%%|*}
      echo "-- $tag $name$rep: $opts $xo"
      timeout 120 "$d/build/mok" bench gemm $opts $xo --kinds $KINDS --iters $ITERS --json "$J/$tag.$name.$rep.json" | tail -n +3
    done
  done
done
python3 scripts/ab-table.py "$J" "$TREES"
