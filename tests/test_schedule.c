/*
 * test_schedule.c — the shared schedule (DESIGN.md 2a, src/schedule.h) through the
 * public mokReferenceSchedule: every route gets exactly one row; segments are padded
 * to P, disjoint and in expert order; inside a segment routes are in (s, t, j) order;
 * the result equals a closed-form computation done in another order; bad input is
 * refused without writing; the same schedule composed from every source's send order
 * (schedule_ep.h, the megakernel's arithmetic at N > 1) equals it.
 */
#include <stdlib.h>
#include <string.h>

#include "mok.h"
#include "schedule_ep.h"
#include "test.h"
#include "util.h"

typedef struct {
  int N, E, k, Tmax, P;
  int T[8];
  int32_t *idx[8];
} routing_case;

/* Random routing with -1 slots and duplicate ids; mode 1: all routes on one expert. */
static void make_routing(routing_case *c, rng_t *r, int mode) {
  for (int s = 0; s < c->N; s++) {
    c->idx[s] = malloc(sizeof(int32_t) * (size_t)(c->T[s] * c->k + 1));
    for (int q = 0; q < c->T[s] * c->k; q++) {
      int u = rng_int(r, 10);
      c->idx[s][q] = mode == 1 ? c->E - 1 : u == 0 ? -1 : rng_int(r, c->E);
    }
  }
}
/* A random shape: 1..max_n ranks, k 1..max_k, 1..max_el experts a rank (at least k in all),
 * up to max_t tokens a rank, P 64 or 128; rank `empty` (>= N: the last) without tokens,
 * none where it is negative. */
static void random_shape(routing_case *c, rng_t *r, int max_n, int max_k, int max_el, int max_t, int empty) {
  c->N = 1 + rng_int(r, max_n);
  c->k = 1 + rng_int(r, max_k);
  c->E = c->N * (1 + rng_int(r, max_el));
  while (c->E < c->k) c->E += c->N;
  c->Tmax = 1 + rng_int(r, max_t);
  c->P = 64 * (1 + rng_int(r, 2));
  if (empty >= c->N) empty = c->N - 1;
  for (int s = 0; s < c->N; s++) c->T[s] = s == empty ? 0 : rng_int(r, c->Tmax + 1);
}
static void free_routing(routing_case *c) {
  for (int s = 0; s < c->N; s++) free(c->idx[s]);
}

/* Checks one rank's schedule against the closed form; returns a message or NULL. */
static const char *verify(const routing_case *c, int rank, const mokSchedule_t *sc, char *buf, size_t n) {
  const int El = c->E / c->N;
  /* closed form: counts per (s, e), then each route's row */
  int64_t *srcc = calloc((size_t)c->N * El, sizeof(int64_t));
  int64_t *cnt = calloc((size_t)El, sizeof(int64_t)), *off = calloc((size_t)El + 1, sizeof(int64_t));
  for (int s = 0; s < c->N; s++)
    for (int q = 0; q < c->T[s] * c->k; q++) {
      int e = c->idx[s][q] - rank * El;
      if (c->idx[s][q] >= 0 && e >= 0 && e < El) srcc[s * El + e]++, cnt[e]++;
    }
  for (int e = 0; e < El; e++) off[e + 1] = off[e] + (cnt[e] + c->P - 1) / c->P * c->P;
  const char *err = NULL;
  for (int e = 0; e < El && !err; e++) {
    if (sc->expert_count[e] != cnt[e]) err = "expert_count differs";
    if (sc->expert_offset[e] != off[e] || sc->expert_offset[e + 1] != off[e + 1]) err = "expert_offset differs";
    for (int s = 0; s < c->N && sc->src_count; s++)
      if (sc->src_count[s * El + e] != srcc[s * El + e]) err = "src_count differs";
  }
  /* Visit the routes in reverse (t, j) order: the row is computed, not accumulated. */
  int64_t rows = off[El];
  char *seen = calloc((size_t)rows + 1, 1);
  for (int s = c->N - 1; s >= 0 && !err; s--)
    for (int q = c->T[s] * c->k - 1; q >= 0 && !err; q--) {
      int e = c->idx[s][q] - rank * El;
      if (c->idx[s][q] < 0 || e < 0 || e >= El) continue;
      int64_t before = 0;
      for (int s2 = 0; s2 < s; s2++) before += srcc[s2 * El + e];
      for (int q2 = 0; q2 < q; q2++) before += c->idx[s][q2] == c->idx[s][q];
      int64_t row = off[e] + before;
      int32_t id = (int32_t)(((int64_t)s * c->Tmax + q / c->k) * c->k + q % c->k);
      if (sc->row_route[row] != id) {
        snprintf(buf, n, "rank %d: row %lld holds route %d, want %d", rank, (long long)row, sc->row_route[row], id);
        err = buf;
      }
      if (seen[row]++) err = "two routes on one row";
    }
  for (int64_t q = 0; q < rows && !err; q++) {
    int e = 0;
    while (e < El && off[e + 1] <= q) e++;
    int pad = q >= off[e] + cnt[e];
    if (pad && sc->row_route[q] != -1) err = "a padding row is not -1";
    if (!pad && !seen[q]) err = "a row in use holds no route";
  }
  free(seen); free(srcc); free(cnt); free(off);
  return err;
}

