/*
 * test_plan.c — a CPU model of the forward megakernel's task graph (src/plan.h,
 * docs/MEGAKERNEL.md), run under random interleavings of communication and compute
 * workers. It checks what the GPU kernel will rely on, for any routing and tunables:
 *   - no deadlock: with as little as one communication and one compute worker, and
 *     workers that hold a task while they wait (as a spinning CTA holds its SM);
 *   - ring safety: every GATEUP / DOWN / COMBINE reads ring rows holding exactly the rows
 *     it expects (never a stale or overwritten row), although the ring is smaller than the
 *     rows (ring reuse across macrobatches);
 *   - every routed row is combined exactly once, padding rows never;
 *   - the ring ends holding macrobatch 0's rows (the saved forward context).
 * Data are tags (row ids), not numbers: the arithmetic is the GEMM tiles' job.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "test.h"
#include "util.h"

enum { OP_DISPATCH, OP_COMBINE, OP_GATEUP, OP_DOWN };

typedef struct {
  int op, mb;
  int32_t row0, rows; /* chunk (dispatch/combine) or tile (gateup/down) */
  int32_t wait_target;
} task_t;

typedef struct {
  int E, ntiles, nmb, nmac;
  const int32_t *off;
  int32_t ring_rows;
  int32_t *tile_row0, *tile_rows, *mb_row0, *mb_rows, *mac_row0, *mac_rows;
  int *mb_first_tile, *mac_first_mb, *mb_mac, *mb_chunks;
  task_t *comm, *comp;
  int ncomm, ncomp;
} model_t;

static int32_t ring_of(const model_t *m, int mb, int32_t row) { return row - m->mac_row0[m->mb_mac[mb]]; }

