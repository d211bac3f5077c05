#!/usr/bin/env python3
"""sched-model.py — a model of the forward token tiles' schedule (session 43): each expert's
rows cut as src/plan.h mok_plan_tok_split does (16-row units, at most 11 a tile), as many
tiles as output blocks a row tile, a tile costing A + B * rows microseconds; balanced rows
(every expert R) under the static round-robin the kernel runs there, random rows (each of
E * R rows to a uniformly drawn expert, the bench's `--routing random:SEED` kind of load,
not its generator) under greedy tickets with the experts most rows first, and under static.
Prints each launch's span against its work / CTAs, and random over balanced. It models the
schedule's tail only: no L2, no CTAs in step, no per-tile efficiency by rows.
Usage: scripts/sched-model.py [A B]"""
import heapq, random, sys


def split(u, mx=11):
    n = -(-u // mx)
    return n + 1 if n > 0 and u % n and u % (n + 1) == 0 and u >= 8 * (n + 1) else n


def tiles_of(rows, mx=11):
    if rows <= 0:
        return []
    u = -(-rows // 16)
    n = split(u, mx)
    q, r = divmod(u, n)
    return [16 * (q + (i < r)) for i in range(n)]


def span(E, R, nb, G, a, b, seed, mode):
    if seed is None:
        cnt = [R] * E
    else:
        rnd = random.Random(seed)
        cnt = [0] * E
        for _ in range(E * R):
            cnt[rnd.randrange(E)] += 1
    order = sorted(range(E), key=lambda e: -cnt[e]) if mode == "tickets" else list(range(E))
    costs = [a + b * t for e in order for _ in range(nb) for t in tiles_of(cnt[e])]
    if mode == "static":
        loads = [0.0] * G
        for i, c in enumerate(costs):
            loads[i % G] += c
        return max(loads), sum(costs) / G
    h = [(0.0, g) for g in range(G)]
    for c in costs:
        t0, g = heapq.heappop(h)
        heapq.heappush(h, (t0 + c, g))
    return max(t for t, _ in h), sum(costs) / G


def main():
    a, b = (float(sys.argv[1]), float(sys.argv[2])) if len(sys.argv) > 2 else (8.0, 0.37)
    shapes = [("qwen3.5 R320 gate+up", 64, 320, 8), ("deepseek-v4-pro R256 gate+up", 48, 256, 24),
              ("qwen3.5 R512 gate+up", 64, 512, 8), ("kimi R341 gate+up", 48, 341, 16), ("glm-5.2 R512 gate+up", 32, 512, 16)]
    for name, E, R, nb in shapes:
        sb, wb = span(E, R, nb, 132, a, b, None, "static")
        print("%s: balanced static span %.0f us (work / CTAs %.0f: %.3f)" % (name, sb, wb, wb / sb))
        for seed in (1, 2, 3):
            st, wt = span(E, R, nb, 132, a, b, seed, "tickets")
            ss, _ = span(E, R, nb, 132, a, b, seed, "static")
            print("  random %d: tickets %.0f us (%.3f of work / CTAs; random / balanced %.3f), static %.0f (%.3f)"
                  % (seed, st, wt / st, sb / st, ss, sb / ss))


if __name__ == "__main__":
    main()
