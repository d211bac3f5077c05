/*
 * test_plan.c — the token tiles (src/plan.h, the cut the GEMM kernels run) and a CPU model
 * of the forward megakernel's task graph over them (docs/MEGAKERNEL.md), run under random
 * interleavings of communication and compute workers. It checks what the GPU kernel will
 * rely on, for any routing and tunables:
 *   - the tiles: each expert's routed rows covered once, in tiles of whole 16-row units,
 *     at most 176 rows, even within an expert, no tile past its segment;
 *   - no deadlock: with as little as one communication and one compute worker, and
 *     workers that hold a task while they wait (as a spinning CTA holds its SM);
 *   - ring safety: every GATEUP / DOWN / COMBINE reads ring rows holding exactly the rows
 *     it expects (never a stale or overwritten row, padding rows as padding), although the
 *     ring is smaller than the rows (ring reuse across macrobatches);
 *   - every routed row is combined exactly once, padding rows never;
 *   - the ring ends holding macrobatch 0's rows (the saved forward context);
 *   - and the model notices: with the dispatch's ring wait weakened by one, some runs
 *     read overwritten rows.
 * Data are tags (row ids), not numbers: the arithmetic is the GEMM tiles' job.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "test.h"
#include "util.h"

enum { OP_DISPATCH, OP_COMBINE, OP_GATEUP, OP_DOWN };

typedef struct {
  int op, tile, mb;
  int32_t wait_target; /* GATEUP / DOWN / COMBINE: tiles of mb (DISPATCH: per unit, mok_plan_ring_fills) */
} task_t;

typedef struct {
  int E;
  const int32_t *off, *count;
  int32_t ring_rows;
  mokPlan_t p;
  int32_t *buf; /* the plan's arrays */
  int *mb_mac;
  task_t *comm, *comp;
  int ncomm, ncomp;
} model_t;

/* Allocates a plan's arrays for max_tiles tiles in one buffer. */
static int32_t *plan_alloc(mokPlan_t *p, int32_t max_tiles) {
  int32_t *b = malloc(sizeof(int32_t) * (size_t)mok_plan_words(max_tiles));
  if (b) mok_plan_place(p, b, max_tiles);
  return b;
}

/* Builds the plan (mok_plan_build) and both task lists; returns 0 if the build refused. */
static int model_build(model_t *m, const int32_t *off, const int32_t *count, int E, int32_t mb_rows,
                       int32_t ring_rows) {
  memset(m, 0, sizeof *m);
  m->E = E, m->off = off, m->count = count, m->ring_rows = ring_rows;
  const int32_t max_tiles = mok_plan_max_tiles(off[E]);
  m->buf = plan_alloc(&m->p, max_tiles);
  if (mok_plan_build(off, count, E, MOK_PLAN_TILE_MAX_UNITS, mb_rows, ring_rows, max_tiles, &m->p) != 0) return 0;
  const mokPlan_t *p = &m->p;
  const int nt = p->num_tiles;
  m->mb_mac = malloc(sizeof(int) * ((size_t)p->num_mb + 1));
  for (int a = 0; a < p->num_mac; a++)
    for (int b = p->mac_first_mb[a]; b < p->mac_first_mb[a + 1]; b++) m->mb_mac[b] = a;
  m->comm = malloc(sizeof(task_t) * (2 * (size_t)nt + 1));
  m->comp = malloc(sizeof(task_t) * (2 * (size_t)nt + 1));
  for (int i = 0; i < 2 * nt; i++) {
    const int c = p->comm[i], t = c >= 0 ? c : -1 - c, mb = p->tile_mb[t];
    const int32_t tiles = p->mb_first_tile[mb + 1] - p->mb_first_tile[mb];
    m->comm[m->ncomm++] = (task_t){c >= 0 ? OP_DISPATCH : OP_COMBINE, t, mb, tiles};
    const int d = p->comp[i], u = d >= 0 ? d : -1 - d, mu = p->tile_mb[u];
    m->comp[m->ncomp++] = (task_t){d >= 0 ? OP_GATEUP : OP_DOWN, u, mu, p->mb_first_tile[mu + 1] - p->mb_first_tile[mu]};
  }
  return 1;
}

static void model_free(model_t *m) {
  free(m->buf); free(m->mb_mac); free(m->comm); free(m->comp);
}

/* A task's step on ring row rr: NULL if src holds the row's tag (then dst, if any, gets
 * it), else `what`. */
