#!/usr/bin/env bash
# ptx-diff.sh — which GEMM kernel instances a change touches: compiles src/gemm.cu of this
# tree and of BASE (a source tree, e.g. `git archive <commit> | tar -x -C .ab/base`) to PTX
# and prints, per kernel entry, how many lines differ once register numbers, labels and
# kernel-parameter offsets are normalised (0: the same code; a field added to GemmTileArgs
# only moves parameter offsets). Session 11 found producer code that never runs costing
# down 4-7% (docs/PERF.md), so a change is checked here before it is measured. No GPU needed.
# Usage: scripts/ptx-diff.sh BASE [kernel-name-filter]
set -euo pipefail
BASE=${1:?usage: scripts/ptx-diff.sh BASE [filter]}
FILTER=${2:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
F="-std=c++17 -O3 -gencode arch=compute_90a,code=compute_90a --expt-relaxed-constexpr -Iinclude -Isrc"
nvcc $F -ptx src/gemm.cu -o "$T/new.ptx" &
(cd "$BASE" && nvcc $F -ptx src/gemm.cu -o "$T/base.ptx")
wait
python3 - "$T/base.ptx" "$T/new.ptx" "$FILTER" <<'PY'
import difflib, re, sys
def kernels(path):
    s = open(path).read()
    out = {}
    for m in re.finditer(r"\.visible \.entry (\S+)\(", s):
        j = s.find(".visible .entry", m.end())
        out[m.group(1)] = s[m.start():j if j > 0 else len(s)]
    return out
def norm(t):
    t = re.sub(r"%[a-z]+\d+", "R", t)
    t = re.sub(r"\$L__BB[0-9_]+", "L", t)
    t = re.sub(r"\[R\+-?\d+\]", "[P]", t)
    return [l for l in t.splitlines() if not l.lstrip().startswith(".reg")]
a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
for name in sorted(set(a) | set(b)):
    if sys.argv[3] not in name:
        continue
    if name not in a or name not in b:
        print("%-70s %s" % (name, "only in " + ("this tree" if name in b else "BASE")))
        continue
    d = [l for l in difflib.unified_diff(norm(a[name]), norm(b[name]), lineterm="", n=0)
         if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    print("%-70s %6d lines differ" % (name, len(d)))
PY