static mokLayer_t make_layer(const routing_case *c) {
  mokConfig_t cfg = MOK_CONFIG_INITIALIZER;
  cfg.num_experts = c->E, cfg.hidden = 64, cfg.inter = 64, cfg.topk = c->k, cfg.num_ranks = c->N;
  cfg.max_tokens = c->Tmax, cfg.row_pad = c->P;
  mokLayer_t l = NULL;
  mokLayerCreate(&l, &cfg);
  return l;
}

MOK_TEST(schedule_invariants_random_routings) {
  rng_t r = {test_seed() ^ 0x51};
  for (int iter = 0; iter < 40; iter++) {
    routing_case c = {0};
    random_shape(&c, &r, 4, 6, 6, 40, iter % 5 == 0 ? 0 : -1);
    make_routing(&c, &r, iter % 7 == 3);
    mokLayer_t l = make_layer(&c);
    CHECK(l != NULL);
    mokRankInput_t in[8];
    for (int s = 0; s < c.N; s++) in[s] = (mokRankInput_t){c.T[s], NULL, c.idx[s], NULL};
    int64_t cap;
    CHECK_OK(mokLayerScheduleCapacity(l, &cap));
    int El = c.E / c.N;
    for (int rank = 0; rank < c.N; rank++) {
      int32_t *cnt = malloc(sizeof(int32_t) * El), *off = malloc(sizeof(int32_t) * (El + 1));
      int32_t *srcc = malloc(sizeof(int32_t) * c.N * El), *rows = malloc(sizeof(int32_t) * cap);
      mokSchedule_t sc = {cap, cnt, off, srcc, rows};
      CHECK_OK(mokReferenceSchedule(l, rank, in, &sc));
      CHECK(off[El] <= cap && off[El] % c.P == 0);
      char buf[256];
      const char *err = verify(&c, rank, &sc, buf, sizeof buf);
      CHECK_MSG(!err, "iter %d (N %d E %d k %d P %d): %s", iter, c.N, c.E, c.k, c.P, err);
      free(cnt); free(off); free(srcc); free(rows);
    }
    mokLayerDestroy(l);
    free_routing(&c);
  }
}

MOK_TEST(schedule_all_routes_on_one_expert_fill_capacity) {
  /* The worst case the capacity is sized for: every slot of every token of every rank
   * routes to local expert 0 of rank 0 (k duplicates per token). */
  routing_case c = {.N = 3, .E = 6, .k = 4, .Tmax = 50, .P = 128, .T = {50, 50, 50}};
  for (int s = 0; s < 3; s++) {
    c.idx[s] = malloc(sizeof(int32_t) * 200);
    for (int q = 0; q < 200; q++) c.idx[s][q] = 0;
  }
  mokLayer_t l = make_layer(&c);
  mokRankInput_t in[3];
  for (int s = 0; s < 3; s++) in[s] = (mokRankInput_t){50, NULL, c.idx[s], NULL};
  int64_t cap;
  CHECK_OK(mokLayerScheduleCapacity(l, &cap));
  int32_t cnt[2], off[3], rows[1024];
  CHECK(cap <= 1024);
  mokSchedule_t sc = {cap, cnt, off, NULL, rows};
  CHECK_OK(mokReferenceSchedule(l, 0, in, &sc));
  CHECK(cnt[0] == 600 && cnt[1] == 0 && off[1] == 640 && off[2] == 640 && off[2] <= cap);
  char buf[256];
  const char *err = verify(&c, 0, &sc, buf, sizeof buf);
  CHECK_MSG(!err, "%s", err);
  /* other ranks: empty segments, no rows */
  CHECK_OK(mokReferenceSchedule(l, 2, in, &sc));
  CHECK(cnt[0] == 0 && cnt[1] == 0 && off[0] == 0 && off[2] == 0);
  mokLayerDestroy(l);
  free_routing(&c);
}

