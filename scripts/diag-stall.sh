#!/bin/bash
# diag-stall.sh — where the warps of one kernel launch wait: Nsight Compute's warp-stall
# sampling per SASS instruction of the first launch of a kernel (regex) in a `mok bench
# gemm` run, summed and printed as the top instructions (with their stall reasons) and a
# per-opcode summary. Arguments: "tag|kernel regex|bench options", e.g.
#   "down qwen R320|grouped_gemm|--model qwen3.5-397b-a17b --kinds down"
# Builds first unless NOBUILD=1. Log in $OUT/log, reports and CSVs in $OUT.
OUT=${OUT:-/tmp/diag-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
[ -n "$NOBUILD" ] || make -j16 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
NCU=/usr/local/cuda/bin/ncu
n=0
for spec in "$@"; do
  IFS='|' read -r tag k opts <<< "$spec"
  n=$((n + 1))
  echo "== $tag"
  timeout 200 $NCU --clock-control none -k "regex:$k" -c 1 --section WarpStateStats --section SourceCounters \
    -f -o "$OUT/rep$n" build/mok bench gemm $opts --iters 1 > "$OUT/ncu$n.txt" 2>&1 || tail -5 "$OUT/ncu$n.txt"
  $NCU -i "$OUT/rep$n.ncu-rep" --page source --csv --print-source sass > "$OUT/src$n.csv" 2> "$OUT/src$n.err" ||
    { head -5 "$OUT/src$n.err"; $NCU -i "$OUT/rep$n.ncu-rep" --page details --print-details all | grep -iE "stall|warp" | head -40; continue; }
  python3 - "$OUT/src$n.csv" <<'PY'
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1])))
# the header is the first row that names the sampling column
h = next(i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r))
head, body = rows[h], rows[h + 1:]
col = {c: i for i, c in enumerate(head)}
allc = next(c for c in head if c.startswith("Warp Stall Sampling (All"))
src = next((c for c in head if c in ("Source", "# Source")), head[1])
reasons = [c for c in head if c.startswith("stall_") or c.startswith("smsp__pcsamp")]
def num(s):
    try: return float(s.replace(",", ""))
    except ValueError: return 0.0
tot = sum(num(r[col[allc]]) for r in body if len(r) > col[allc])
print("   samples %d, columns: %s" % (tot, ", ".join(reasons[:0])))
top = sorted(body, key=lambda r: -num(r[col[allc]]) if len(r) > col[allc] else 0)[:28]
for r in top:
    s = num(r[col[allc]])
    rs = sorted(((num(r[col[c]]), c) for c in reasons if len(r) > col[c] and num(r[col[c]]) > 0), reverse=True)[:3]
    print("   %5.1f%%  %-70s %s" % (100 * s / max(tot, 1), r[col[src]].strip()[:70],
                                 " ".join("%s=%.0f%%" % (c.replace("smsp__pcsamp_warps_issue_stalled_", ""), 100 * v / max(s, 1)) for v, c in rs)))
ops = collections.Counter()
for r in body:
    if len(r) <= col[allc]: continue
    m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_.]+)", r[col[src]])
    if m: ops[m.group(2).split(".")[0]] += num(r[col[allc]])
print("   by opcode: " + ", ".join("%s %.1f%%" % (o, 100 * v / max(tot, 1)) for o, v in ops.most_common(12)))
# every sample's reason, summed over the kernel (no_instructions: instruction fetch, session 15)
why = collections.Counter()
for r in body:
    for c in reasons:
        if "Not Issued" not in c and len(r) > col[c]: why[c.replace("smsp__pcsamp_warps_issue_stalled_", "")] += num(r[col[c]])
print("   by reason: " + ", ".join("%s %.1f%%" % (c, 100 * v / max(tot, 1)) for c, v in why.most_common(10)))
PY
done
