/*
 * plan.h — the forward megakernel's work decomposition on one expert-owning rank, as
 * host/device inline functions: the token tiles the Hopper GEMM runs (grouped_gemm.cuh calls
 * the cut below) and the megakernel's task plan over them, so the CPU model
 * (tests/test_plan.c), the GEMM kernels and the megakernel enumerate the same tiles in the
 * same order (docs/MEGAKERNEL.md). C11 and CUDA; no CUDA header needed.
 *
 * Rows are the padded schedule of schedule.h (segments multiples of 64 rows).
 *   token tile  an expert's computed rows (its routed rows rounded up to 16: tok rows) cut
 *               into the fewest tiles of at most max_units 16-row units, as even as can be
 *               (mok_plan_tok_split); tiles in expert order, then in row order. A tile's
 *               rows past the expert's routed count are padding (computed on zeros).
 *   minibatch   consecutive tiles, greedily, while their rows fit in mb_rows (at least one
 *               tile). Compute CTAs run minibatch by minibatch; gate/up, down and combine
 *               wait per minibatch.
 *   macrobatch  consecutive minibatches, greedily, while their rows fit in ring_rows (at
 *               least one). A macrobatch's tiles lie in the ring back to back (the ring row
 *               of a tile = the rows of the macrobatch's tiles before it: no gaps, so a
 *               macrobatch fills ring rows [0, its rows)): any routing, up to every route on
 *               one expert, runs in ring_rows of activation memory.
 *   ring unit   16 rows of the ring: the unit of ring reuse (every tile starts and ends on
 *               one).
 * Order: the LAST macrobatch is processed first (macrobatch 0 last, so its activations are
 * still in the ring afterwards: the saved forward context); inside a macrobatch,
 * minibatches in order.
 * Tasks and their waits (counters are monotonic within a pass):
 *   DISPATCH(tile)  waits ring_free[u] >= mok_plan_ring_fills(u) for every ring unit u it
 *                   writes (the earlier occupants of u were combined); writes the tile's
 *                   routed rows (zeros on its padding rows); arrives x_ready[mb]
 *   GATEUP(tile)    waits x_ready[mb] == tiles of mb;     arrives h_ready[mb]
 *   DOWN(tile)      waits h_ready[mb] == tiles of mb;     arrives y_ready[mb]
 *   COMBINE(tile)   waits y_ready[mb] == tiles of mb;     pushes the routed rows; arrives
 *                   ring_free[u] for every ring unit u of the tile
 * (On the GPU a GATEUP / DOWN "tile" is a row tile times every output block; it arrives
 * once per block and the targets scale by the block count.) Communication CTAs take
 * DISPATCH / COMBINE tasks in the comm order: every dispatch of the first processed
 * macrobatch, then, per following macrobatch, its dispatches interleaved with the previous
 * macrobatch's combines by ring position (before each dispatch, the combines of tiles that
 * start below its end in the ring: mok_plan_comm_before; then the remaining combines), then
 * the last macrobatch's combines.
 * Compute CTAs take GATEUP then DOWN tiles, minibatch by minibatch, in processing order.
 */
#ifndef MOK_PLAN_H
#define MOK_PLAN_H

#include <stdint.h>

#if defined(__CUDACC__)
#define MOK_PHD __host__ __device__ __forceinline__
#else
#define MOK_PHD static inline
#endif

#define MOK_PLAN_UNIT_ROWS 16      /* rows of a token-tile unit and of a ring unit */
#define MOK_PLAN_TILE_MAX_UNITS 11 /* 176 rows: the token tiles' most rows (the wgmma N side) */

/* ---- token tiles (the GEMM's: grouped_gemm.cuh tok_split / tok_tile / tok_rows) ------- */

/* Tiles for u units: the fewest of <= max_units units, or one more where that makes them
 * equal and keeps them >= 8 units (512 rows: 4 x 128, not 176 + 176 + 160: tiles of unequal
 * cost drift apart under a static schedule and stop sharing their weight block in L2, and
 * 128-row tiles run with the rows as wgmma M; but 336 rows: 176 + 160, not 3 x 112, whose
 * smaller tiles cost more a row: under random routing, R +- sqrt(R) rows an expert, that
 * was 1-5% faster at kimi R341 and qwen3.5 R320 on an H100, level elsewhere; docs/PERF.md,
 * session 42). */