static const char *relay(const int32_t *src, int32_t *dst, int32_t rr, int32_t tag, const char *what) {
  if (src[rr] != tag) return what;
  if (dst) dst[rr] = tag;
  return NULL;
}

/* Two task lists behind callbacks: whether task i of the comm (is_comm) or compute list may
 * run now, and running it (NULL or an error). */
typedef struct {
  int ncomm, ncomp;
  int (*ready)(void *st, int is_comm, int i);
  const char *(*exec)(void *st, int is_comm, int i);
  void *st;
} lists_t;

/* Runs the lists with nc communication and ns compute workers under a random interleaving:
 * a free worker takes the next task of its list, in order, and holds it until it may run
 * (as a spinning CTA holds its SM); of the workers that can move, a random one, or half the
 * time the one whose task is furthest down its list (so that later tasks overtake earlier
 * ones whenever the waits allow). Returns NULL, a task's error or a deadlock message. */
static const char *interleave(const lists_t *L, int nc, int ns, rng_t *r) {
  static char msg[160];
  const int W = nc + ns, total = L->ncomm + L->ncomp;
  int *cur = malloc(sizeof(int) * (size_t)W), *cand = malloc(sizeof(int) * (size_t)W);
  for (int w = 0; w < W; w++) cur[w] = -1;
  int next[2] = {0, 0}, done = 0; /* next task of the compute [0] and comm [1] lists */
  const char *err = NULL;
  while (!err && done < total) {
    int n = 0;
    for (int w = 0; w < W; w++) {
      const int is_comm = w < nc;
      if (cur[w] < 0 ? next[is_comm] < (is_comm ? L->ncomm : L->ncomp) : L->ready(L->st, is_comm, cur[w])) cand[n++] = w;
    }
    if (!n) {
      snprintf(msg, sizeof msg, "deadlock after %d of %d tasks (%d comm, %d compute workers)", done, total, nc, ns);
      err = msg;
      break;
    }
    int w = cand[rng_int(r, n)];
    if (rng_int(r, 2)) /* half the time the ready task furthest down its list: later tasks overtake earlier ones */
      for (int c = 0; c < n; c++)
        if (cur[cand[c]] > cur[w]) w = cand[c];
    if (cur[w] < 0) {
      cur[w] = next[w < nc]++;
      continue;
    }
    err = L->exec(L->st, w < nc, cur[w]);
    cur[w] = -1;
    done++;
  }
  free(cur), free(cand);
  return err;
}

/* The forward model's state: counters and ring tags (+(row + 1) a routed row, -(row + 1) a
 * padding row, 0 never written). */
typedef struct {
  const model_t *m;
  int weaken;
  int32_t *x_ready, *h_ready, *y_ready, *ring_free, *xt, *ht, *yt;
  int *combined;
} fwd_state;

static int fwd_ready(void *st, int is_comm, int i) {
  const fwd_state *f = st;
  const model_t *m = f->m;
  const mokPlan_t *p = &m->p;
  const task_t *t = is_comm ? &m->comm[i] : &m->comp[i];
  switch (t->op) {
    case OP_DISPATCH: {
      const int a = m->mb_mac[t->mb];
      const int32_t u0 = p->tile_ring[t->tile] / MOK_PLAN_UNIT_ROWS;
      for (int32_t u = u0; u < u0 + p->tile_rows[t->tile] / MOK_PLAN_UNIT_ROWS; u++)
        if (f->ring_free[u] < mok_plan_ring_fills(p->mac_rows, p->num_mac, a, u) - f->weaken) return 0;
      return 1;
    }
    case OP_GATEUP: return f->x_ready[t->mb] >= t->wait_target;
    case OP_DOWN: return f->h_ready[t->mb] >= t->wait_target;
    default: return f->y_ready[t->mb] >= t->wait_target;
  }
}

