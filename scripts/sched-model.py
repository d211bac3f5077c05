#!/usr/bin/env python3
"""sched-model.py — a model of the forward token tiles' schedule (session 43): each expert's
rows cut as src/plan.h mok_plan_tok_split does (16-row units, at most 11 a tile), as many
tiles as output blocks a row tile, a tile costing A + B * rows microseconds; balanced rows
(every expert R) under the static round-robin the kernel runs there, random rows (each of
E * R rows to a uniformly drawn expert, the bench's `--routing random:SEED` kind of load,
not its generator) under greedy tickets with the experts most rows first, and under static.
Prints each launch's span against its work / CTAs, and random over balanced. It models the
schedule's tail only: no L2, no CTAs in step, no per-tile efficiency by rows.
Session 44: tickets as the kernel took them until then (`early`: a CTA takes its next ticket
as it starts a tile, so it starts the ticket's tile a whole tile later) and as it takes
them now (`late`: once the tile's loads are issued, LATE_US before its end), with how far
apart the tiles of one weight block (consecutive tickets) start: the measured traces showed
p90 14 us early and 1.3 us late at qwen3.5 R320 random (docs/PERF.md), and the tiles of a
block read out of step run slower, which this model does not price.
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


def ticket_gaps(E, R, nb, G, a, b, seed, late_us=None, jitter=0.1):
    """Tickets (most rows first) taken early (late_us None: as a CTA starts a tile) or late
    (late_us before its tile ends); returns the span and the start gaps of each weight
    block's tiles (its row tiles hold consecutive tickets). Each tile's cost varies by
    +-jitter (the traces: 160-row tiles of one balanced launch 59-80 us)."""
    rnd = random.Random(seed)
    cnt = [0] * E
    for _ in range(E * R):
        cnt[rnd.randrange(E)] += 1
    order = sorted(range(E), key=lambda e: -cnt[e])
    jr = random.Random(seed + 1000)
    tiles = [(e, j, (a + b * t) * (1 + jitter * (2 * jr.random() - 1))) for e in order for j in range(nb)
             for t in tiles_of(cnt[e])]
    start = [0.0] * len(tiles)
    h = []  # (ticket time, cta, end of its current tile)
    for g in range(min(G, len(tiles))):
        end = tiles[g][2]
        heapq.heappush(h, (0.0 if late_us is None else max(0.0, end - late_us), g, end))
    nxt = min(G, len(tiles))
    span_ = max(t[2] for t in tiles[:nxt])
    while h and nxt < len(tiles):
        _, g, end = heapq.heappop(h)
        i, nxt = nxt, nxt + 1
        start[i] = end
        end2 = end + tiles[i][2]
        span_ = max(span_, end2)
        heapq.heappush(h, (end if late_us is None else max(end, end2 - late_us), g, end2))
    blocks = {}
    for i, (e, j, _) in enumerate(tiles):
        blocks.setdefault((e, j), []).append(start[i])
    gaps = sorted(max(v) - min(v) for v in blocks.values() if len(v) > 1)
    return span_, gaps


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
            for name, late in (("early", None), ("late", 4.0)):
                sp, g = ticket_gaps(E, R, nb, 132, a, b, seed, late)
                print("    tickets %-5s: span %.0f us; a block's tiles start apart: median %.1f, p90 %.1f, max %.1f us"
                      % (name, sp, g[len(g) // 2], g[int(0.9 * len(g))], g[-1]))


if __name__ == "__main__":
    main()