MOK_PHD int mok_plan_tok_split(int u, int max_units) {
  const int n = (u + max_units - 1) / max_units;
  return n > 0 && u % n != 0 && u % (n + 1) == 0 && u >= 8 * (n + 1) ? n + 1 : n;
}
/* Tile i of `rows` rows (a multiple of 16): its first row from the segment start, its rows. */
MOK_PHD void mok_plan_tok_tile(int rows, int max_units, int i, int *off, int *nt) {
  const int u = rows / MOK_PLAN_UNIT_ROWS, n = mok_plan_tok_split(u, max_units), q = u / n, r = u - q * n;
  *off = MOK_PLAN_UNIT_ROWS * (i * q + (i < r ? i : r));
  *nt = MOK_PLAN_UNIT_ROWS * (q + (i < r ? 1 : 0));
}
/* Rows of a segment of seg rows that its token tiles compute: all of them (count < 0: no
 * counts), or the routed rows rounded up to 16 (at least one unit of a non-empty segment;
 * never past the segment). */
MOK_PHD int mok_plan_tok_rows_routed(int seg, int count) { /* seg > 0, count >= 0 */
  int n = count < 1 ? 1 : count > seg ? seg : count;
  n = (n + MOK_PLAN_UNIT_ROWS - 1) / MOK_PLAN_UNIT_ROWS * MOK_PLAN_UNIT_ROWS;
  return n < seg ? n : seg;
}
MOK_PHD int mok_plan_tok_rows(int seg, int count) {
  return count < 0 || seg <= 0 ? seg : mok_plan_tok_rows_routed(seg, count);
}
/* Token tiles of one expert (segment seg rows, count routed rows or -1). */
MOK_PHD int mok_plan_expert_tiles(int seg, int count, int max_units) {
  return mok_plan_tok_split(mok_plan_tok_rows(seg, count) / MOK_PLAN_UNIT_ROWS, max_units);
}

/* Routed rows of a tile of nt rows at off in a segment of seg rows with count routed rows
 * (count < 0: every row); the rest are padding. */
MOK_PHD int mok_plan_tile_routed(int seg, int count, int off, int nt) {
  const int live = (count < 0 ? seg : count) - off;
  return live < 0 ? 0 : live < nt ? live : nt;
}

/* ---- the megakernel's plan over the token tiles ------------------------------------------ */

/* Token tiles over the E segments of offset[0..E] (count[e] routed rows, or count NULL). */
MOK_PHD int mok_plan_num_tiles(const int32_t *offset, const int32_t *count, int num_experts, int max_units) {
  int n = 0;
  for (int e = 0; e < num_experts; e++)
    n += mok_plan_expert_tiles(offset[e + 1] - offset[e], count ? count[e] : -1, max_units);
  return n;
}

/* Tile i: its expert, first row (in the padded layout), rows, and routed rows among them
 * (the rest is padding). O(E); a kernel keeps a prefix. Past the last tile: expert -1. */
MOK_PHD void mok_plan_tile(const int32_t *offset, const int32_t *count, int num_experts, int max_units, int i,
                           int *expert, int32_t *row0, int32_t *rows, int32_t *routed) {
  for (int e = 0; e < num_experts; e++) {
    const int seg = offset[e + 1] - offset[e], c = count ? count[e] : -1;
    const int n = mok_plan_expert_tiles(seg, c, max_units);
    if (i < n) {
      int off, nt;
      mok_plan_tok_tile(mok_plan_tok_rows(seg, c), max_units, i, &off, &nt);
      *expert = e;
      *row0 = offset[e] + off;
      *rows = nt;
      *routed = mok_plan_tile_routed(seg, c, off, nt);
      return;
    }
    i -= n;
  }
  *expert = -1, *row0 = 0, *rows = 0, *routed = 0;
}

/* Greedy grouping of consecutive items of sizes size[0..n) into groups of at most `cap`
 * (an item larger than cap forms a group alone). Writes the first item of each group to
 * first[0..groups] (first[groups] = n) when first != NULL; returns the group count. */
MOK_PHD int mok_plan_group(const int32_t *size, int n, int32_t cap, int32_t *first) {
  int groups = 0;
  int32_t used = 0;
  for (int i = 0; i < n; i++) {
    if (i == 0 || used + size[i] > cap) {
      if (first) first[groups] = i;
      groups++;
      used = 0;
    }
    used += size[i];
  }
  if (first) first[groups] = n;
  return groups;
}

/* The comm order: whether a COMBINE of the previous macrobatch whose tile starts at ring row
 * combine_ring comes before a DISPATCH whose tile ends at ring row dispatch_end (every
 * combine that frees a ring row the dispatch writes: so one communication CTA alone never
 * waits on a combine queued behind it). */
MOK_PHD int mok_plan_comm_before(int32_t combine_ring, int32_t dispatch_end) { return combine_ring < dispatch_end; }

