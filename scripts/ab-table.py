#!/usr/bin/env python3
"""ab-table.py — the table of ab-flags.sh and ab-trees.sh: reads `mok bench gemm --json`
files named TAG.NAME.REP.json (REP 1, 2, ..: one process each, $REPS of the scripts) in DIR
and prints, per configuration and kind, each name's TFLOP/s of its runs (two: both; more:
median and range) and its ratio to cuBLAS of the same runs, sum over sum ("!": a check
failed). Ours and cuBLAS move together by up to +-6% from one process to the next
(docs/PERF.md, session 17): the ratio is the steadier figure. Zipf runs (their JSON has
zipf_over_balanced: ours on Zipf rows against ours on balanced rows, in turn in one
process) get a second table of that figure, and (their JSON has ours_over_cublas_zipf: cuBLAS
on the same Zipf rows, the faster of its grouped call and a GEMM an expert, in turn with ours)
a third: ours over cuBLAS there, and cuBLAS's own Zipf / balanced.
Usage: ab-table.py DIR "name=...;name=..." (the names in that order)."""
import collections, glob, json, os, sys

names = [v.split("=", 1)[0] for v in sys.argv[2].split(";") if v]
d = collections.defaultdict(dict)
zb = collections.defaultdict(dict)
cz = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    tag, name, rep = os.path.basename(f)[:-5].rsplit(".", 2)
    try:
        rs = json.load(open(f))["results"]
    except Exception as e:
        print(f, "unreadable", e)
        continue
    for r in rs:
        d[(tag, r["kind"])][(name, rep)] = (r["tflops"], r["cublas_tflops"], r["ok"])
        if "zipf_over_balanced" in r:
            zb[(tag, r["kind"])][(name, rep)] = r["zipf_over_balanced"]
        if "ours_over_cublas_zipf" in r:
            cz[(tag, r["kind"])][(name, rep)] = (r["ours_over_cublas_zipf"], r["cublas_zipf_over_balanced"])
reps = sorted({rep for v in d.values() for (_, rep) in v}, key=int)
if len(reps) < 2:  # the two-run layout, missing runs as 0
    reps = ["1", "2"]
head = "run1 run2" if len(reps) == 2 else "median (lo-hi) of %d runs" % len(reps)
print("%-12s %-8s" % ("config", "kind") + "".join(" %22s" % n for n in names) + "   (TFLOP/s %s / ratio to cuBLAS)" % head)
for (tag, kind), v in sorted(d.items()):
    row = "%-12s %-8s" % (tag, kind)
    for n in names:
        rs = [v.get((n, r), (0, 1, True)) for r in reps]
        ours = sorted(r[0] for r in rs)
        ratio = sum(r[0] for r in rs) / max(sum(r[1] for r in rs), 1)
        bad = "" if all(r[2] for r in rs) else "!"
        if len(reps) == 2:
            row += " %6.1f %6.1f %5.3f%s" % (rs[0][0], rs[1][0], ratio, bad)
        else:
            row += " %5.0f (%3.0f-%3.0f) %5.3f%s" % (ours[len(ours) // 2], ours[0], ours[-1], ratio, bad)
    print(row)
def ratio_table(data, title, cell):
    """A table of per-process figures: a row a (config, kind), a cell a name (cell(values))."""
    if not data:
        return
    print("\n%-12s %-8s" % ("config", "kind") + "".join(" %22s" % n for n in names) + "   (" + title + ")")
    for (tag, kind), v in sorted(data.items()):
        xs = [[v[(n, r)] for r in reps if (n, r) in v] for n in names]
        print("%-12s %-8s" % (tag, kind) + "".join(cell(x) if x else " %22s" % "-" for x in xs))


def med(xs):
    return sorted(xs)[len(xs) // 2]


ratio_table(zb, "Zipf / balanced rows, ours in turn in one process: median (lo-hi)",
            lambda x: " %12.3f (%.3f-%.3f)" % (med(x), min(x), max(x)))
ratio_table(cz, "cuBLAS on the Zipf rows: ours / cuBLAS, in turn; cuBLAS's Zipf / its balanced; medians",
            lambda x: " %10.3f %11.3f" % (med([a for a, _ in x]), med([b for _, b in x])))