static const char *fwd_exec(void *st, int is_comm, int i) {
  fwd_state *f = st;
  const model_t *m = f->m;
  const mokPlan_t *p = &m->p;
  const task_t *t = is_comm ? &m->comm[i] : &m->comp[i];
  const int32_t row0 = p->tile_row0[t->tile], nt = p->tile_rows[t->tile], routed = p->tile_routed[t->tile];
  const char *err = NULL;
  for (int32_t j = 0; j < nt && !err; j++) {
    const int32_t q = row0 + j, rr = p->tile_ring[t->tile] + j, tag = j < routed ? q + 1 : -(q + 1);
    switch (t->op) {
      case OP_DISPATCH: f->xt[rr] = tag; break;
      case OP_GATEUP: err = relay(f->xt, f->ht, rr, tag, "gate/up read a ring row that does not hold its row"); break;
      case OP_DOWN: err = relay(f->ht, f->yt, rr, tag, "down read an activation ring row that does not hold its row"); break;
      case OP_COMBINE: /* (padding: nothing to push) */
        if (j < routed && !(err = relay(f->yt, NULL, rr, tag, "combine read an output ring row that does not hold its row")))
          f->combined[q]++;
        break;
    }
  }
  switch (t->op) {
    case OP_DISPATCH: f->x_ready[t->mb]++; break;
    case OP_GATEUP: f->h_ready[t->mb]++; break;
    case OP_DOWN: f->y_ready[t->mb]++; break;
    case OP_COMBINE:
      for (int32_t u = p->tile_ring[t->tile] / MOK_PLAN_UNIT_ROWS; u < (p->tile_ring[t->tile] + nt) / MOK_PLAN_UNIT_ROWS; u++)
        f->ring_free[u]++;
      break;
  }
  return err;
}

/* Runs the forward's task lists with `nc` communication and `ns` compute workers under a
 * random interleaving; weaken != 0 lowers every dispatch's ring wait by one (the test that
 * the model notices). Returns NULL or a message (static buffer). */
static const char *model_run(const model_t *m, int nc, int ns, int weaken, rng_t *r) {
  static char msg[256];
  const mokPlan_t *p = &m->p;
  const size_t nmb = (size_t)p->num_mb + 1, R = (size_t)m->ring_rows + 1;
  int32_t *buf = calloc(3 * nmb + (size_t)m->ring_rows / MOK_PLAN_UNIT_ROWS + 1 + 3 * R, 4);
  fwd_state f = {m, weaken, buf, buf + nmb, buf + 2 * nmb, buf + 3 * nmb, NULL, NULL, NULL, NULL};
  f.xt = f.ring_free + m->ring_rows / MOK_PLAN_UNIT_ROWS + 1, f.ht = f.xt + R, f.yt = f.ht + R;
  f.combined = calloc((size_t)m->off[m->E] + 1, sizeof(int));
  const lists_t L = {m->ncomm, m->ncomp, fwd_ready, fwd_exec, &f};
  const char *err = interleave(&L, nc, ns, r);
  /* every routed row combined once, every other row never */
  for (int e = 0; !err && e < m->E; e++)
    for (int32_t q = m->off[e]; q < m->off[e + 1]; q++) {
      const int want = q - m->off[e] < m->count[e];
      if (f.combined[q] != want) {
        snprintf(msg, sizeof msg, "row %d (expert %d, %s) combined %d times", q, e, want ? "routed" : "padding",
                 f.combined[q]);
        err = msg;
        break;
      }
    }
  /* macrobatch 0 is processed last: the ring ends holding its x, activations and outputs
   * (the saved forward context) */
  for (int i = 0; !err && p->num_mac && i < p->mb_first_tile[p->mac_first_mb[1]]; i++)
    for (int32_t j = 0; j < p->tile_rows[i]; j++) {
      const int32_t rr = p->tile_ring[i] + j, q = p->tile_row0[i] + j, tag = j < p->tile_routed[i] ? q + 1 : -(q + 1);
      if (f.xt[rr] != tag || f.ht[rr] != tag || f.yt[rr] != tag) err = "the ring does not end holding macrobatch 0";
    }
  free(buf), free(f.combined);
  return err;
}

/* Random counts (0: random; 1: one hot expert; 2: many empty; 3: exact multiples of 176;
 * 4: small), segments padded to 64. */
static int make_counts(rng_t *r, int32_t *count, int32_t *off) {
  const int E = 1 + rng_int(r, 12), mode = rng_int(r, 5);
  off[0] = 0;
  for (int e = 0; e < E; e++) {
    count[e] = mode == 1   ? (e == E / 2 ? 1 + rng_int(r, 3000) : 0)
               : mode == 2 ? (rng_int(r, 3) ? 0 : 1 + rng_int(r, 400))
               : mode == 3 ? 176 * rng_int(r, 4)
               : mode == 4 ? rng_int(r, 40)
                           : rng_int(r, 700);
    off[e + 1] = off[e] + (count[e] + 63) / 64 * 64;
  }
  return E;
}

typedef const char *(*run_fn)(const model_t *m, int nc, int ns, int weaken, rng_t *r);

/* 300 random routings and tunables (rings from one minibatch to all rows), each run three
 * times by `run` with 1-8 comm and 1-16 compute workers. */