/* Builds the plan and both task lists; returns 0 if the tunables cannot hold a macrobatch. */
static int model_build(model_t *m, const int32_t *off, int E, int32_t mb_rows, int32_t ring_rows) {
  memset(m, 0, sizeof *m);
  m->E = E, m->off = off, m->ring_rows = ring_rows;
  m->ntiles = mok_plan_num_tiles(off, E);
  int nt = m->ntiles;
  m->tile_row0 = malloc(sizeof(int32_t) * (nt + 1)), m->tile_rows = malloc(sizeof(int32_t) * (nt + 1));
  for (int i = 0; i < nt; i++) {
    int e;
    mok_plan_tile(off, E, i, &e, &m->tile_row0[i], &m->tile_rows[i]);
  }
  m->mb_first_tile = malloc(sizeof(int) * (nt + 2));
  m->nmb = mok_plan_group(m->tile_rows, nt, mb_rows, m->mb_first_tile);
  m->mb_row0 = malloc(sizeof(int32_t) * (m->nmb + 1)), m->mb_rows = malloc(sizeof(int32_t) * (m->nmb + 1));
  m->mb_chunks = malloc(sizeof(int) * (m->nmb + 1)), m->mb_mac = malloc(sizeof(int) * (m->nmb + 1));
  for (int b = 0; b < m->nmb; b++) {
    m->mb_row0[b] = m->tile_row0[m->mb_first_tile[b]];
    m->mb_rows[b] = 0;
    for (int i = m->mb_first_tile[b]; i < m->mb_first_tile[b + 1]; i++) m->mb_rows[b] += m->tile_rows[i];
    m->mb_chunks[b] = m->mb_rows[b] / MOK_PLAN_CHUNK_ROWS;
  }
  m->mac_first_mb = malloc(sizeof(int) * (m->nmb + 2));
  m->nmac = mok_plan_group(m->mb_rows, m->nmb, ring_rows, m->mac_first_mb);
  m->mac_row0 = malloc(sizeof(int32_t) * (m->nmac + 1)), m->mac_rows = malloc(sizeof(int32_t) * (m->nmac + 1));
  for (int a = 0; a < m->nmac; a++) {
    m->mac_row0[a] = m->mb_row0[m->mac_first_mb[a]];
    m->mac_rows[a] = 0;
    for (int b = m->mac_first_mb[a]; b < m->mac_first_mb[a + 1]; b++) m->mac_rows[a] += m->mb_rows[b], m->mb_mac[b] = a;
    if (m->mac_rows[a] > ring_rows) return 0;
  }
  int total_chunks = off[E] / MOK_PLAN_CHUNK_ROWS;
  m->comm = malloc(sizeof(task_t) * (2 * total_chunks + 1));
  m->comp = malloc(sizeof(task_t) * (2 * nt + 1));
  /* fills of each ring chunk so far, to give every dispatch its wait target */
  int32_t *fills = calloc((size_t)ring_rows / MOK_PLAN_CHUNK_ROWS + 1, sizeof(int32_t));
#define CHUNK_TASK(op_, a_, i_)                                                                 \
  do {                                                                                          \
    int32_t row_ = m->mac_row0[a_] + (i_) * MOK_PLAN_CHUNK_ROWS;                                 \
    int mb_ = m->mac_first_mb[a_];                                                              \
    while (m->mb_row0[mb_] + m->mb_rows[mb_] <= row_) mb_++;                                    \
    task_t t_ = {op_, mb_, row_, MOK_PLAN_CHUNK_ROWS, 0};                                        \
    int32_t rc_ = ring_of(m, mb_, row_) / MOK_PLAN_CHUNK_ROWS;                                   \
    if (op_ == OP_DISPATCH) t_.wait_target = fills[rc_]++;                                       \
    else t_.wait_target = m->mb_first_tile[mb_ + 1] - m->mb_first_tile[mb_];                     \
    m->comm[m->ncomm++] = t_;                                                                   \
  } while (0)
  /* processing order: the last macrobatch first */
  for (int a = m->nmac - 1; a >= 0; a--) {
    int nd = m->mac_rows[a] / MOK_PLAN_CHUNK_ROWS;
    int prev = a + 1 < m->nmac ? a + 1 : -1;
    int nc = prev >= 0 ? m->mac_rows[prev] / MOK_PLAN_CHUNK_ROWS : 0;
    for (int i = 0; i < nd || i < nc; i++) {
      if (i < nc) CHUNK_TASK(OP_COMBINE, prev, i);
      if (i < nd) CHUNK_TASK(OP_DISPATCH, a, i);
    }
    for (int b = m->mac_first_mb[a]; b < m->mac_first_mb[a + 1]; b++) {
      int tiles = m->mb_first_tile[b + 1] - m->mb_first_tile[b];
      for (int i = m->mb_first_tile[b]; i < m->mb_first_tile[b + 1]; i++)
        m->comp[m->ncomp++] = (task_t){OP_GATEUP, b, m->tile_row0[i], m->tile_rows[i], m->mb_chunks[b]};
      for (int i = m->mb_first_tile[b]; i < m->mb_first_tile[b + 1]; i++)
        m->comp[m->ncomp++] = (task_t){OP_DOWN, b, m->tile_row0[i], m->tile_rows[i], tiles};
    }
  }
  if (m->nmac) /* macrobatch 0's combines close the pass */
    for (int i = 0; i < m->mac_rows[0] / MOK_PLAN_CHUNK_ROWS; i++) CHUNK_TASK(OP_COMBINE, 0, i);
#undef CHUNK_TASK
  free(fills);
  return 1;
}

static void model_free(model_t *m) {
  free(m->tile_row0); free(m->tile_rows); free(m->mb_first_tile); free(m->mb_row0); free(m->mb_rows);
  free(m->mb_chunks); free(m->mb_mac); free(m->mac_first_mb); free(m->mac_row0); free(m->mac_rows);
  free(m->comm); free(m->comp);
}

/* Runs the task lists with `nc` communication and `ns` compute workers under a random
 * interleaving. Returns NULL or a message (static buffer). */