/* The target of a DISPATCH wait on ring unit `unit` for macrobatch a of nmac whose rows are
 * mac_rows[0..nmac): how many times the unit was filled before in the pass. Macrobatches
 * nmac-1 .. a+1 run before a, and each fills ring rows [0, its rows) (no gaps), so this
 * counts those longer than the unit's first row; each of those fills is combined once,
 * and COMBINE arrives ring_free[unit] once per fill. */
MOK_PHD int32_t mok_plan_ring_fills(const int32_t *mac_rows, int nmac, int a, int32_t unit) {
  int32_t fills = 0;
  for (int b = a + 1; b < nmac; b++) fills += mac_rows[b] > unit * MOK_PLAN_UNIT_ROWS;
  return fills;
}

/* ---- the whole plan of a pass, built by one thread (host or device) ----------------------- */

/* The plan in caller-provided arrays (host or device memory), each of max_tiles entries
 * but mb_first_tile / mac_first_mb (max_tiles + 1) and comm / comp (2 * max_tiles). */
typedef struct mokPlan {
  int32_t num_tiles, num_mb, num_mac;
  int32_t *tile_expert, *tile_row0, *tile_rows, *tile_routed; /* mok_plan_tile's, in tile order */
  int32_t *tile_mb;       /* the tile's minibatch */
  int32_t *tile_ring;     /* the tile's first ring row (rows of its macrobatch's tiles before it) */
  int32_t *mb_first_tile; /* [num_mb + 1]: minibatch b's tiles [mb_first_tile[b], mb_first_tile[b+1]) */
  int32_t *mac_first_mb;  /* [num_mac + 1]: macrobatch a's minibatches, likewise */
  int32_t *mac_rows;      /* [num_mac]: ring rows macrobatch a fills */
  int32_t *comm;          /* [2 num_tiles] the comm order: t >= 0 DISPATCH(t), -1 - t COMBINE(t) */
  int32_t *comp;          /* [2 num_tiles] the compute order: t >= 0 GATEUP(t), -1 - t DOWN(t) */
} mokPlan_t;

/* Tiles a pass can have in segments of `rows` rows in all (each tile has >= 16 rows of its
 * segment; an empty segment has none). */
MOK_PHD int32_t mok_plan_max_tiles(int32_t rows) { return rows / MOK_PLAN_UNIT_ROWS; }

/* Words of one buffer that holds all of a plan's arrays for max_tiles tiles, and the
 * arrays' places in it (mok_plan_place: the layout a kernel and its host share). */
MOK_PHD int64_t mok_plan_words(int32_t max_tiles) { return 13 * ((int64_t)max_tiles + 1); }
MOK_PHD void mok_plan_place(mokPlan_t *p, int32_t *buf, int32_t max_tiles) {
  const int64_t n = (int64_t)max_tiles + 1;
  p->num_tiles = p->num_mb = p->num_mac = 0;
  p->tile_expert = buf, p->tile_row0 = buf + n, p->tile_rows = buf + 2 * n, p->tile_routed = buf + 3 * n;
  p->tile_mb = buf + 4 * n, p->tile_ring = buf + 5 * n, p->mb_first_tile = buf + 6 * n;
  p->mac_first_mb = buf + 7 * n, p->mac_rows = buf + 8 * n, p->comm = buf + 9 * n, p->comp = buf + 11 * n;
}

/* Builds the plan of the E segments (offset, count as mok_plan_tile) with minibatches of at
 * most mb_rows rows and a ring of ring_rows rows. Returns 0, or -1 where the tunables cannot
 * hold a tile (mb_rows below a tile's most rows, ring_rows below mb_rows, either not a
 * multiple of 16) or the tiles exceed max_tiles; nothing is guaranteed written then. O(E +
 * tiles); deterministic: the same inputs give the same plan on the host and the device. */
