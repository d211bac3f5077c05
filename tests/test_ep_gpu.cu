/*
 * test_ep_gpu.cu — the expert-parallel data movement of stage A (src/ep_dev.h) with N ranks
 * simulated on one GPU: every rank's schedule composed on the host (schedule_ep.h, checked
 * against mokReferenceSchedule in test_schedule.c), random y rows on every expert rank,
 * each rank's push into every source's combine buffer; then every routed slot (t, j) of
 * every source holds exactly the y row of the row that carries route (s, t, j), every
 * dropped route's slot is untouched, and the slot map is q or -1. A set flag moves nothing.
 * The backward's pull (ep_pull_dy_from_sources): every row becomes bf16(w * d_out row),
 * bitwise, and every source's d_topk_w slot holds the row's <d_out, y> (float64 within
 * 1e-5 of the terms' magnitude), its dropped routes' slots 0.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ep_dev.h"
#include "gemm.h"
#include "mok.h"
#include "schedule_ep.h"
#include "test.h"
#include "util.h"

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    CHECK_MSG(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));             \
  } while (0)

/* Every expert rank's rows: its schedule composed on the host from the sources' send
 * orders, random y rows (bits: values that never equal the 0x7f7f poison; else bf16 of
 * [-1, 1)), both on the host and the device; d_rows: [rows in use, a flag of 0]. */
typedef struct {
  int64_t cap;
  int32_t *rr[8], *d_rr[8], *d_rows[8];
  mokBf16 *y[8], *d_y[8];
  int64_t used[8];
} ep_ranks;