static const char *model_run(const model_t *m, const int32_t *count, int nc, int ns, rng_t *r) {
  static char msg[256];
  const int W = nc + ns;
  int32_t nring = m->ring_rows / MOK_PLAN_CHUNK_ROWS + 1;
  int32_t *x_ready = calloc((size_t)m->nmb + 1, 4), *h_ready = calloc((size_t)m->nmb + 1, 4);
  int32_t *y_ready = calloc((size_t)m->nmb + 1, 4), *ring_free = calloc((size_t)nring, 4);
  int32_t *xt = calloc((size_t)m->ring_rows + 1, 4), *ht = calloc((size_t)m->ring_rows + 1, 4);
  int32_t *yt = calloc((size_t)m->ring_rows + 1, 4);
  int32_t rows = m->off[m->E];
  int *combined = calloc((size_t)rows + 1, sizeof(int));
  int *cur = malloc(sizeof(int) * (size_t)W), *cand = malloc(sizeof(int) * (size_t)W);
  for (int w = 0; w < W; w++) cur[w] = -1;
  int next_comm = 0, next_comp = 0, done = 0, total = m->ncomm + m->ncomp;
  const char *err = NULL;
  while (!err && done < total) {
    int n = 0;
    for (int w = 0; w < W; w++) {
      int is_comm = w < nc;
      if (cur[w] < 0) {
        if (is_comm ? next_comm < m->ncomm : next_comp < m->ncomp) cand[n++] = w;
        continue;
      }
      const task_t *t = is_comm ? &m->comm[cur[w]] : &m->comp[cur[w]];
      int ready = 0;
      switch (t->op) {
        case OP_DISPATCH: ready = ring_free[ring_of(m, t->mb, t->row0) / MOK_PLAN_CHUNK_ROWS] >= t->wait_target; break;
        case OP_GATEUP: ready = x_ready[t->mb] >= t->wait_target; break;
        case OP_DOWN: ready = h_ready[t->mb] >= t->wait_target; break;
        case OP_COMBINE: ready = y_ready[t->mb] >= t->wait_target; break;
      }
      if (ready) cand[n++] = w;
    }
    if (!n) {
      snprintf(msg, sizeof msg, "deadlock after %d of %d tasks (%d comm, %d compute workers)", done, total, nc, ns);
      err = msg;
      break;
    }
    int w = cand[rng_int(r, n)];
    if (cur[w] < 0) { /* grab the next task of this worker's list, in order */
      cur[w] = w < nc ? next_comm++ : next_comp++;
      continue;
    }
    const task_t *t = w < nc ? &m->comm[cur[w]] : &m->comp[cur[w]];
    for (int32_t q = t->row0; q < t->row0 + t->rows && !err; q++) {
      int32_t rr = ring_of(m, t->mb, q);
      switch (t->op) {
        case OP_DISPATCH: xt[rr] = q + 1; break;
        case OP_GATEUP:
          if (xt[rr] != q + 1) err = "gate/up read a ring row that does not hold its row";
          ht[rr] = q + 1;
          break;
        case OP_DOWN:
          if (ht[rr] != q + 1) err = "down read an activation ring row that does not hold its row";
          yt[rr] = q + 1;
          break;
        case OP_COMBINE:
          if (yt[rr] != q + 1) err = "combine read an output ring row that does not hold its row";
          combined[q]++;
          break;
      }
    }
    switch (t->op) {
      case OP_DISPATCH: x_ready[t->mb]++; break;
      case OP_GATEUP: h_ready[t->mb]++; break;
      case OP_DOWN: y_ready[t->mb]++; break;
      case OP_COMBINE:
        ring_free[ring_of(m, t->mb, t->row0) / MOK_PLAN_CHUNK_ROWS]++;
        break;
    }
    cur[w] = -1;
    done++;
  }
  /* every routed row combined once; padding rows are combined as rows of their tile but
   * carry no route: the kernel skips them, the count here must still be exactly one */
  for (int e = 0; !err && e < m->E; e++)
    for (int32_t q = m->off[e]; q < m->off[e + 1]; q++)
      if (combined[q] != 1) {
        snprintf(msg, sizeof msg, "row %d (expert %d, %s) combined %d times", q, e,
                 q - m->off[e] < count[e] ? "routed" : "padding", combined[q]);
        err = msg;
        break;
      }
  /* macrobatch 0 is processed last: the ring ends holding its x, activations and outputs
   * (the saved forward context) */
  for (int32_t q = m->nmac ? m->mac_row0[0] : 0; !err && m->nmac && q < m->mac_row0[0] + m->mac_rows[0]; q++) {
    int32_t rr = q - m->mac_row0[0];
    if (xt[rr] != q + 1 || ht[rr] != q + 1 || yt[rr] != q + 1) err = "the ring does not end holding macrobatch 0";
  }
  free(x_ready); free(h_ready); free(y_ready); free(ring_free); free(xt); free(ht); free(yt);
  free(combined); free(cur); free(cand);
  return err;
}