MOK_PHD int mok_plan_build(const int32_t *offset, const int32_t *count, int num_experts, int max_units,
                           int32_t mb_rows, int32_t ring_rows, int32_t max_tiles, mokPlan_t *p) {
  if (max_units < 1 || mb_rows < max_units * MOK_PLAN_UNIT_ROWS || ring_rows < mb_rows ||
      mb_rows % MOK_PLAN_UNIT_ROWS || ring_rows % MOK_PLAN_UNIT_ROWS)
    return -1;
  /* tiles */
  int32_t nt = 0;
  for (int e = 0; e < num_experts; e++) {
    const int seg = offset[e + 1] - offset[e], c = count ? count[e] : -1, rows = mok_plan_tok_rows(seg, c);
    const int n = mok_plan_tok_split(rows / MOK_PLAN_UNIT_ROWS, max_units);
    for (int i = 0; i < n; i++, nt++) {
      if (nt >= max_tiles) return -1;
      int off, r;
      mok_plan_tok_tile(rows, max_units, i, &off, &r);
      p->tile_expert[nt] = e, p->tile_row0[nt] = offset[e] + off, p->tile_rows[nt] = r;
      p->tile_routed[nt] = mok_plan_tile_routed(seg, c, off, r);
    }
  }
  /* minibatches over the tiles, macrobatches over the minibatches (mok_plan_group; the
   * minibatches' rows wait in mac_rows), tiles back to back in the ring */
  const int32_t nmb = mok_plan_group(p->tile_rows, nt, mb_rows, p->mb_first_tile);
  for (int b = 0; b < nmb; b++) {
    p->mac_rows[b] = 0;
    for (int32_t t = p->mb_first_tile[b]; t < p->mb_first_tile[b + 1]; t++) p->tile_mb[t] = b, p->mac_rows[b] += p->tile_rows[t];
  }
  const int32_t nmac = mok_plan_group(p->mac_rows, nmb, ring_rows, p->mac_first_mb);
  for (int a = 0; a < nmac; a++) {
    int32_t used = 0;
    for (int32_t t = p->mb_first_tile[p->mac_first_mb[a]]; t < p->mb_first_tile[p->mac_first_mb[a + 1]]; t++)
      p->tile_ring[t] = used, used += p->tile_rows[t];
    p->mac_rows[a] = used;
  }
  p->num_tiles = nt, p->num_mb = nmb, p->num_mac = nmac;
  /* the orders: the last macrobatch first; comm as the file's comment says */
  int32_t nc = 0, ns = 0;
  for (int a = nmac - 1; a >= 0; a--) {
    const int32_t t0 = p->mb_first_tile[p->mac_first_mb[a]], t1 = p->mb_first_tile[p->mac_first_mb[a + 1]];
    const int32_t c0 = a + 1 < nmac ? t1 : 0, c1 = a + 1 < nmac ? p->mb_first_tile[p->mac_first_mb[a + 2]] : 0;
    int32_t j = c0;
    for (int32_t t = t0; t < t1; t++) {
      for (; j < c1 && mok_plan_comm_before(p->tile_ring[j], p->tile_ring[t] + p->tile_rows[t]); j++) p->comm[nc++] = -1 - j;
      p->comm[nc++] = t;
    }
    for (; j < c1; j++) p->comm[nc++] = -1 - j;
    for (int b = p->mac_first_mb[a]; b < p->mac_first_mb[a + 1]; b++) {
      for (int32_t t = p->mb_first_tile[b]; t < p->mb_first_tile[b + 1]; t++) p->comp[ns++] = t;
      for (int32_t t = p->mb_first_tile[b]; t < p->mb_first_tile[b + 1]; t++) p->comp[ns++] = -1 - t;
    }
  }
  if (nmac) /* macrobatch 0's combines close the pass */
    for (int32_t t = 0; t < p->mb_first_tile[p->mac_first_mb[1]]; t++) p->comm[nc++] = -1 - t;
  return 0;
}

/* ---- the backward's orders over the same plan (docs/MEGAKERNEL.md, "Backward task plan") --
 * Macrobatches in ascending order (0 first: its context is still in the ring). A task is
 * MOK_PLAN_TASK(op, index): tile tasks index a tile, weight-gradient tasks a * E + e.
 *   comm:    per macrobatch a: for each of its tiles t, the BPUSH of macrobatch a - 1's tiles
 *            that start below t's end in the ring (mok_plan_comm_before), then [a != 0:
 *            BX(t)] BDY(t); then a - 1's remaining BPUSH; the last macrobatch's BPUSH close.
 *   compute: per macrobatch a: per minibatch: [a != 0: RECOMPUTE(t)], DDOWN(t), DGU(t) for
 *            its tiles; then per expert e with tiles in a: WDOWN(a, e), WGU(a, e).
 * Waits: BX / BDY ring_free[u] >= mok_plan_bwd_ring_fills(u) for every ring unit u of the
 * tile (each earlier fill of u was pushed and read by both weight gradients: BPUSH, WDOWN
 * and WGU each arrive ring_free once per unit of their tiles); RECOMPUTE x_ready[mb] (BX of
 * mb's tiles); DDOWN dy_ready[mb] and, a != 0, gu_ready[mb]; DGU dgu_ready[mb]; BPUSH
 * dx_ready[mb]; WDOWN dy_ready (and gu_ready) of every minibatch holding e's tiles in a, WGU
 * their dgu_ready; both w_chain[kind][e] == e's macrobatches before a (the fp32
 * accumulator's fixed order: needed, as a's rows of e may lie in ring units that a - 1 left
 * free early). */
