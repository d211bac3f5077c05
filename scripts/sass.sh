#!/bin/bash
# sass.sh — the SASS of the GEMM kernels without a GPU: compiles src/gemm.cu for sm_90a to a
# cubin, disassembles it with nvdisasm and prints, per kernel, the instruction count and the
# counts of the instructions that told us most (TMA loads and the per-load loop ptxas wraps
# around a load issued from a divergent branch, barrier tests, HGMMAs, local-memory traffic,
# calls: a GEMM kernel should call nothing but the 64-bit division helper).
# With a pattern (grep -E) as argument, also writes the SASS of the first matching kernel to
# $OUT/<kernel>.sass.
# nvdisasm: $NVDISASM, else on PATH, else the one in PyPI's nvidia-cuda-nvdisasm wheel,
# fetched once into .tools/ (ignored by git). Example:
#   scripts/sass.sh 'kernelILi1ELi256ELi1E'   # the down token-tile kernel
set -euo pipefail
OUT=${OUT:-/tmp/sass-out}; mkdir -p "$OUT"
NV=${NVDISASM:-$(command -v nvdisasm || true)}
if [ -z "$NV" ]; then
  NV=$(ls .tools/nvdisasm/nvidia/*/bin/nvdisasm 2>/dev/null | head -1 || true)
  if [ -z "$NV" ]; then
    d=$(mktemp -d)
    pip download --no-deps -q -d "$d" nvidia-cuda-nvdisasm >&2
    mkdir -p .tools/nvdisasm
    python3 -m zipfile -e "$d"/nvidia_cuda_nvdisasm-*.whl .tools/nvdisasm
    NV=$(ls .tools/nvdisasm/nvidia/*/bin/nvdisasm | head -1)
    chmod +x "$NV"
  fi
fi
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -Isrc \
  -cubin src/gemm.cu -o "$OUT/gemm.cubin"
"$NV" "$OUT/gemm.cubin" > "$OUT/gemm.sass"
python3 - "$OUT" "${1:-}" <<'PY'
import re, sys
out, pat = sys.argv[1], sys.argv[2]
kern, cur = {}, None
for line in open(out + "/gemm.sass"):
    m = re.match(r"^\.text\.(\S+):", line)
    if m:
        cur = m.group(1); kern[cur] = []
    elif cur and re.search(r"/\*[0-9a-f]{4,}\*/", line):
        kern[cur].append(re.sub(r"/\*.*?\*/", "", line).strip().rstrip(";").strip())
keys = ["UTMALDG", "UTMASTG", "ELECT", "BRA.U.ANY", "SYNCS.PHASECHK", "HGMMA", "STL", "LDL", "CALL"]
print("%-72s %6s " % ("kernel", "instr") + " ".join("%9s" % k[:9] for k in keys))
for k, ins in kern.items():
    print("%-72s %6d " % (k[:72], len(ins)) + " ".join("%9d" % sum(1 for i in ins if k2 in i) for k2 in keys))
if pat:
    k = next((k for k in kern if re.search(pat, k)), None)
    if k:
        open("%s/%s.sass" % (out, k), "w").write("\n".join(kern[k]) + "\n")
        print("SASS of %s in %s/%s.sass" % (k, out, k))
    else:
        print("no kernel matches %s" % pat)
PY