MOK_TEST(schedule_rejects_bad_input_without_writing) {
  routing_case c = {.N = 2, .E = 4, .k = 2, .Tmax = 4, .P = 64, .T = {4, 3}};
  rng_t r = {test_seed()};
  make_routing(&c, &r, 0);
  /* at least one route lands on rank 0, so the 10-row capacity below is too small whatever the seed
     (a routing with no rank-0 route needs no rows and would pass) */
  c.idx[0][0] = 0;
  mokLayer_t l = make_layer(&c);
  mokRankInput_t in[2] = {{4, NULL, c.idx[0], NULL}, {3, NULL, c.idx[1], NULL}};
  int32_t cnt[2] = {77, 77}, off[3] = {77, 77, 77}, rows[512];
  for (int i = 0; i < 512; i++) rows[i] = 77;
  mokSchedule_t sc = {512, cnt, off, NULL, rows};
#define UNTOUCHED() (cnt[0] == 77 && off[0] == 77 && rows[0] == 77)
  c.idx[1][5] = 4; /* expert id out of range */
  CHECK_STATUS(mokReferenceSchedule(l, 0, in, &sc), mokInvalidArgument);
  CHECK_MSG(strstr(mokGetLastError(), "rank 1") && strstr(mokGetLastError(), "topk_idx[2, 1] = 4"), "%s",
            mokGetLastError());
  CHECK(UNTOUCHED());
  CHECK(strstr(mokLayerGetLastError(l), "topk_idx") != NULL);
  c.idx[1][5] = -2;
  CHECK_STATUS(mokReferenceSchedule(l, 0, in, &sc), mokInvalidArgument);
  CHECK(UNTOUCHED());
  c.idx[1][5] = -1;
  in[1].num_tokens = 5; /* > max_tokens */
  CHECK_STATUS(mokReferenceSchedule(l, 0, in, &sc), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "num_tokens") && UNTOUCHED());
  in[1].num_tokens = 3;
  CHECK_STATUS(mokReferenceSchedule(l, 2, in, &sc), mokInvalidArgument);
  CHECK_STATUS(mokReferenceSchedule(l, 0, NULL, &sc), mokInvalidArgument);
  CHECK_STATUS(mokReferenceSchedule(l, 0, in, NULL), mokInvalidArgument);
  CHECK_STATUS(mokReferenceSchedule(NULL, 0, in, &sc), mokInvalidArgument);
  mokSchedule_t small = {10, cnt, off, NULL, rows};
  CHECK_STATUS(mokReferenceSchedule(l, 0, in, &small), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "capacity") && UNTOUCHED());
  in[0].topk_idx = NULL;
  CHECK_STATUS(mokReferenceSchedule(l, 0, in, &sc), mokInvalidArgument);
  CHECK(UNTOUCHED());
  in[0].topk_idx = c.idx[0];
  CHECK_OK(mokReferenceSchedule(l, 0, in, &sc)); /* still usable after errors */
  mokLayerDestroy(l);
  free_routing(&c);
}

/* The schedule composed from every source's send order (schedule_ep.h: the arithmetic of
 * the megakernel at N > 1: each source orders its own routes, the counts are exchanged,
 * each expert rank lays out its segments row by row) equals mokReferenceSchedule on every
 * rank, bitwise, over random shapes (N up to 8, uneven and empty token counts, dropped
 * routes, every route on one expert, P 64 and 128); a bad id is reported at its slot with
 * nothing written; a capacity too small is reported with row_route untouched. */