static void check_random_plans(test_ctx *t, run_fn run, uint64_t salt) {
  rng_t r = {test_seed() ^ salt};
  int reused = 0;
  for (int iter = 0; iter < 300; iter++) {
    int32_t count[16], off[17];
    const int E = make_counts(&r, count, off);
    static const int32_t mbs[] = {176, 256, 384, 512};
    const int32_t mb_rows = mbs[rng_int(&r, 4)];
    const int32_t ring_choice[] = {mb_rows, 2 * mb_rows, 1024, 1 << 20};
    const int32_t ring_rows = ring_choice[rng_int(&r, 4)];
    model_t m;
    CHECK_MSG(model_build(&m, off, count, E, mb_rows, ring_rows), "iter %d: a macrobatch exceeds the ring", iter);
    if (m.p.num_mac > 1) reused++;
    CHECK(m.p.num_tiles == mok_plan_num_tiles(off, count, E, MOK_PLAN_TILE_MAX_UNITS));
    for (int i = 0; i < m.p.num_tiles; i++) { /* the build's tiles are mok_plan_tile's */
      int e;
      int32_t row0, rows, routed;
      mok_plan_tile(off, count, E, MOK_PLAN_TILE_MAX_UNITS, i, &e, &row0, &rows, &routed);
      CHECK_MSG(e == m.p.tile_expert[i] && row0 == m.p.tile_row0[i] && rows == m.p.tile_rows[i] &&
                    routed == m.p.tile_routed[i],
                "iter %d tile %d", iter, i);
    }
    static const int ncs[] = {1, 2, 8}, nss[] = {1, 3, 16};
    for (int rep = 0; rep < 3; rep++) {
      const int nc = ncs[rng_int(&r, 3)], ns = nss[rng_int(&r, 3)];
      const char *err = run(&m, nc, ns, 0, &r);
      CHECK_MSG(!err, "iter %d (E %d, rows %d, mb %d, ring %d, %d tiles, %d macrobatches, %d comm / %d compute): %s",
                iter, E, off[E], mb_rows, ring_rows, m.p.num_tiles, m.p.num_mac, nc, ns, err);
    }
    model_free(&m);
  }
  CHECK_MSG(reused > 50, "only %d of 300 plans reused the ring: the test lost its point", reused);
}

/* Many tiles through a ring of two minibatches, many workers: with each of the n waits in
 * weakens[] one short, `run` must fail within 3000 runs (rows read before they are written
 * or after they are overwritten, a weight gradient out of order); with none, pass. The
 * ring waits were caught in 99% of runs, the backward's chain wait in 1% (about 20 of 2000;
 * a miss in 3000 runs: ~1e-13). */
static void check_catches(test_ctx *t, run_fn run, uint64_t salt, const int *weakens, int n) {
  rng_t r = {test_seed() ^ salt};
  /* small experts beside ones that span macrobatches (starting after other experts' tiles
   * in one, at the ring's start in the next), hot ones, an empty one */
  int32_t count[16] = {100, 100, 100, 600, 100, 100, 600, 100, 700, 333, 512, 48, 0, 1000, 176, 90}, off[17] = {0};
  for (int e = 0; e < 16; e++) off[e + 1] = off[e] + (count[e] + 63) / 64 * 64;
  model_t m;
  CHECK(model_build(&m, off, count, 16, 256, 512));
  CHECK(m.p.num_mac > 8);
  for (int i = 0; i < n; i++) {
    int caught = 0;
    for (int rep = 0; rep < 3000 && !caught; rep++) caught = run(&m, 8, 16, weakens[i], &r) != NULL;
    CHECK_MSG(caught, "3000 runs with wait %d weakened found nothing: the model checks too little", weakens[i]);
  }
  CHECK(run(&m, 8, 16, 0, &r) == NULL);
  model_free(&m);
}

MOK_TEST(plan_model_random_routings_and_tunables) { check_random_plans(t, model_run, 0x91a); }

MOK_TEST(plan_model_notices_a_weakened_ring_wait) {
  static const int weak[1] = {1};
  check_catches(t, model_run, 0x5eed, weak, 1);
}