static void ep_ranks_setup(test_ctx *t, rng_t *r, ep_ranks *e, int N, int El, int k, int Tmax, int H, int P,
                           int32_t *const *cnt, int32_t *const *off, int32_t *const *order, int bits) {
  memset(e, 0, sizeof *e);
  e->cap = (int64_t)N * Tmax * k + (int64_t)El * (P - 1) + P;
  const int64_t cap = e->cap;
  for (int q = 0; q < N && !t->failed; q++) {
    int32_t *ec = (int32_t *)malloc(4 * (size_t)El), *eo = (int32_t *)malloc(4 * (size_t)(El + 1));
    e->rr[q] = (int32_t *)malloc(4 * (size_t)cap);
    e->used[q] = mok_sched_compose(N, El, q, P, Tmax, k, (const int32_t *const *)cnt, (const int32_t *const *)off,
                                   (const int32_t *const *)order, ec, eo, NULL, e->rr[q], cap);
    CHECK(e->used[q] >= 0);
    e->y[q] = (mokBf16 *)malloc(2 * (size_t)cap * H);
    for (int64_t i = 0; i < cap * H; i++)
      e->y[q][i] = bits ? (mokBf16)(rng_next(r) & 0x7f7f) : mok_f32_to_bf16((float)rng_sym(r));
    CUDA_CHECK(cudaMalloc(&e->d_y[q], 2 * (size_t)cap * H));
    CUDA_CHECK(cudaMalloc(&e->d_rr[q], 4 * (size_t)cap));
    CUDA_CHECK(cudaMalloc(&e->d_rows[q], 8));
    CUDA_CHECK(cudaMemcpy(e->d_y[q], e->y[q], 2 * (size_t)cap * H, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(e->d_rr[q], e->rr[q], 4 * (size_t)cap, cudaMemcpyHostToDevice));
    const int32_t rows_flag[2] = {(int32_t)e->used[q], 0};
    CUDA_CHECK(cudaMemcpy(e->d_rows[q], rows_flag, 8, cudaMemcpyHostToDevice));
    free(ec), free(eo);
  }
}
static void ep_ranks_free(ep_ranks *e, int N) {
  for (int q = 0; q < N; q++) cudaFree(e->d_y[q]), cudaFree(e->d_rr[q]), cudaFree(e->d_rows[q]), free(e->rr[q]), free(e->y[q]);
}
/* The row of expert rank e_rank that holds route id, or -1. */
static int64_t ep_row_of(const ep_ranks *e, int e_rank, int32_t id) {
  for (int64_t i = 0; i < e->used[e_rank]; i++)
    if (e->rr[e_rank][i] == id) return i;
  return -1;
}

static void push_case(test_ctx *t, rng_t *r, int N, int El, int k, int Tmax, int H, int P, int hot) {
  const int E = N * El;
  int T[8];
  int32_t *idx[8] = {0}, *cnt[8] = {0}, *off[8] = {0}, *order[8] = {0};
  for (int s = 0; s < N; s++) {
    T[s] = rng_int(r, Tmax + 1);
    idx[s] = (int32_t *)malloc(4 * ((size_t)T[s] * k + 1));
    for (int64_t q = 0; q < (int64_t)T[s] * k; q++) idx[s][q] = hot ? E - 1 : rng_int(r, 4) == 0 ? -1 : rng_int(r, E);
    cnt[s] = (int32_t *)malloc(4 * (size_t)E), off[s] = (int32_t *)malloc(4 * (size_t)(E + 1));
    order[s] = (int32_t *)malloc(4 * ((size_t)T[s] * k + 1));
    CHECK(mok_sched_send(idx[s], T[s], k, E, cnt[s], off[s], order[s]) == -1);
  }
  ep_ranks er;
  ep_ranks_setup(t, r, &er, N, El, k, Tmax, H, P, cnt, off, order, 1);
  /* every source's combine buffer, poisoned */
  mokBf16 *d_comb[8] = {0};
  for (int s = 0; s < N; s++) {
    CUDA_CHECK(cudaMalloc(&d_comb[s], 2 * ((size_t)T[s] * k + 1) * H));
    CUDA_CHECK(cudaMemset(d_comb[s], 0x7f, 2 * ((size_t)T[s] * k + 1) * H));
  }
  /* a set flag first: nothing moves */
  for (int pass = 0; pass < 2 && !t->failed; pass++) {
    for (int e_rank = 0; e_rank < N && !t->failed; e_rank++) {
      if (pass == 0) {
        const int32_t one = 1;
        CUDA_CHECK(cudaMemcpy(er.d_rows[e_rank] + 1, &one, 4, cudaMemcpyHostToDevice));
      }
      mokEpPush_t p;
      memset(&p, 0, sizeof p);
      p.num_ranks = N, p.t_max = Tmax, p.topk = k, p.hidden = H, p.max_rows = er.cap;
      p.row_route = er.d_rr[e_rank], p.rows = er.d_rows[e_rank], p.flag = er.d_rows[e_rank] + 1, p.y = er.d_y[e_rank];
      for (int s = 0; s < N; s++) p.dst[s] = d_comb[s];
      CHECK_OK(mok_ep_push_launch(&p, 0));
      if (pass == 0) {
        CUDA_CHECK(cudaDeviceSynchronize());
        const int32_t zero = 0;
        CUDA_CHECK(cudaMemcpy(er.d_rows[e_rank] + 1, &zero, 4, cudaMemcpyHostToDevice));
      }
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int s = 0; s < N && !t->failed; s++) {
      const int64_t R = (int64_t)T[s] * k;
      mokBf16 *comb = (mokBf16 *)malloc(2 * ((size_t)R + 1) * H);
      CUDA_CHECK(cudaMemcpy(comb, d_comb[s], 2 * ((size_t)R + 1) * H, cudaMemcpyDeviceToHost));
      for (int64_t q = 0; q < R && !t->failed; q++) {
        const mokBf16 *slot = comb + q * H;
        if (pass == 0 || idx[s][q] < 0) {
          CHECK_MSG(slot[0] == 0x7f7f && slot[H - 1] == 0x7f7f, "N %d pass %d source %d slot %lld written", N, pass, s,
                    (long long)q);
          continue;
        }
        const int e_rank = idx[s][q] / El;
        const int32_t id = (int32_t)(((int64_t)s * Tmax + q / k) * k + q % k);
        const int64_t row = ep_row_of(&er, e_rank, id);
        CHECK_MSG(row >= 0, "N %d: route %d on no row of rank %d", N, id, e_rank);
        if (row >= 0)
          CHECK_MSG(!memcmp(slot, er.y[e_rank] + row * H, 2 * (size_t)H), "N %d El %d k %d H %d: source %d slot %lld "
                    "differs from rank %d row %lld", N, El, k, H, s, (long long)q, e_rank, (long long)row);
      }
      free(comb);
    }
  }
  /* the slot map of source 0 */
  if (!t->failed && T[0] > 0) {
    const int64_t R = (int64_t)T[0] * k;
    int32_t *d_idx = NULL, *d_slot = NULL, *slot = (int32_t *)malloc(4 * (size_t)R);
    CUDA_CHECK(cudaMalloc(&d_idx, 4 * (size_t)R));
    CUDA_CHECK(cudaMalloc(&d_slot, 4 * (size_t)R));
    CUDA_CHECK(cudaMemcpy(d_idx, idx[0], 4 * (size_t)R, cudaMemcpyHostToDevice));
    CHECK_OK(mok_ep_slots_launch(d_idx, R, d_slot, NULL, 0));
    CUDA_CHECK(cudaMemcpy(slot, d_slot, 4 * (size_t)R, cudaMemcpyDeviceToHost));
    for (int64_t q = 0; q < R && !t->failed; q++)
      CHECK_MSG(slot[q] == (idx[0][q] >= 0 ? q : -1), "slot %lld: %d", (long long)q, slot[q]);
    cudaFree(d_idx), cudaFree(d_slot), free(slot);
  }
  ep_ranks_free(&er, N);
  for (int s = 0; s < N; s++) {
    cudaFree(d_comb[s]);
    free(idx[s]), free(cnt[s]), free(off[s]), free(order[s]);
  }
}

MOK_GPU_TEST(ep_push_to_source_slots, 1) {
  rng_t r = {test_seed() ^ 0xe9a5};
  static const int Ns[] = {1, 2, 5, 8};
  for (int i = 0; i < 4 && !t->failed; i++) {
    const int k = 1 + rng_int(&r, 6);
    push_case(t, &r, Ns[i], (k + Ns[i] - 1) / Ns[i] + rng_int(&r, 6), k, 1 + rng_int(&r, 90), 8 * (1 + rng_int(&r, 40)),
              64, 0);
  }
  push_case(t, &r, 4, 3, 2, 50, 64, 128, 1); /* every route on one expert */
  /* arguments refused, nothing launched */
  mokEpPush_t p;
  memset(&p, 0, sizeof p);
  p.num_ranks = 2, p.t_max = 1, p.topk = 1, p.hidden = 12, p.max_rows = 1;
  CHECK_STATUS(mok_ep_push_launch(&p, 0), mokInvalidArgument);
  p.hidden = 16;
  CHECK_STATUS(mok_ep_push_launch(&p, 0), mokInvalidArgument); /* NULL pointers */
  CHECK_STATUS(mok_ep_slots_launch(NULL, 4, NULL, NULL, 0), mokInvalidArgument);
}

static void pull_case(test_ctx *t, rng_t *r, int N, int El, int k, int Tmax, int H, int P) {
  const int E = N * El;
  int T[8];
  int32_t *idx[8] = {0}, *cnt[8] = {0}, *off[8] = {0}, *order[8] = {0};
  mokBf16 *dout[8] = {0}, *d_dout[8] = {0};
  float *w[8] = {0}, *d_w[8] = {0}, *d_dw[8] = {0};
  int32_t *d_idx[8] = {0}, *d_slot[8] = {0};
  for (int s = 0; s < N; s++) {
    T[s] = 1 + rng_int(r, Tmax);
    const int64_t R = (int64_t)T[s] * k;
    idx[s] = (int32_t *)malloc(4 * (size_t)R);
    for (int64_t q = 0; q < R; q++) idx[s][q] = rng_int(r, 5) == 0 ? -1 : rng_int(r, E);
    cnt[s] = (int32_t *)malloc(4 * (size_t)E), off[s] = (int32_t *)malloc(4 * (size_t)(E + 1));
    order[s] = (int32_t *)malloc(4 * (size_t)R);
    CHECK(mok_sched_send(idx[s], T[s], k, E, cnt[s], off[s], order[s]) == -1);
    dout[s] = (mokBf16 *)malloc(2 * (size_t)T[s] * H);
    for (int64_t i = 0; i < (int64_t)T[s] * H; i++) dout[s][i] = mok_f32_to_bf16((float)rng_sym(r));
    w[s] = (float *)malloc(4 * (size_t)R);
    for (int64_t q = 0; q < R; q++) w[s][q] = (float)rng_unif(r);
    CUDA_CHECK(cudaMalloc(&d_dout[s], 2 * (size_t)T[s] * H));
    CUDA_CHECK(cudaMalloc(&d_w[s], 4 * (size_t)R));
    CUDA_CHECK(cudaMalloc(&d_dw[s], 4 * (size_t)R));
    CUDA_CHECK(cudaMalloc(&d_idx[s], 4 * (size_t)R));
    CUDA_CHECK(cudaMalloc(&d_slot[s], 4 * (size_t)R));
    CUDA_CHECK(cudaMemcpy(d_dout[s], dout[s], 2 * (size_t)T[s] * H, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_w[s], w[s], 4 * (size_t)R, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_idx[s], idx[s], 4 * (size_t)R, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_dw[s], 0xff, 4 * (size_t)R)); /* NaN: every slot must be written */
    CHECK_OK(mok_ep_slots_launch(d_idx[s], R, d_slot[s], d_dw[s], 0));
  }
  ep_ranks er;
  ep_ranks_setup(t, r, &er, N, El, k, Tmax, H, P, cnt, off, order, 0);
  const int64_t cap = er.cap;
  for (int e_rank = 0; e_rank < N && !t->failed; e_rank++) {
    mokEpPull_t p;
    memset(&p, 0, sizeof p);
    p.num_ranks = N, p.t_max = Tmax, p.topk = k, p.hidden = H, p.max_rows = cap;
    p.row_route = er.d_rr[e_rank], p.rows = er.d_rows[e_rank], p.flag = NULL, p.y = er.d_y[e_rank];
    for (int s = 0; s < N; s++) p.d_out[s] = d_dout[s], p.topk_w[s] = d_w[s], p.d_topk_w[s] = d_dw[s];
    CHECK_OK(mok_ep_dtopk_dy_launch(&p, 0));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  /* dY rows, bitwise */
  mokBf16 *got = (mokBf16 *)malloc(2 * (size_t)cap * H);
  for (int e_rank = 0; e_rank < N && !t->failed; e_rank++) {
    CUDA_CHECK(cudaMemcpy(got, er.d_y[e_rank], 2 * (size_t)cap * H, cudaMemcpyDeviceToHost));
    for (int64_t row = 0; row < cap && !t->failed; row++) {
      const int32_t id = row < er.used[e_rank] ? er.rr[e_rank][row] : -1;
      for (int h = 0; h < H && !t->failed; h++) {
        mokBf16 want = er.y[e_rank][row * H + h]; /* padding rows and rows past the segments: as they were */
        if (id >= 0) {
          const int s = id / k / Tmax, tt = id / k % Tmax, j = id % k;
          want = mok_f32_to_bf16(w[s][(int64_t)tt * k + j] * mok_bf16_to_f32(dout[s][(int64_t)tt * H + h]));
        }
        CHECK_MSG(got[row * H + h] == want, "N %d rank %d row %lld h %d: %04x, want %04x", N, e_rank, (long long)row, h,
                  got[row * H + h], want);
      }
    }
  }
  free(got);
  /* d_topk_w against float64 */
  for (int s = 0; s < N && !t->failed; s++) {
    const int64_t R = (int64_t)T[s] * k;
    float *dw = (float *)malloc(4 * (size_t)R);
    CUDA_CHECK(cudaMemcpy(dw, d_dw[s], 4 * (size_t)R, cudaMemcpyDeviceToHost));
    for (int64_t q = 0; q < R && !t->failed; q++) {
      if (idx[s][q] < 0) {
        CHECK_MSG(dw[q] == 0.f, "source %d dropped slot %lld: %g", s, (long long)q, dw[q]);
        continue;
      }
      const int e_rank = idx[s][q] / El;
      const int32_t id = (int32_t)(((int64_t)s * Tmax + q / k) * k + q % k);
      const int64_t row = ep_row_of(&er, e_rank, id);
      CHECK(row >= 0);
      if (row < 0) break;
      double want = 0, mag = 0;
      for (int h = 0; h < H; h++) {
        const double term = (double)mok_bf16_to_f32(dout[s][(q / k) * H + h]) * mok_bf16_to_f32(er.y[e_rank][row * H + h]);
        want += term, mag += term < 0 ? -term : term;
      }
      CHECK_MSG(dw[q] - want <= 1e-5 * mag + 1e-30 && want - dw[q] <= 1e-5 * mag + 1e-30,
                "source %d slot %lld: %.9g, want %.9g (terms %g)", s, (long long)q, dw[q], want, mag);
    }
    free(dw);
  }
  ep_ranks_free(&er, N);
  for (int s = 0; s < N; s++) {
    cudaFree(d_dout[s]), cudaFree(d_w[s]), cudaFree(d_dw[s]), cudaFree(d_idx[s]), cudaFree(d_slot[s]);
    free(idx[s]), free(cnt[s]), free(off[s]), free(order[s]), free(dout[s]), free(w[s]);
  }
}

MOK_GPU_TEST(ep_pull_dy_from_sources, 1) {
  rng_t r = {test_seed() ^ 0xd7};
  static const int Ns[] = {1, 3, 8};
  for (int i = 0; i < 3 && !t->failed; i++) {
    const int k = 1 + rng_int(&r, 6);
    pull_case(t, &r, Ns[i], (k + Ns[i] - 1) / Ns[i] + rng_int(&r, 5), k, 1 + rng_int(&r, 60), 1 + rng_int(&r, 300), 64);
  }
}

/* ---- the forward megakernel reading its rows from every source (mokFfnMega_t.row_route) ----
 * N sources' x (plain buffers of this GPU, as the sources' windows would be), expert rank
 * q's schedule composed on the host; the megakernel on a share of the SMs gathers every
 * row from its source (xg bitwise the host's gather, padding rows zero), and its act, gu
 * and y are bitwise mok_gemm_ffn_fwd's on the host-gathered rows (that call is checked
 * against float64 in test_gemm.cu). Then with the push on (mokFfnMega_t.push): every y
 * row lands in its source's slot t k + j, which lie push_off bytes after the source's x
 * (one allocation a source, as a window holds both), bitwise the launch's y; the slots
 * of routes to other ranks, or dropped, keep what they held. */
static void mega_src_case(test_ctx *t, rng_t *r, int N, int El, int k, int Tmax, int ctas, int comm_ctas, int hot) {
  const int H = 256, I = 128, P = MOK_GEMM_ROW_PAD, E = N * El, q = rng_int(r, N);
  const int64_t xrows = (int64_t)Tmax + 1, xslots = xrows + (int64_t)Tmax * k; /* a source's rows, then its slots */
  int T[8];
  int32_t *idx[8] = {0}, *cnt[8] = {0}, *off[8] = {0}, *order[8] = {0};
  mokBf16 *x[8] = {0}, *d_x[8] = {0};
  for (int s = 0; s < N; s++) {
    T[s] = s == 1 ? 0 : rng_int(r, Tmax + 1); /* (source 1 sends nothing) */
    const int64_t R = (int64_t)T[s] * k;
    idx[s] = (int32_t *)malloc(4 * ((size_t)R + 1));
    for (int64_t i = 0; i < R; i++)
      idx[s][i] = hot ? q * El + El / 2 : rng_int(r, 6) == 0 ? -1 : rng_int(r, 3) ? q * El + rng_int(r, El) : rng_int(r, E);
    if (!hot && El > 2)
      for (int64_t i = 0; i < R; i++)
        if (idx[s][i] == q * El + 1) idx[s][i] = -1; /* (expert 1 of rank q stays empty) */
    cnt[s] = (int32_t *)malloc(4 * (size_t)E), off[s] = (int32_t *)malloc(4 * (size_t)(E + 1));
    order[s] = (int32_t *)malloc(4 * ((size_t)R + 1));
    CHECK(mok_sched_send(idx[s], T[s], k, E, cnt[s], off[s], order[s]) == -1);
    x[s] = (mokBf16 *)malloc(2 * ((size_t)T[s] + 1) * H);
    for (int64_t i = 0; i < ((int64_t)T[s] + 1) * H; i++) x[s][i] = mok_f32_to_bf16((float)rng_sym(r));
    CUDA_CHECK(cudaMalloc(&d_x[s], 2 * (size_t)xslots * H)); /* [x: Tmax + 1 rows | slots: Tmax k rows] */
    CUDA_CHECK(cudaMemcpy(d_x[s], x[s], 2 * ((size_t)T[s] + 1) * H, cudaMemcpyHostToDevice));
  }
  const int64_t cap = ((int64_t)N * Tmax * k + (int64_t)El * (P - 1) + P) / P * P;
  int32_t *ec = (int32_t *)malloc(4 * (size_t)El), *eo = (int32_t *)malloc(4 * (size_t)(El + 1));
  int32_t *rr = (int32_t *)malloc(4 * (size_t)cap);
  const int64_t used = mok_sched_compose(N, El, q, P, Tmax, k, (const int32_t *const *)cnt, (const int32_t *const *)off,
                                         (const int32_t *const *)order, ec, eo, NULL, rr, cap);
  CHECK(used >= 0);
  /* the rows as gathered on the host */
  mokBf16 *xg = (mokBf16 *)calloc((size_t)cap * H, 2);
  for (int64_t i = 0; i < used; i++)
    if (rr[i] >= 0) {
      const int s = rr[i] / k / Tmax, tt = rr[i] / k % Tmax;
      memcpy(xg + i * H, x[s] + (int64_t)tt * H, 2 * (size_t)H);
    }
  const size_t wn = (size_t)El * I * H;
  mokBf16 *w = (mokBf16 *)malloc(2 * 3 * wn);
  for (size_t i = 0; i < 3 * wn; i++) w[i] = mok_f32_to_bf16((float)(0.1 * rng_sym(r)));
  mokBf16 *d_w = NULL, *d_xg = NULL, *d_xg2 = NULL, *d_out[6] = {0};
  int32_t *d_seg = NULL, *d_rr = NULL, *d_bad = NULL;
  const mokBf16 **d_src = NULL;
  CUDA_CHECK(cudaMalloc(&d_w, 2 * 3 * wn));
  CUDA_CHECK(cudaMemcpy(d_w, w, 2 * 3 * wn, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&d_xg, 2 * (size_t)cap * H));
  CUDA_CHECK(cudaMemset(d_xg, 0x7f, 2 * (size_t)cap * H)); /* poison: every row in use must be written */
  CUDA_CHECK(cudaMalloc(&d_xg2, 2 * (size_t)cap * H));
  CUDA_CHECK(cudaMemcpy(d_xg2, xg, 2 * (size_t)cap * H, cudaMemcpyHostToDevice));
  const size_t osz[3] = {2 * (size_t)cap * I, 4 * (size_t)cap * I, 2 * (size_t)cap * H}; /* act, gu, y */
  for (int i = 0; i < 6; i++) {
    CUDA_CHECK(cudaMalloc(&d_out[i], osz[i % 3]));
    CUDA_CHECK(cudaMemset(d_out[i], 0, osz[i % 3]));
  }
  CUDA_CHECK(cudaMalloc(&d_seg, 4 * (size_t)(2 * El + 1)));
  CUDA_CHECK(cudaMemcpy(d_seg, ec, 4 * (size_t)El, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_seg + El, eo, 4 * (size_t)(El + 1), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&d_rr, 4 * (size_t)cap));
  CUDA_CHECK(cudaMemcpy(d_rr, rr, 4 * (size_t)cap, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&d_bad, 4));
  CUDA_CHECK(cudaMemset(d_bad, 0, 4));
  CUDA_CHECK(cudaMalloc(&d_src, sizeof(void *) * (size_t)N));
  CUDA_CHECK(cudaMemcpy(d_src, d_x, sizeof(void *) * (size_t)N, cudaMemcpyHostToDevice));
  if (t->failed) goto done;
  {
    mokGemmRows_t rows;
    memset(&rows, 0, sizeof rows);
    rows.num_experts = El, rows.capacity = cap, rows.expert_offset = d_seg + El, rows.expert_count = d_seg;
    mokFfnMega_t m;
    memset(&m, 0, sizeof m);
    m.row_route = d_rr, m.x_src = d_src, m.num_src = N, m.t_max = Tmax, m.topk = k;
    m.bad = d_bad, m.comm_ctas = comm_ctas, m.ctas = ctas;
    const mokBf16 *wg = d_w, *wu = d_w + wn, *wd = d_w + 2 * wn;
    CHECK_OK(mok_gemm_ffn_mega(&rows, H, I, 0.f, d_xg, wg, wu, wd, d_out[0], d_out[1], d_out[2], &m, 0));
    CHECK_OK(mok_gemm_ffn_fwd(&rows, H, I, 0.f, d_xg2, wg, wu, wd, d_out[3], d_out[4], d_out[5], 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    if (t->failed) goto done;
    mokBf16 *got = (mokBf16 *)malloc(2 * (size_t)cap * H), *want = (mokBf16 *)malloc(4 * (size_t)cap * I);
    CUDA_CHECK(cudaMemcpy(got, d_xg, 2 * (size_t)used * H, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < used * H && !t->failed; i++)
      CHECK_MSG(got[i] == xg[i], "N %d rank %d: xg row %lld col %lld: %04x, want %04x (route %d)", N, q,
                (long long)(i / H), (long long)(i % H), got[i], xg[i], rr[i / H]);
    static const char *name[3] = {"act", "gu", "y"};
    const size_t per[3] = {2 * (size_t)I, 4 * (size_t)I, 2 * (size_t)H};
    for (int o = 0; o < 3 && !t->failed; o++) {
      CUDA_CHECK(cudaMemcpy(got, d_out[o], per[o] * (size_t)used, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(want, d_out[o + 3], per[o] * (size_t)used, cudaMemcpyDeviceToHost));
      CHECK_MSG(!memcmp(got, want, per[o] * (size_t)used), "N %d El %d k %d ctas %d: %s differs from "
                "mok_gemm_ffn_fwd's on the gathered rows", N, El, k, ctas, name[o]);
    }
    /* the push: each source's slots poisoned, then filled by the launch where this rank's rows go */
    mokBf16 *y = (mokBf16 *)malloc(2 * ((size_t)used + 1) * H), *slot = (mokBf16 *)malloc(2 * (size_t)Tmax * k * H + 2);
    CUDA_CHECK(cudaMemcpy(y, d_out[2], 2 * (size_t)used * H, cudaMemcpyDeviceToHost));
    for (int s = 0; s < N; s++) CUDA_CHECK(cudaMemset(d_x[s] + xrows * H, 0xff, 2 * (size_t)Tmax * k * H));
    m.push = 1, m.push_off = 2 * (long long)xrows * H;
    CHECK_OK(mok_gemm_ffn_mega(&rows, H, I, 0.f, d_xg, wg, wu, wd, d_out[0], d_out[1], d_out[2], &m, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    int64_t pushed = 0, routed = 0;
    for (int s = 0; s < N && !t->failed; s++) {
      CUDA_CHECK(cudaMemcpy(slot, d_x[s] + xrows * H, 2 * (size_t)Tmax * k * H, cudaMemcpyDeviceToHost));
      int64_t *from = (int64_t *)malloc(8 * ((size_t)Tmax * k + 1)); /* the row each slot should hold, -1: none */
      for (int64_t i = 0; i < (int64_t)Tmax * k; i++) from[i] = -1;
      for (int64_t i = 0; i < used; i++)
        if (rr[i] >= 0 && rr[i] / k / Tmax == s) from[(int64_t)(rr[i] / k % Tmax) * k + rr[i] % k] = i;
      for (int64_t sl = 0; sl < (int64_t)Tmax * k && !t->failed; sl++) {
        const mokBf16 *g = slot + sl * H;
        if (from[sl] >= 0) {
          routed++;
          pushed += !memcmp(g, y + from[sl] * H, 2 * (size_t)H);
          CHECK_MSG(!memcmp(g, y + from[sl] * H, 2 * (size_t)H), "N %d rank %d: source %d slot %lld: not row %lld's y",
                    N, q, s, (long long)sl, (long long)from[sl]);
        } else {
          int untouched = 1;
          for (int h = 0; h < H; h++) untouched &= g[h] == 0xffff;
          CHECK_MSG(untouched, "N %d rank %d: source %d slot %lld: written, but no row of this rank is its route", N, q,
                    s, (long long)sl);
        }
      }
      free(from);
    }
    CHECK_MSG(pushed == routed, "N %d: %lld of %lld routed rows pushed", N, (long long)pushed, (long long)routed);
    free(y), free(slot);
    m.push = 0, m.push_off = 0;
    free(got), free(want);
    /* refused before anything runs */
    m.push = 1, m.out = d_out[3], m.tokens = 1; /* (the push is expert parallel, the combine in the launch one GPU) */
    CHECK_STATUS(mok_gemm_ffn_mega(&rows, H, I, 0.f, d_xg, wg, wu, wd, d_out[0], d_out[1], d_out[2], &m, 0),
                 mokInvalidArgument);
    m.push = 0, m.out = NULL, m.tokens = 0;
    m.num_src = 0;
    CHECK_STATUS(mok_gemm_ffn_mega(&rows, H, I, 0.f, d_xg, wg, wu, wd, d_out[0], d_out[1], d_out[2], &m, 0),
                 mokInvalidArgument);
    m.num_src = N, m.ctas = 100000;
    CHECK_STATUS(mok_gemm_ffn_mega(&rows, H, I, 0.f, d_xg, wg, wu, wd, d_out[0], d_out[1], d_out[2], &m, 0),
                 mokInvalidArgument);
  }
done:
  cudaFree(d_w), cudaFree(d_xg), cudaFree(d_xg2), cudaFree(d_seg), cudaFree(d_rr), cudaFree(d_bad), cudaFree(d_src);
  for (int i = 0; i < 6; i++) cudaFree(d_out[i]);
  free(ec), free(eo), free(rr), free(xg), free(w);
  for (int s = 0; s < N; s++) cudaFree(d_x[s]), free(x[s]), free(idx[s]), free(cnt[s]), free(off[s]), free(order[s]);
}

MOK_GPU_TEST(ep_mega_dispatch_from_sources, 1) {
  rng_t r = {test_seed() ^ 0x3e6a};
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  mega_src_case(t, &r, 2, 4, 2, 1 + rng_int(&r, 300), 0, 8, 0);                    /* every SM */
  mega_src_case(t, &r, 4, 6, 4, 1 + rng_int(&r, 200), sms / 4, 2, 0);              /* a loopback rank's share */
  mega_src_case(t, &r, 8, 3, 8, 1 + rng_int(&r, 100), sms / 8, 1, 0);
  mega_src_case(t, &r, 3, 5, 2, 150 + rng_int(&r, 100), sms / 2, 4, 1);            /* one hot expert */
}