MOK_TEST(schedule_composed_from_sources_equals_reference) {
  rng_t r = {test_seed() ^ 0xe9};
  for (int iter = 0; iter < 60 && !t->failed; iter++) {
    routing_case c = {0};
    random_shape(&c, &r, 8, 8, 8, 60, iter % 4 == 0 ? 8 : -1); /* (8: the last rank without tokens) */
    make_routing(&c, &r, iter % 6 == 5);
    mokLayer_t l = make_layer(&c);
    CHECK(l != NULL);
    mokRankInput_t in[8];
    int32_t *scount[8], *soff[8], *sorder[8];
    for (int s = 0; s < c.N; s++) {
      in[s] = (mokRankInput_t){c.T[s], NULL, c.idx[s], NULL};
      scount[s] = malloc(sizeof(int32_t) * (size_t)c.E);
      soff[s] = malloc(sizeof(int32_t) * (size_t)(c.E + 1));
      sorder[s] = malloc(sizeof(int32_t) * (size_t)(c.T[s] * c.k + 1));
      CHECK(mok_sched_send(c.idx[s], c.T[s], c.k, c.E, scount[s], soff[s], sorder[s]) == -1);
    }
    int64_t cap;
    CHECK_OK(mokLayerScheduleCapacity(l, &cap));
    const int El = c.E / c.N;
    int32_t *cnt[2], *off[2], *srcc[2], *rows[2];
    for (int v = 0; v < 2; v++) {
      cnt[v] = malloc(sizeof(int32_t) * (size_t)El), off[v] = malloc(sizeof(int32_t) * (size_t)(El + 1));
      srcc[v] = malloc(sizeof(int32_t) * (size_t)(c.N * El)), rows[v] = malloc(sizeof(int32_t) * (size_t)cap);
    }
    for (int rank = 0; rank < c.N && !t->failed; rank++) {
      for (int64_t q = 0; q < cap; q++) rows[0][q] = rows[1][q] = -7; /* rows past the last segment: untouched */
      mokSchedule_t sc = {cap, cnt[0], off[0], srcc[0], rows[0]};
      CHECK_OK(mokReferenceSchedule(l, rank, in, &sc));
      const int64_t used = mok_sched_compose(c.N, El, rank, c.P, c.Tmax, c.k, (const int32_t *const *)scount,
                                             (const int32_t *const *)soff, (const int32_t *const *)sorder, cnt[1],
                                             off[1], rank & 1 ? srcc[1] : NULL, rows[1], cap);
      CHECK_MSG(used == off[0][El], "iter %d rank %d: %lld rows, the reference %d", iter, rank, (long long)used,
                off[0][El]);
      CHECK(!memcmp(cnt[0], cnt[1], sizeof(int32_t) * (size_t)El));
      CHECK(!memcmp(off[0], off[1], sizeof(int32_t) * (size_t)(El + 1)));
      if (rank & 1) CHECK(!memcmp(srcc[0], srcc[1], sizeof(int32_t) * (size_t)(c.N * El)));
      int64_t bad = -1;
      for (int64_t q = 0; q < cap && bad < 0; q++) bad = rows[0][q] != rows[1][q] ? q : -1;
      CHECK_MSG(bad < 0, "iter %d (N %d E %d k %d P %d) rank %d: row %lld holds route %d, the reference %d", iter,
                c.N, c.E, c.k, c.P, rank, (long long)bad, bad < 0 ? 0 : rows[1][bad], bad < 0 ? 0 : rows[0][bad]);
      if (off[0][El] > 0) { /* a capacity one row short: reported, row_route untouched */
        for (int64_t q = 0; q < cap; q++) rows[1][q] = -7;
        CHECK(mok_sched_compose(c.N, El, rank, c.P, c.Tmax, c.k, (const int32_t *const *)scount,
                                (const int32_t *const *)soff, (const int32_t *const *)sorder, cnt[1], off[1], NULL,
                                rows[1], off[0][El] - 1) == -1);
        CHECK(rows[1][0] == -7);
      }
    }
    for (int v = 0; v < 2; v++) free(cnt[v]), free(off[v]), free(srcc[v]), free(rows[v]);
    for (int s = 0; s < c.N; s++) free(scount[s]), free(soff[s]), free(sorder[s]);
    mokLayerDestroy(l);
    free_routing(&c);
  }
  /* a bad id: its slot reported, nothing written */
  int32_t idx[6] = {0, 1, -1, 3, 4, 2}, count[4] = {9, 9, 9, 9}, off[5] = {9, 9, 9, 9, 9}, order[6] = {9};
  CHECK(mok_sched_send(idx, 3, 2, 4, count, off, order) == 4);
  CHECK(count[0] == 9 && off[0] == 9 && order[0] == 9);
  idx[4] = -2;
  CHECK(mok_sched_send(idx, 3, 2, 4, count, off, order) == 4);
  idx[4] = 3;
  CHECK(mok_sched_send(idx, 3, 2, 4, count, off, order) == -1);
  CHECK(count[0] == 1 && count[1] == 1 && count[2] == 1 && count[3] == 2 && off[4] == 5);
  CHECK(order[off[3]] == 3 && order[off[3] + 1] == 4); /* expert 3's slots in (t, j) order */
}