MOK_TEST(plan_token_tiles_cover_routed_rows) {
  /* the examples the GEMM's comments give: 341 routed rows -> 176 + 176, 320 -> 160 + 160,
   * 512 -> 4 x 128, 192 -> 96 + 96, 16 -> 16, 336 -> 176 + 160 (not 3 x 112: one more tile
   * only where the equal tiles keep >= 128 rows), 448 -> 160 + 144 + 144 (not 4 x 112), 384
   * -> 3 x 128; and no counts: every segment row */
  static const struct { int seg, count, tiles, first, last; } ex[] = {
      {384, 341, 2, 176, 176}, {320, 320, 2, 160, 160}, {512, 512, 4, 128, 128}, {192, 192, 2, 96, 96},
      {64, 16, 1, 16, 16},     {64, 1, 1, 16, 16},      {64, 0, 1, 16, 16},      {0, 0, 0, 0, 0},
      {192, -1, 2, 96, 96},    {64, 64, 1, 64, 64},     {1088, 1024, 6, 176, 160}, {384, 330, 2, 176, 160},
      {448, 448, 3, 160, 144}, {384, 384, 3, 128, 128}};
  for (int i = 0; i < (int)(sizeof ex / sizeof ex[0]); i++) {
    const int rows = mok_plan_tok_rows(ex[i].seg, ex[i].count), n = mok_plan_tok_split(rows / 16, 11);
    CHECK_MSG(n == ex[i].tiles && n == mok_plan_expert_tiles(ex[i].seg, ex[i].count, 11), "case %d: %d tiles", i, n);
    if (!n) continue;
    int o0, n0, o1, n1;
    mok_plan_tok_tile(rows, 11, 0, &o0, &n0);
    mok_plan_tok_tile(rows, 11, n - 1, &o1, &n1);
    CHECK_MSG(o0 == 0 && n0 == ex[i].first && n1 == ex[i].last && o1 + n1 == rows, "case %d: %d+%d .. %d+%d", i, o0,
              n0, o1, n1);
  }
  /* every routing of the model: tiles in expert and row order, back to back from the
   * segment's start, whole units, <= 176 rows, within 16 rows of each other in an expert,
   * routed rows counted right, none past the segment */
  rng_t r = {test_seed() ^ 0x7a1e};
  for (int iter = 0; iter < 500; iter++) {
    int32_t count[16], off[17];
    const int E = make_counts(&r, count, off);
    const int nt = mok_plan_num_tiles(off, count, E, 11);
    int i = 0;
    for (int e = 0; e < E; e++) {
      int32_t next = off[e], routed = 0, lo = 1 << 30, hi = 0;
      for (; i < nt; i++) {
        int ex_e;
        int32_t row0, rows, rt;
        mok_plan_tile(off, count, E, 11, i, &ex_e, &row0, &rows, &rt);
        if (ex_e != e) break;
        CHECK_MSG(row0 == next && rows > 0 && rows % 16 == 0 && rows <= 176 && row0 + rows <= off[e + 1],
                  "iter %d expert %d tile %d: rows %d at %d (segment %d..%d)", iter, e, i, rows, row0, off[e],
                  off[e + 1]);
        CHECK(rt == (count[e] - (row0 - off[e]) < 0 ? 0 : count[e] - (row0 - off[e]) > rows ? rows : count[e] - (row0 - off[e])));
        next = row0 + rows, routed += rt;
        lo = rows < lo ? rows : lo, hi = rows > hi ? rows : hi;
      }
      CHECK_MSG(routed == count[e], "iter %d expert %d: %d of %d routed rows in tiles", iter, e, routed, count[e]);
      CHECK_MSG(off[e + 1] == off[e] || (hi - lo <= 16 && next - off[e] == mok_plan_tok_rows(off[e + 1] - off[e], count[e])),
                "iter %d expert %d: tiles %d..%d rows", iter, e, lo, hi);
    }
    CHECK_MSG(i == nt, "iter %d: %d of %d tiles walked", iter, i, nt);
    int ex_e;
    int32_t a, b, c;
    mok_plan_tile(off, count, E, 11, nt, &ex_e, &a, &b, &c);
    CHECK(ex_e == -1 && b == 0);
  }
}

