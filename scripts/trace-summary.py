#!/usr/bin/env python3
"""trace-summary.py — reads `mok bench gemm --trace FILE` CSVs and prints, per file and kind:
the launch span, how busy the CTAs were, tile durations by rows (and by class: experts of
one tile per output block vs the others), and a timeline of ten bins (CTAs busy, of which
in single-tile experts' tiles). --experts: also a line an expert (row tiles, tile rows,
mean tile time, first start, last end), in the order of their first tiles. FILE may be
gzipped (.gz). Usage: scripts/trace-summary.py [--experts] FILE..."""
import collections, csv, gzip, sys

args = [a for a in sys.argv[1:] if a != "--experts"]
per_expert = "--experts" in sys.argv[1:]
for path in args:
    rows = list(csv.DictReader(gzip.open(path, "rt") if path.endswith(".gz") else open(path)))
    for kind in sorted(set(r["kind"] for r in rows)):
        rs = [r for r in rows if r["kind"] == kind]
        for r in rs:
            for k in ("cta", "tile", "expert", "rows", "block", "start_ns", "end_ns"):
                r[k] = int(r[k])
        span = max(r["end_ns"] for r in rs)
        ctas = len(set(r["cta"] for r in rs))
        # single-tile experts: as many tiles as output blocks
        tiles_e = collections.Counter(r["expert"] for r in rs)
        blocks_e = collections.defaultdict(set)
        for r in rs:
            blocks_e[r["expert"]].add(r["block"])
        single = {e for e in tiles_e if tiles_e[e] == len(blocks_e[e])}
        busy = sum(r["end_ns"] - r["start_ns"] for r in rs)
        last_end = collections.defaultdict(int)
        for r in rs:
            last_end[r["cta"]] = max(last_end[r["cta"]], r["end_ns"])
        ends = sorted(last_end.values())
        print("== %s %s: %d tiles on %d CTAs, span %.1f us, CTAs busy %.1f%%, first CTA done at %.1f us, "
              "median %.1f us" % (path, kind, len(rs), ctas, span / 1e3, 100.0 * busy / (span * ctas), ends[0] / 1e3,
                                  ends[len(ends) // 2] / 1e3))
        by = collections.defaultdict(list)
        for r in rs:
            by[("single" if r["expert"] in single else "multi", r["rows"])].append(r["end_ns"] - r["start_ns"])
        print("   class   rows  tiles  mean us   min us   max us   sum SM-us")
        for (cls, n), d in sorted(by.items()):
            print("   %-6s %5d %6d %8.1f %8.1f %8.1f %10.0f" % (cls, n, len(d), sum(d) / len(d) / 1e3, min(d) / 1e3,
                                                            max(d) / 1e3, sum(d) / 1e3))
        print("   timeline (10 bins): CTAs busy / of them in single-tile experts")
        line = []
        for b in range(10):
            lo, hi = span * b / 10, span * (b + 1) / 10
            tot = sgl = 0.0
            for r in rs:
                o = max(0, min(hi, r["end_ns"]) - max(lo, r["start_ns"]))
                tot += o
                if r["expert"] in single:
                    sgl += o
            line.append("%5.1f/%-5.1f" % (tot / (hi - lo), sgl / (hi - lo)))
        print("   " + " ".join(line))
        if per_expert:
            print("   expert  row tiles  tile rows  mean us  first start us  last end us")
            by_e = collections.defaultdict(list)
            for r in rs:
                by_e[r["expert"]].append(r)
            for e, t in sorted(by_e.items(), key=lambda kv: min(r["start_ns"] for r in kv[1])):
                d = [r["end_ns"] - r["start_ns"] for r in t]
                tr = "/".join(str(n) for n in sorted(set(r["rows"] for r in t)))
                print("   %6d %10d %10s %8.1f %15.1f %12.1f" % (e, len(t) // len(blocks_e[e]), tr, sum(d) / len(d) / 1e3,
                                                              min(r["start_ns"] for r in t) / 1e3,
                                                              max(r["end_ns"] for r in t) / 1e3))
