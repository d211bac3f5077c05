/*
 * plan.h — the forward megakernel's work decomposition on one expert-owning rank, as
 * host/device inline functions so the CPU model (tests/test_plan.c) and the GPU kernel
 * enumerate the same tasks in the same order (docs/MEGAKERNEL.md).
 *
 * Rows are the padded schedule of schedule.h (segments multiples of 64 rows).
 *   M tiles     each expert's segment in 128-row tiles, the last one 64 rows if the
 *               segment is an odd multiple of 64; tiles in expert order.
 *   minibatch   consecutive tiles, greedily, while their rows fit in mb_rows (at least one
 *               tile). Dispatch, gate/up, down and combine are synchronised per minibatch.
 *   macrobatch  consecutive minibatches, greedily, while their rows fit in ring_rows (at
 *               least one). A macrobatch's rows live in the ring at ring row
 *               (row - macrobatch's first row): any routing, up to every route on one
 *               expert, runs in ring_rows of activation memory.
 *   chunk       64 rows: the unit of dispatch and combine tasks, and of ring reuse.
 * Order: the LAST macrobatch is processed first (macrobatch 0 last, so its activations are
 * still in the ring afterwards: the saved forward context); inside a macrobatch,
 * minibatches in order.
 * Tasks and their waits (counters are monotonic within a pass):
 *   DISPATCH(chunk)  waits ring_free[ring chunk] >= times that ring chunk was filled before
 *                    in this pass (the previous occupant was combined); arrives x_ready[mb]
 *   GATEUP(tile)     waits x_ready[mb] == chunks of mb;          arrives h_ready[mb]
 *   DOWN(tile)       waits h_ready[mb] == tiles of mb;           arrives y_ready[mb]
 *   COMBINE(chunk)   waits y_ready[mb] == tiles of mb;           arrives ring_free[ring chunk]
 * Communication CTAs take DISPATCH / COMBINE tasks in the comm order: every dispatch chunk of
 * the first processed macrobatch, then, per following macrobatch, its dispatch chunks
 * interleaved with the previous macrobatch's combine chunks (combine chunk i, dispatch chunk
 * i, ...), then the last macrobatch's combines. Compute CTAs take GATEUP then DOWN tiles,
 * minibatch by minibatch, in processing order.
 */
#ifndef MOK_PLAN_H
#define MOK_PLAN_H

#include <stdint.h>

#if defined(__CUDACC__)
#define MOK_PHD __host__ __device__ __forceinline__
#else
#define MOK_PHD static inline
#endif

#define MOK_PLAN_TILE_ROWS 128
#define MOK_PLAN_CHUNK_ROWS 64

/* Tiles of one segment of `rows` rows (a multiple of 64). */
MOK_PHD int mok_plan_segment_tiles(int32_t rows) { return (rows + MOK_PLAN_TILE_ROWS - 1) / MOK_PLAN_TILE_ROWS; }

/* Total M tiles over the E_l segments. */
MOK_PHD int mok_plan_num_tiles(const int32_t *offset, int num_experts) {
  int n = 0;
  for (int e = 0; e < num_experts; e++) n += mok_plan_segment_tiles(offset[e + 1] - offset[e]);
  return n;
}

/* Tile i: its expert, first row and rows (128 or 64). O(E_l); a kernel keeps a prefix. */
MOK_PHD void mok_plan_tile(const int32_t *offset, int num_experts, int i, int *expert, int32_t *row0,
                           int32_t *rows) {
  for (int e = 0; e < num_experts; e++) {
    int n = mok_plan_segment_tiles(offset[e + 1] - offset[e]);
    if (i < n) {
      *expert = e;
      *row0 = offset[e] + i * MOK_PLAN_TILE_ROWS;
      int32_t left = offset[e + 1] - *row0;
      *rows = left < MOK_PLAN_TILE_ROWS ? left : MOK_PLAN_TILE_ROWS;
      return;
    }
    i -= n;
  }
  *expert = -1, *row0 = 0, *rows = 0;
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

#endif /* MOK_PLAN_H */