MOK_TEST(plan_groups_and_ring_fills) {
  int32_t sizes[5] = {128, 64, 128, 128, 64};
  int32_t first[6];
  CHECK(mok_plan_group(sizes, 5, 256, first) == 3);
  CHECK(first[0] == 0 && first[1] == 2 && first[2] == 4 && first[3] == 5);
  CHECK(mok_plan_group(sizes, 0, 256, first) == 0 && first[0] == 0);
  int32_t big[2] = {512, 64};
  CHECK(mok_plan_group(big, 2, 128, first) == 2); /* an item larger than cap forms a group alone */
  /* macrobatches of 512, 176, 352 rows, processed 2, 1, 0: unit 0 filled by 2 and 1 before
   * 0; unit 11 (rows 176..191) by 2 only; unit 22 (352..) by none (macrobatch 2 ends there) */
  int32_t mac[3] = {512, 176, 352};
  CHECK(mok_plan_ring_fills(mac, 3, 0, 0) == 2);
  CHECK(mok_plan_ring_fills(mac, 3, 0, 10) == 2);
  CHECK(mok_plan_ring_fills(mac, 3, 0, 11) == 1);
  CHECK(mok_plan_ring_fills(mac, 3, 0, 22) == 0);
  CHECK(mok_plan_ring_fills(mac, 3, 1, 0) == 1);
  CHECK(mok_plan_ring_fills(mac, 3, 2, 0) == 0);
}

MOK_TEST(plan_build_refuses_bad_tunables) {
  int32_t count[3] = {300, 0, 41}, off[4] = {0, 320, 320, 384};
  mokPlan_t p;
  int32_t *buf = plan_alloc(&p, 64);
  CHECK(buf != NULL);
  CHECK(mok_plan_build(off, count, 3, 11, 160, 1024, 64, &p) == -1);  /* mb below a 176-row tile */
  CHECK(mok_plan_build(off, count, 3, 11, 512, 256, 64, &p) == -1);   /* ring below a minibatch */
  CHECK(mok_plan_build(off, count, 3, 11, 200, 1024, 64, &p) == -1);  /* not whole units */
  CHECK(mok_plan_build(off, count, 3, 0, 512, 1024, 64, &p) == -1);   /* no units */
  CHECK(mok_plan_build(off, count, 3, 11, 512, 1024, 2, &p) == -1);   /* 3 tiles, room for 2 */
  CHECK(mok_plan_build(off, count, 3, 11, 176, 176, 3, &p) == 0);     /* exactly enough */
  /* 300 rows -> 160 + 144 (304 rows computed, 300 routed), 41 -> 48: three minibatches of one
   * tile (176-row cap), each its own macrobatch (176-row ring); comm: D2, C2 D1, C1 D0, C0 */
  CHECK(p.num_tiles == 3 && p.num_mb == 3 && p.num_mac == 3);
  CHECK(p.tile_rows[0] == 160 && p.tile_routed[0] == 160 && p.tile_rows[1] == 144 && p.tile_routed[1] == 140);
  CHECK(p.tile_expert[2] == 2 && p.tile_row0[2] == 320 && p.tile_rows[2] == 48 && p.tile_routed[2] == 41);
  CHECK(p.tile_ring[0] == 0 && p.tile_ring[1] == 0 && p.mac_rows[1] == 144);
  static const int32_t comm[6] = {2, -3, 1, -2, 0, -1}, comp[6] = {2, -3, 1, -2, 0, -1};
  CHECK(memcmp(p.comm, comm, sizeof comm) == 0 && memcmp(p.comp, comp, sizeof comp) == 0);
  int32_t zero[2] = {0, 0};
  CHECK(mok_plan_build(zero, NULL, 1, 11, 176, 176, 0, &p) == 0 && p.num_tiles == 0 && p.num_mac == 0);
  free(buf);
}

/* ---- the backward's orders (mok_plan_bwd_orders) under the same kind of model ---------- */

/* Tiles [*t0, *t1) of expert e in macrobatch a. */
static void mac_expert_tiles(const mokPlan_t *p, int a, int e, int32_t *t0, int32_t *t1) {
  int32_t t = p->mb_first_tile[p->mac_first_mb[a]], end = p->mb_first_tile[p->mac_first_mb[a + 1]];
  while (t < end && p->tile_expert[t] != e) t++;
  *t0 = t;
  while (t < end && p->tile_expert[t] == e) t++;
  *t1 = t;
}

/* The backward model's state (tags as the forward's). */
typedef struct {
  const model_t *m;
  int weaken;
  const int32_t *comm, *comp;
  int32_t *x_ready, *dy_ready, *gu_ready, *dgu_ready, *dx_ready, *ring_free, *chain;
  int32_t *xt, *gt, *dyt, *dgt, *dxt;
  int *pushed, *wsum, *wlast; /* wsum: [2][rows] */
  size_t rows;
} bwd_state;

#define TAG(t, j) ((j) < p->tile_routed[t] ? p->tile_row0[t] + (j) + 1 : -(p->tile_row0[t] + (j) + 1))
#define FULL(arr, mb) ((arr)[mb] >= p->mb_first_tile[(mb) + 1] - p->mb_first_tile[(mb)])
#define UNITS(u, t) \
  for (int32_t u = p->tile_ring[t] / MOK_PLAN_UNIT_ROWS; u < (p->tile_ring[t] + p->tile_rows[t]) / MOK_PLAN_UNIT_ROWS; u++)

