#!/usr/bin/env python3
"""ab-table.py — the table of ab-flags.sh and ab-trees.sh: reads `mok bench gemm --json`
files named TAG.NAME.REP.json (REP 1, 2) in DIR and prints, per configuration and kind, each
name's TFLOP/s of both runs and its ratio to cuBLAS of the same runs ("!": a check failed).
Usage: ab-table.py DIR "name=...;name=..." (the names in that order)."""
import collections, glob, json, os, sys

names = [v.split("=", 1)[0] for v in sys.argv[2].split(";") if v]
d = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    tag, name, rep = os.path.basename(f)[:-5].rsplit(".", 2)
    try:
        rs = json.load(open(f))["results"]
    except Exception as e:
        print(f, "unreadable", e)
        continue
    for r in rs:
        d[(tag, r["kind"])][(name, rep)] = (r["tflops"], r["cublas_tflops"], r["ok"])
print("%-12s %-8s" % ("config", "kind") + "".join(" %22s" % n for n in names) + "   (TFLOP/s run1 run2 / ratio to cuBLAS)")
for (tag, kind), v in sorted(d.items()):
    row = "%-12s %-8s" % (tag, kind)
    for n in names:
        a, b = v.get((n, "1"), (0, 1, True)), v.get((n, "2"), (0, 1, True))
        row += " %6.1f %6.1f %5.3f%s" % (a[0], b[0], (a[0] + b[0]) / max(a[1] + b[1], 1), "" if a[2] and b[2] else "!")
    print(row)
