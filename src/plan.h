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
 * equal (512 rows: 4 x 128, not 176 + 176 + 160: tiles of unequal cost drift apart under a
 * static schedule and stop sharing their weight block in L2). */
MOK_PHD int mok_plan_tok_split(int u, int max_units) {
  const int n = (u + max_units - 1) / max_units;
  return n > 0 && u % n != 0 && u % (n + 1) == 0 ? n + 1 : n;
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
      const int live = (c < 0 ? seg : c) - off; /* routed rows from the tile's first row on */
      *expert = e;
      *row0 = offset[e] + off;
      *rows = nt;
      *routed = live < 0 ? 0 : live < nt ? live : nt;
      return;
    }
    i -= n;
  }
  *expert = -1, *row0 = 0, *rows = 0, *routed = 0;
}

/* Greedy grouping of consecutive items of sizes size[0..n) into groups of at most `cap`
 * (an item larger than cap forms a group alone). Writes the first item of each group to
 * first[0..groups] (first[groups] = n) when first != NULL; returns the group count. */
MOK_PHD int mok_plan_group(const int32_t *size, int n, int32_t cap, int *first) {
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

#endif /* MOK_PLAN_H */