enum { MOK_PLAN_BX = 0, MOK_PLAN_BDY, MOK_PLAN_BPUSH, MOK_PLAN_RECOMPUTE, MOK_PLAN_DDOWN, MOK_PLAN_DGU,
       MOK_PLAN_WDOWN, MOK_PLAN_WGU };
#define MOK_PLAN_TASK(op, index) ((int32_t)(((uint32_t)(op) << 28) | (uint32_t)(index)))
#define MOK_PLAN_TASK_OP(task) ((int)((uint32_t)(task) >> 28))
#define MOK_PLAN_TASK_INDEX(task) ((int32_t)((uint32_t)(task) & 0x0fffffffu))

/* The target of a backward BX / BDY wait on ring unit `unit` for macrobatch a: three
 * arrivals (BPUSH, WDOWN, WGU) per earlier fill; macrobatches 0 .. a-1 ran before a, each
 * filling ring rows [0, its rows). */
MOK_PHD int32_t mok_plan_bwd_ring_fills(const int32_t *mac_rows, int a, int32_t unit) {
  int32_t fills = 0;
  for (int b = 0; b < a; b++) fills += mac_rows[b] > unit * MOK_PLAN_UNIT_ROWS;
  return 3 * fills;
}
/* Writes the backward's comm and compute orders (each at most 3 tiles + 2 E nmac tasks)
 * and returns their lengths; -1 where a weight-gradient index would not fit 28 bits. */
MOK_PHD int mok_plan_bwd_orders(const mokPlan_t *p, int num_experts, int32_t *comm, int32_t *ncomm, int32_t *comp,
                                int32_t *ncomp) {
  if ((int64_t)p->num_mac * num_experts >= (1 << 28) || p->num_tiles >= (1 << 28)) return -1;
  int32_t nc = 0, ns = 0;
  for (int a = 0; a < p->num_mac; a++) {
    const int32_t t0 = p->mb_first_tile[p->mac_first_mb[a]], t1 = p->mb_first_tile[p->mac_first_mb[a + 1]];
    int32_t j = a ? p->mb_first_tile[p->mac_first_mb[a - 1]] : t0; /* a - 1's next BPUSH */
    for (int32_t t = t0; t < t1; t++) {
      for (; j < t0 && mok_plan_comm_before(p->tile_ring[j], p->tile_ring[t] + p->tile_rows[t]); j++)
        comm[nc++] = MOK_PLAN_TASK(MOK_PLAN_BPUSH, j);
      if (a) comm[nc++] = MOK_PLAN_TASK(MOK_PLAN_BX, t);
      comm[nc++] = MOK_PLAN_TASK(MOK_PLAN_BDY, t);
    }
    for (; j < t0; j++) comm[nc++] = MOK_PLAN_TASK(MOK_PLAN_BPUSH, j);
    if (a == p->num_mac - 1)
      for (int32_t t = t0; t < t1; t++) comm[nc++] = MOK_PLAN_TASK(MOK_PLAN_BPUSH, t);
    for (int b = p->mac_first_mb[a]; b < p->mac_first_mb[a + 1]; b++) {
      if (a)
        for (int32_t t = p->mb_first_tile[b]; t < p->mb_first_tile[b + 1]; t++) comp[ns++] = MOK_PLAN_TASK(MOK_PLAN_RECOMPUTE, t);
      for (int32_t t = p->mb_first_tile[b]; t < p->mb_first_tile[b + 1]; t++) comp[ns++] = MOK_PLAN_TASK(MOK_PLAN_DDOWN, t);
      for (int32_t t = p->mb_first_tile[b]; t < p->mb_first_tile[b + 1]; t++) comp[ns++] = MOK_PLAN_TASK(MOK_PLAN_DGU, t);
    }
    for (int32_t t = t0; t < t1; t++)
      if (t == t0 || p->tile_expert[t] != p->tile_expert[t - 1]) {
        comp[ns++] = MOK_PLAN_TASK(MOK_PLAN_WDOWN, a * num_experts + p->tile_expert[t]);
        comp[ns++] = MOK_PLAN_TASK(MOK_PLAN_WGU, a * num_experts + p->tile_expert[t]);
      }
  }
  *ncomm = nc, *ncomp = ns;
  return 0;
}

#endif /* MOK_PLAN_H */