static int bwd_ready(void *st, int is_comm, int i) {
  const bwd_state *b = st;
  const mokPlan_t *p = &b->m->p;
  const int E = b->m->E;
  const int32_t task = is_comm ? b->comm[i] : b->comp[i], idx = MOK_PLAN_TASK_INDEX(task);
  const int op = MOK_PLAN_TASK_OP(task);
  if (op <= MOK_PLAN_DGU) {
    const int mb = p->tile_mb[idx], a = b->m->mb_mac[mb];
    switch (op) {
      case MOK_PLAN_BX:
      case MOK_PLAN_BDY:
        UNITS(u, idx) if (b->ring_free[u] < mok_plan_bwd_ring_fills(p->mac_rows, a, u) - (b->weaken == 1)) return 0;
        return 1;
      case MOK_PLAN_BPUSH: return FULL(b->dx_ready, mb);
      case MOK_PLAN_RECOMPUTE: return FULL(b->x_ready, mb);
      case MOK_PLAN_DDOWN: return FULL(b->dy_ready, mb) && (a == 0 || FULL(b->gu_ready, mb));
      default: return FULL(b->dgu_ready, mb);
    }
  }
  const int a = idx / E, e = idx % E, k = op == MOK_PLAN_WGU;
  int32_t t0, t1, before = 0;
  mac_expert_tiles(p, a, e, &t0, &t1);
  for (int c = 0; c < a; c++) {
    int32_t u0, u1;
    mac_expert_tiles(p, c, e, &u0, &u1);
    before += u1 > u0;
  }
  if (b->chain[k * E + e] < before - (b->weaken == 2)) return 0;
  for (int32_t t = t0; t < t1; t++) {
    const int mb = p->tile_mb[t];
    if (k ? !FULL(b->dgu_ready, mb) : !FULL(b->dy_ready, mb) || (a != 0 && !FULL(b->gu_ready, mb))) return 0;
  }
  return 1;
}

static const char *bwd_exec(void *st, int is_comm, int i) {
  bwd_state *b = st;
  const mokPlan_t *p = &b->m->p;
  const int E = b->m->E;
  const int32_t task = is_comm ? b->comm[i] : b->comp[i], idx = MOK_PLAN_TASK_INDEX(task);
  const int op = MOK_PLAN_TASK_OP(task);
  const char *err = NULL;
  if (op <= MOK_PLAN_DGU) {
    const int32_t t = idx, mb = p->tile_mb[t];
    for (int32_t j = 0; j < p->tile_rows[t] && !err; j++) {
      const int32_t rr = p->tile_ring[t] + j, tag = TAG(t, j);
      switch (op) {
        case MOK_PLAN_BX: b->xt[rr] = tag; break;
        case MOK_PLAN_BDY: b->dyt[rr] = tag; break;
        case MOK_PLAN_RECOMPUTE: err = relay(b->xt, b->gt, rr, tag, "recompute read a stale x row"); break;
        case MOK_PLAN_DDOWN:
          if (!(err = relay(b->gt, NULL, rr, tag, "down dgrad read a stale g|u row")))
            err = relay(b->dyt, b->dgt, rr, tag, "down dgrad read a stale dy row");
          break;
        case MOK_PLAN_DGU: err = relay(b->dgt, b->dxt, rr, tag, "gate/up dgrad read a stale dg|du row"); break;
        case MOK_PLAN_BPUSH:
          if (j < p->tile_routed[t] && !(err = relay(b->dxt, NULL, rr, tag, "a push read a stale dx row")))
            b->pushed[p->tile_row0[t] + j]++;
          break;
      }
    }
    switch (op) {
      case MOK_PLAN_BX: b->x_ready[mb]++; break;
      case MOK_PLAN_BDY: b->dy_ready[mb]++; break;
      case MOK_PLAN_RECOMPUTE: b->gu_ready[mb]++; break;
      case MOK_PLAN_DDOWN: b->dgu_ready[mb]++; break;
      case MOK_PLAN_DGU: b->dx_ready[mb]++; break;
      case MOK_PLAN_BPUSH: UNITS(u, t) b->ring_free[u]++; break;
    }
    return err;
  }
  const int a = idx / E, e = idx % E, k = op == MOK_PLAN_WGU;
  int32_t t0, t1;
  mac_expert_tiles(p, a, e, &t0, &t1);
  if (b->wlast[k * E + e] >= a) return "a weight gradient accumulated out of macrobatch order";
  b->wlast[k * E + e] = a;
  for (int32_t t = t0; t < t1 && !err; t++)
    for (int32_t j = 0; j < p->tile_rows[t] && !err; j++) {
      const int32_t rr = p->tile_ring[t] + j, tag = TAG(t, j);
      if (k ? b->dgt[rr] != tag || b->xt[rr] != tag : b->dyt[rr] != tag || b->gt[rr] != tag)
        err = k ? "dW_gate/up read a stale dg|du or x row" : "dW_down read a stale dy or act row";
      if (j < p->tile_routed[t]) b->wsum[(size_t)k * b->rows + (size_t)(p->tile_row0[t] + j)]++;
    }
  b->chain[k * E + e]++;
  for (int32_t t = t0; t < t1; t++) UNITS(u, t) b->ring_free[u]++;
  return err;
}

