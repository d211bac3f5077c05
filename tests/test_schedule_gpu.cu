/*
 * test_schedule_gpu.cu — the device schedule of one rank's own routes (src/schedule_dev.cu,
 * what mokImplMega's forward runs instead of the host's) against mokReferenceSchedule for
 * N = 1: the same counts and padded offsets, every route at the row the reference gives
 * it (row_tok, route_row), send positions a permutation consistent with row_map; on
 * random, duplicate / -1, one-hot, empty-expert, all-empty and zero-token routings and
 * odd expert counts. A bad id sets the flag, records the error word and writes nothing.
 * Also the expert-parallel schedule composed on the device from N simulated sources
 * (schedule_device_ep_matches_reference).
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "mok.h"
#include "schedule_dev.h"
#include "test.h"
#include "util.h"

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    CHECK_MSG(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));             \
  } while (0)

enum { R_RANDOM, R_DUP, R_HOT, R_EMPTY, R_NONE, R_BAD, R_MODES };

/* One routing of T tokens over E experts (k slots), on the device and against the host. */
static void one_case(test_ctx *t, rng_t *r, int E, int T, int k, int P, int mode) {
  mokConfig_t cfg = MOK_CONFIG_INITIALIZER;
  cfg.num_experts = E, cfg.hidden = 64, cfg.inter = 64, cfg.topk = k, cfg.num_ranks = 1;
  cfg.max_tokens = T > 0 ? T : 1, cfg.row_pad = P;
  mokLayer_t l = NULL;
  CHECK_OK(mokLayerCreate(&l, &cfg));
  if (t->failed) return;
  int64_t cap = 0;
  CHECK_OK(mokLayerScheduleCapacity(l, &cap));
  const int64_t R = (int64_t)T * k;
  int32_t *idx = (int32_t *)malloc(4 * (size_t)R + 4);
  for (int64_t q = 0; q < R; q++) {
    switch (mode) {
      case R_DUP: idx[q] = rng_int(r, 4) == 0 ? -1 : q % k && rng_int(r, 2) ? idx[q - 1] : rng_int(r, E); break;
      case R_HOT: idx[q] = E / 2; break;
      case R_EMPTY: idx[q] = rng_int(r, 2) ? 0 : E - 1; break;
      case R_NONE: idx[q] = -1; break;
      default: idx[q] = rng_int(r, E); break;
    }
  }
  if (mode == R_BAD && R > 0) idx[rng_int(r, (int)R)] = rng_int(r, 2) ? E : -2;
  /* reference */
  int32_t *cnt = (int32_t *)malloc(4 * (size_t)E), *off = (int32_t *)malloc(4 * (size_t)(E + 1));
  int32_t *rr = (int32_t *)malloc(4 * (size_t)cap);
  mokRankInput_t in = {T, NULL, idx, NULL};
  mokSchedule_t sc = {cap, cnt, off, NULL, rr};
  const int ref_ok = mode != R_BAD && mokReferenceSchedule(l, 0, &in, &sc) == mokSuccess;
  CHECK(mode == R_BAD || ref_ok);
  /* device */
  int32_t *d_idx = NULL, *d_seg = NULL, *d_pos = NULL, *d_rr = NULL, *d_tok = NULL, *d_map = NULL, *d_bad = NULL;
  unsigned long long *d_err = NULL;
  int32_t *d_scratch = NULL;
  CUDA_CHECK(cudaMalloc(&d_scratch, 4 * (size_t)mok_schedule_local_scratch(E)));
  CUDA_CHECK(cudaMalloc(&d_idx, 4 * (size_t)R + 4));
  CUDA_CHECK(cudaMalloc(&d_seg, 4 * (size_t)(2 * E + 1)));
  CUDA_CHECK(cudaMalloc(&d_pos, 4 * (size_t)R + 4));
  CUDA_CHECK(cudaMalloc(&d_rr, 4 * (size_t)R + 4));
  CUDA_CHECK(cudaMalloc(&d_tok, 4 * (size_t)cap));
  CUDA_CHECK(cudaMalloc(&d_map, 4 * (size_t)cap));
  CUDA_CHECK(cudaMalloc(&d_bad, 4));
  CUDA_CHECK(cudaMalloc(&d_err, 8));
  if (R) CUDA_CHECK(cudaMemcpy(d_idx, idx, 4 * (size_t)R, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(d_seg, 0x5a, 4 * (size_t)(2 * E + 1))); /* poison: every word must be written */
  CUDA_CHECK(cudaMemset(d_pos, 0x5a, 4 * (size_t)R + 4));
  CUDA_CHECK(cudaMemset(d_rr, 0x5a, 4 * (size_t)R + 4));
  CUDA_CHECK(cudaMemset(d_tok, 0x5a, 4 * (size_t)cap));
  CUDA_CHECK(cudaMemset(d_map, 0x5a, 4 * (size_t)cap));
  CUDA_CHECK(cudaMemset(d_bad, 0x5a, 4));
  CUDA_CHECK(cudaMemset(d_err, 0, 8));
  mokLocalSchedule_t s;
  memset(&s, 0, sizeof s);
  s.topk_idx = d_idx, s.num_tokens = T, s.topk = k, s.num_experts = E, s.row_pad = P;
  s.expert_count = d_seg, s.expert_offset = d_seg + E, s.send_pos = d_pos, s.route_row = d_rr;
  s.row_tok = d_tok, s.row_map = d_map, s.bad = d_bad, s.scratch = d_scratch, s.error_word = d_err, s.rank = 0;
  CHECK_OK(mok_schedule_local_launch(&s, 0));
  CUDA_CHECK(cudaDeviceSynchronize());
  int32_t *seg = (int32_t *)malloc(4 * (size_t)(2 * E + 1)), *pos = (int32_t *)malloc(4 * (size_t)R + 4);
  int32_t *rrow = (int32_t *)malloc(4 * (size_t)R + 4), *tok = (int32_t *)malloc(4 * (size_t)cap);
  int32_t *map = (int32_t *)malloc(4 * (size_t)cap), bad = 0;
  unsigned long long err = 0;
  CUDA_CHECK(cudaMemcpy(seg, d_seg, 4 * (size_t)(2 * E + 1), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(pos, d_pos, 4 * (size_t)R + 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(rrow, d_rr, 4 * (size_t)R + 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(tok, d_tok, 4 * (size_t)cap, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(map, d_map, 4 * (size_t)cap, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&bad, d_bad, 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&err, d_err, 8, cudaMemcpyDeviceToHost));
  if (mode == R_BAD) {
    CHECK_MSG(bad == 1 && err != 0, "bad id: flag %d, error word %llx", bad, err);
    CHECK_MSG(seg[0] == 0x5a5a5a5a && pos[0] == 0x5a5a5a5a && tok[0] == 0x5a5a5a5a, "bad id: results written");
  } else if (ref_ok) {
    CHECK_MSG(bad == 0 && err == 0, "flag %d, error word %llx", bad, err);
    for (int e = 0; e < E && !t->failed; e++)
      CHECK_MSG(seg[e] == cnt[e] && seg[E + e] == off[e], "E %d T %d mode %d expert %d: count %d / %d, offset %d / %d",
                E, T, mode, e, seg[e], cnt[e], seg[E + e], off[e]);
    CHECK_MSG(seg[2 * E] == off[E], "rows in use %d / %d", seg[2 * E], off[E]);
    char *seen = (char *)calloc((size_t)R + 1, 1);
    for (int32_t row = 0; row < off[E] && !t->failed; row++) {
      if (rr[row] < 0) {
        CHECK_MSG(tok[row] == -1 && map[row] == -1, "row %d: padding, got token %d, map %d", row, tok[row], map[row]);
        continue;
      }
      const int32_t q = rr[row]; /* N = 1: the route id is t * k + j */
      CHECK_MSG(tok[row] == q / k && rrow[q] == row, "row %d: route %d, got token %d and route_row %d", row, q, tok[row],
                rrow[q]);
      CHECK_MSG(map[row] == pos[q] && pos[q] >= 0 && pos[q] < R && !seen[pos[q]], "row %d: send position %d / map %d",
                row, pos[q], map[row]);
      if (pos[q] >= 0 && pos[q] < R) seen[pos[q]] = 1;
    }
    for (int64_t q = 0; q < R && !t->failed; q++)
      if (idx[q] < 0) CHECK_MSG(pos[q] == -1 && rrow[q] == -1, "empty slot %lld: pos %d, row %d", (long long)q, pos[q], rrow[q]);
    free(seen);
  }
  cudaFree(d_idx), cudaFree(d_seg), cudaFree(d_pos), cudaFree(d_rr), cudaFree(d_tok), cudaFree(d_map);
  cudaFree(d_bad), cudaFree(d_err), cudaFree(d_scratch);
  free(idx), free(cnt), free(off), free(rr), free(seg), free(pos), free(rrow), free(tok), free(map);
  mokLayerDestroy(l);
}

MOK_GPU_TEST(schedule_device_matches_reference, 1) {
  rng_t r = {test_seed() ^ 0x5c4ed};
  static const int Es[] = {1, 7, 64, 257, 1024};
  for (int m = 0; m < R_MODES && !t->failed; m++)
    for (int i = 0; i < 5 && !t->failed; i++) {
      const int E = Es[i], k = 1 + rng_int(&r, E < 8 ? E : 8);
      const int T = m == R_BAD ? 1 + rng_int(&r, 300) : rng_int(&r, 3) == 0 ? rng_int(&r, 40) : 500 + rng_int(&r, 3000);
      one_case(t, &r, E, T, k, 64 * (1 + rng_int(&r, 2)), m);
    }
  one_case(t, &r, 64, 0, 8, 64, R_RANDOM); /* no tokens */
  one_case(t, &r, 512, 8192, 10, 64, R_RANDOM); /* qwen3.5's size at EP1 */
  one_case(t, &r, 1024, 40000, 8, 64, R_DUP); /* more routes than 128 CTAs of 2048 */
}

/* The expert-parallel schedule on the device (schedule_dev.h, mok_schedule_ep_launch; stage A
 * of the megakernel at N > 1) with N sources simulated on one GPU: each source's send order
 * (the local schedule over the E global experts, row_pad 1, then the order scatter), then
 * every rank's composed schedule, against mokReferenceSchedule bitwise: counts, padded
 * offsets, src_count, every row in use. Uneven and empty token counts, dropped routes, one
 * hot expert; a source that refused its input (a bad id) and a capacity one row short set
 * the flag and leave row_route unwritten. */
static void ep_case(test_ctx *t, rng_t *r, int N, int El, int k, int Tmax, int P, int mode, int bad_src) {
  const int E = N * El;
  mokConfig_t cfg = MOK_CONFIG_INITIALIZER;
  cfg.num_experts = E, cfg.hidden = 64, cfg.inter = 64, cfg.topk = k, cfg.num_ranks = N;
  cfg.max_tokens = Tmax, cfg.row_pad = P;
  mokLayer_t l = NULL;
  CHECK_OK(mokLayerCreate(&l, &cfg));
  if (t->failed) return;
  int64_t cap = 0;
  CHECK_OK(mokLayerScheduleCapacity(l, &cap));
  int T[8];
  int32_t *idx[8] = {0}, *d_idx[8] = {0}, *d_cnt[8] = {0}, *d_pos[8] = {0}, *d_rr[8] = {0}, *d_tok[8] = {0};
  int32_t *d_map[8] = {0}, *d_bad[8] = {0}, *d_order[8] = {0}, *d_scr[8] = {0};
  mokRankInput_t in[8];
  for (int s = 0; s < N; s++) {
    T[s] = mode == R_NONE && s == 0 ? 0 : s == bad_src ? 1 + rng_int(r, Tmax) : rng_int(r, Tmax + 1);
    const int64_t R = (int64_t)T[s] * k;
    idx[s] = (int32_t *)malloc(4 * (size_t)R + 4);
    for (int64_t q = 0; q < R; q++)
      idx[s][q] = mode == R_HOT ? E / 2 : rng_int(r, 5) == 0 ? -1 : rng_int(r, E);
    if (s == bad_src && R > 0) idx[s][rng_int(r, (int)R)] = E;
    in[s] = (mokRankInput_t){T[s], NULL, idx[s], NULL};
    CUDA_CHECK(cudaMalloc(&d_idx[s], 4 * (size_t)R + 4));
    CUDA_CHECK(cudaMalloc(&d_cnt[s], 4 * (size_t)(2 * E + 1)));
    CUDA_CHECK(cudaMalloc(&d_pos[s], 4 * (size_t)R + 4));
    CUDA_CHECK(cudaMalloc(&d_rr[s], 4 * (size_t)R + 4));
    CUDA_CHECK(cudaMalloc(&d_tok[s], 4 * (size_t)R + 4));
    CUDA_CHECK(cudaMalloc(&d_map[s], 4 * (size_t)R + 4));
    CUDA_CHECK(cudaMalloc(&d_order[s], 4 * (size_t)R + 4));
    CUDA_CHECK(cudaMalloc(&d_bad[s], 4));
    CUDA_CHECK(cudaMalloc(&d_scr[s], 4 * (size_t)mok_schedule_local_scratch(E)));
    if (R) CUDA_CHECK(cudaMemcpy(d_idx[s], idx[s], 4 * (size_t)R, cudaMemcpyHostToDevice));
    mokLocalSchedule_t ls;
    memset(&ls, 0, sizeof ls);
    ls.topk_idx = d_idx[s], ls.num_tokens = T[s], ls.topk = k, ls.num_experts = E, ls.row_pad = 1;
    ls.expert_count = d_cnt[s], ls.expert_offset = d_cnt[s] + E, ls.send_pos = d_pos[s], ls.route_row = d_rr[s];
    ls.row_tok = d_tok[s], ls.row_map = d_map[s], ls.bad = d_bad[s], ls.scratch = d_scr[s], ls.rank = s;
    CHECK_OK(mok_schedule_local_launch(&ls, 0));
    CHECK_OK(mok_schedule_send_order_launch(d_pos[s], R, d_bad[s], d_order[s], 0));
  }
  int32_t *d_out = NULL;
  const size_t words = (size_t)El + (El + 1) + (size_t)N * El + (size_t)cap + 1;
  CUDA_CHECK(cudaMalloc(&d_out, 4 * words));
  int32_t *cnt = (int32_t *)malloc(4 * (size_t)El), *off = (int32_t *)malloc(4 * (size_t)(El + 1));
  int32_t *srcc = (int32_t *)malloc(4 * (size_t)N * El), *rr = (int32_t *)malloc(4 * (size_t)cap);
  int32_t *got = (int32_t *)malloc(4 * words);
  for (int rank = 0; rank < N && !t->failed; rank++) {
    for (int shrt = 0; shrt < 2 && !t->failed; shrt++) {
      mokSchedule_t sc = {cap, cnt, off, srcc, rr};
      const int ref_ok = bad_src < 0 && mokReferenceSchedule(l, rank, in, &sc) == mokSuccess;
      CHECK(bad_src >= 0 || ref_ok);
      if (shrt && (!ref_ok || off[El] == 0)) continue;
      CUDA_CHECK(cudaMemset(d_out, 0x5a, 4 * words));
      mokEpSchedule_t es;
      memset(&es, 0, sizeof es);
      es.num_ranks = N, es.rank = rank, es.local_experts = El, es.row_pad = P, es.t_max = Tmax, es.topk = k;
      for (int s = 0; s < N; s++)
        es.count[s] = d_cnt[s], es.off[s] = d_cnt[s] + E, es.order[s] = d_order[s], es.bad[s] = d_bad[s];
      es.capacity = shrt ? off[El] - 1 : cap;
      es.expert_count = d_out, es.expert_offset = d_out + El, es.src_count = d_out + 2 * El + 1;
      es.row_route = d_out + 2 * El + 1 + (size_t)N * El, es.flag = d_out + words - 1;
      CHECK_OK(mok_schedule_ep_launch(&es, 0));
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaMemcpy(got, d_out, 4 * words, cudaMemcpyDeviceToHost));
      const int32_t flag = got[words - 1], *g_route = got + 2 * El + 1 + (size_t)N * El;
      if (bad_src >= 0 || shrt) {
        CHECK_MSG(flag == (shrt ? 2 : 1) && g_route[0] == 0x5a5a5a5a, "N %d rank %d: flag %d (want %d), row 0 %d", N,
                  rank, flag, shrt ? 2 : 1, g_route[0]);
        continue;
      }
      CHECK_MSG(flag == 0, "N %d rank %d: flag %d", N, rank, flag);
      CHECK_MSG(!memcmp(got, cnt, 4 * (size_t)El) && !memcmp(got + El, off, 4 * (size_t)(El + 1)) &&
                    !memcmp(got + 2 * El + 1, srcc, 4 * (size_t)N * El),
                "N %d El %d k %d rank %d: counts, offsets or src_count differ", N, El, k, rank);
      for (int32_t row = 0; row < off[El] && !t->failed; row++)
        CHECK_MSG(g_route[row] == rr[row], "N %d El %d k %d P %d rank %d: row %d holds route %d, the reference %d", N,
                  El, k, P, rank, row, g_route[row], rr[row]);
    }
  }
  for (int s = 0; s < N; s++) {
    cudaFree(d_idx[s]), cudaFree(d_cnt[s]), cudaFree(d_pos[s]), cudaFree(d_rr[s]), cudaFree(d_tok[s]);
    cudaFree(d_map[s]), cudaFree(d_order[s]), cudaFree(d_bad[s]), cudaFree(d_scr[s]);
    free(idx[s]);
  }
  cudaFree(d_out);
  free(cnt), free(off), free(srcc), free(rr), free(got);
  mokLayerDestroy(l);
}

MOK_GPU_TEST(schedule_device_ep_matches_reference, 1) {
  rng_t r = {test_seed() ^ 0xe95c};
  static const int Ns[] = {1, 2, 3, 8};
  for (int i = 0; i < 4 && !t->failed; i++)
    for (int m = 0; m < 3 && !t->failed; m++) { /* R_RANDOM, R_HOT, R_NONE (source 0 without tokens) */
      const int mode = m == 0 ? R_RANDOM : m == 1 ? R_HOT : R_NONE;
      const int k = 1 + rng_int(&r, 8), El0 = 1 + rng_int(&r, 40), El = El0 * Ns[i] < k ? (k + Ns[i] - 1) / Ns[i] : El0;
      ep_case(t, &r, Ns[i], El, k, 1 + rng_int(&r, 700), 64 * (1 + rng_int(&r, 2)), mode, -1);
    }
  ep_case(t, &r, 8, 64, 8, 2048, 64, R_RANDOM, -1); /* an EP8 shape: 512 experts, 2048 tokens a rank */
  ep_case(t, &r, 4, 16, 4, 300, 64, R_RANDOM, 2);   /* source 2 refused its input */
}