MOK_TEST(plan_model_random_routings_and_tunables) {
  rng_t r = {test_seed() ^ 0x91a};
  int cases = 0, reused = 0;
  for (int iter = 0; iter < 300; iter++) {
    int E = 1 + rng_int(&r, 12);
    int32_t count[16], off[17];
    int mode = rng_int(&r, 4);
    off[0] = 0;
    for (int e = 0; e < E; e++) {
      /* 0: random; 1: one hot expert; 2: many empty; 3: exact multiples of 128 */
      count[e] = mode == 1 ? (e == E / 2 ? 1 + rng_int(&r, 3000) : 0)
                 : mode == 2 ? (rng_int(&r, 3) ? 0 : 1 + rng_int(&r, 400))
                 : mode == 3 ? 128 * rng_int(&r, 4)
                             : rng_int(&r, 700);
      off[e + 1] = off[e] + (count[e] + 63) / 64 * 64;
    }
    static const int32_t mbs[] = {128, 256, 384, 512};
    int32_t mb_rows = mbs[rng_int(&r, 4)];
    int32_t ring_choice[] = {mb_rows, 2 * mb_rows, 1024, 1 << 20};
    int32_t ring_rows = ring_choice[rng_int(&r, 4)];
    model_t m;
    CHECK_MSG(model_build(&m, off, E, mb_rows, ring_rows), "iter %d: a macrobatch exceeds the ring", iter);
    if (m.nmac > 1) reused++;
    static const int ncs[] = {1, 2, 8}, nss[] = {1, 3, 16};
    for (int rep = 0; rep < 3; rep++) {
      int nc = ncs[rng_int(&r, 3)], ns = nss[rng_int(&r, 3)];
      const char *err = model_run(&m, count, nc, ns, &r);
      CHECK_MSG(!err, "iter %d (E %d, rows %d, mb %d, ring %d, %d macrobatches, %d comm / %d compute): %s", iter, E,
                off[E], mb_rows, ring_rows, m.nmac, nc, ns, err);
      cases++;
    }
    model_free(&m);
  }
  CHECK_MSG(reused > 50, "only %d of 300 plans reused the ring: the test lost its point", reused);
  (void)cases;
}

MOK_TEST(plan_tiles_and_groups) {
  /* segments 0, 64, 128, 192, 320 rows: tiles 0 + 1 + 1 + 2 + 3 */
  int32_t off[6] = {0, 0, 64, 192, 384, 704};
  CHECK(mok_plan_num_tiles(off, 5) == 7);
  int e;
  int32_t row0, rows;
  mok_plan_tile(off, 5, 0, &e, &row0, &rows);
  CHECK(e == 1 && row0 == 0 && rows == 64);
  mok_plan_tile(off, 5, 3, &e, &row0, &rows);
  CHECK(e == 3 && row0 == 320 && rows == 64);
  mok_plan_tile(off, 5, 6, &e, &row0, &rows);
  CHECK(e == 4 && row0 == 640 && rows == 64);
  mok_plan_tile(off, 5, 7, &e, &row0, &rows);
  CHECK(e == -1 && rows == 0);
  int32_t sizes[5] = {128, 64, 128, 128, 64};
  int first[6];
  CHECK(mok_plan_group(sizes, 5, 256, first) == 3);
  CHECK(first[0] == 0 && first[1] == 2 && first[2] == 4 && first[3] == 5);
  CHECK(mok_plan_group(sizes, 0, 256, first) == 0 && first[0] == 0);
  int32_t big[2] = {512, 64};
  CHECK(mok_plan_group(big, 2, 128, first) == 2); /* an item larger than cap forms a group alone */
}