/* Runs the backward's orders of m's plan with nc comm and ns compute workers; weaken 1
 * lowers the ring wait by one, 2 the weight gradients' chain wait. Returns NULL or a
 * message. */
static const char *bwd_run(const model_t *m, int nc, int ns, int weaken, rng_t *r) {
  static char msg[256];
  const mokPlan_t *p = &m->p;
  const int E = m->E;
  const size_t cap = 3 * (size_t)p->num_tiles + 2 * (size_t)E * (size_t)p->num_mac + 1;
  int32_t *orders = malloc(8 * cap), ncomm = 0, ncomp = 0;
  if (mok_plan_bwd_orders(p, E, orders, &ncomm, orders + cap, &ncomp) != 0) return "mok_plan_bwd_orders refused";
  const size_t nmb = (size_t)p->num_mb + 1, R = (size_t)m->ring_rows + 1, rows = (size_t)m->off[E] + 1;
  const size_t U = (size_t)m->ring_rows / MOK_PLAN_UNIT_ROWS + 1;
  int32_t *ctr = calloc(5 * nmb + U + 2 * (size_t)E + 5 * R, 4);
  bwd_state b = {m, weaken, orders, orders + cap, ctr, ctr + nmb, ctr + 2 * nmb, ctr + 3 * nmb, ctr + 4 * nmb,
                 ctr + 5 * nmb, ctr + 5 * nmb + U, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, rows};
  b.xt = b.chain + 2 * E, b.gt = b.xt + R, b.dyt = b.gt + R, b.dgt = b.dyt + R, b.dxt = b.dgt + R;
  b.pushed = calloc(3 * rows + 2 * (size_t)E, sizeof(int)), b.wsum = b.pushed + rows, b.wlast = b.wsum + 2 * rows;
  for (int i = 0; i < 2 * E; i++) b.wlast[i] = -1;
  /* the forward leaves macrobatch 0's x and g|u, act in the ring */
  for (int32_t t = 0; p->num_mac && t < p->mb_first_tile[p->mac_first_mb[1]]; t++)
    for (int32_t j = 0; j < p->tile_rows[t]; j++) b.xt[p->tile_ring[t] + j] = b.gt[p->tile_ring[t] + j] = TAG(t, j);
  const lists_t L = {ncomm, ncomp, bwd_ready, bwd_exec, &b};
  const char *err = interleave(&L, nc, ns, r);
  for (int e = 0; !err && e < E; e++)
    for (int32_t q = m->off[e]; q < m->off[e + 1] && !err; q++) {
      const int want = q - m->off[e] < m->count[e];
      if (b.pushed[q] != want || b.wsum[q] != want || b.wsum[rows + q] != want) {
        snprintf(msg, sizeof msg, "row %d (expert %d, %s): pushed %d, in dW_down %d, in dW_gate/up %d times", q, e,
                 want ? "routed" : "padding", b.pushed[q], b.wsum[q], b.wsum[rows + q]);
        err = msg;
      }
    }
  free(orders), free(ctr), free(b.pushed);
  return err;
}
#undef UNITS
#undef FULL
#undef TAG

MOK_TEST(plan_backward_model_random_routings) { check_random_plans(t, bwd_run, 0xb4c); }

MOK_TEST(plan_backward_model_notices_weakened_waits) {
  static const int weak[2] = {1, 2}; /* the ring wait, the weight gradients' chain wait */
  check_catches(t, bwd_run, 0xb4d, weak, 2);
}
