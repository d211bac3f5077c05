/*
 * test_ep_gpu.cu — the expert-parallel data movement of stage A (src/ep_dev.h) with N ranks
 * simulated on one GPU: every rank's schedule composed on the host (schedule_ep.h, checked
 * against mokReferenceSchedule in test_schedule.c), random y rows on every expert rank,
 * each rank's push into every source's combine buffer; then every routed slot (t, j) of
 * every source holds exactly the y row of the row that carries route (s, t, j), every
 * dropped route's slot is untouched, and the slot map is q or -1. A set flag moves nothing.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "ep_dev.h"
#include "mok.h"
#include "schedule_ep.h"
#include "test.h"
#include "util.h"

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    CHECK_MSG(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));             \
  } while (0)

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
  const int64_t cap = (int64_t)N * Tmax * k + (int64_t)El * (P - 1) + P;
  /* every source's combine buffer, poisoned */
  mokBf16 *d_comb[8] = {0};
  for (int s = 0; s < N; s++) {
    CUDA_CHECK(cudaMalloc(&d_comb[s], 2 * ((size_t)T[s] * k + 1) * H));
    CUDA_CHECK(cudaMemset(d_comb[s], 0x7f, 2 * ((size_t)T[s] * k + 1) * H));
  }
  int32_t *rr[8] = {0}, *d_rr[8] = {0}, *d_rows[8] = {0};
  mokBf16 *y[8] = {0}, *d_y[8] = {0};
  int64_t used[8] = {0};
  for (int e_rank = 0; e_rank < N && !t->failed; e_rank++) {
    int32_t *ec = (int32_t *)malloc(4 * (size_t)El), *eo = (int32_t *)malloc(4 * (size_t)(El + 1));
    rr[e_rank] = (int32_t *)malloc(4 * (size_t)cap);
    used[e_rank] = mok_sched_compose(N, El, e_rank, P, Tmax, k, (const int32_t *const *)cnt, (const int32_t *const *)off,
                                     (const int32_t *const *)order, ec, eo, NULL, rr[e_rank], cap);
    CHECK(used[e_rank] >= 0);
    y[e_rank] = (mokBf16 *)malloc(2 * (size_t)cap * H);
    for (int64_t i = 0; i < cap * H; i++) y[e_rank][i] = (mokBf16)(rng_next(r) & 0x7f7f); /* never the poison */
    CUDA_CHECK(cudaMalloc(&d_y[e_rank], 2 * (size_t)cap * H));
    CUDA_CHECK(cudaMalloc(&d_rr[e_rank], 4 * (size_t)cap));
    CUDA_CHECK(cudaMalloc(&d_rows[e_rank], 8));
    CUDA_CHECK(cudaMemcpy(d_y[e_rank], y[e_rank], 2 * (size_t)cap * H, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_rr[e_rank], rr[e_rank], 4 * (size_t)cap, cudaMemcpyHostToDevice));
    int32_t rows_flag[2] = {(int32_t)used[e_rank], 0};
    CUDA_CHECK(cudaMemcpy(d_rows[e_rank], rows_flag, 8, cudaMemcpyHostToDevice));
    free(ec), free(eo);
  }
  /* a set flag first: nothing moves */
  for (int pass = 0; pass < 2 && !t->failed; pass++) {
    for (int e_rank = 0; e_rank < N && !t->failed; e_rank++) {
      if (pass == 0) {
        const int32_t one = 1;
        CUDA_CHECK(cudaMemcpy(d_rows[e_rank] + 1, &one, 4, cudaMemcpyHostToDevice));
      }
      mokEpPush_t p;
      memset(&p, 0, sizeof p);
      p.num_ranks = N, p.t_max = Tmax, p.topk = k, p.hidden = H, p.max_rows = cap;
      p.row_route = d_rr[e_rank], p.rows = d_rows[e_rank], p.flag = d_rows[e_rank] + 1, p.y = d_y[e_rank];
      for (int s = 0; s < N; s++) p.dst[s] = d_comb[s];
      CHECK_OK(mok_ep_push_launch(&p, 0));
      if (pass == 0) {
        CUDA_CHECK(cudaDeviceSynchronize());
        const int32_t zero = 0;
        CUDA_CHECK(cudaMemcpy(d_rows[e_rank] + 1, &zero, 4, cudaMemcpyHostToDevice));
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
        int64_t row = -1;
        for (int64_t i = 0; i < used[e_rank] && row < 0; i++) row = rr[e_rank][i] == id ? i : -1;
        CHECK_MSG(row >= 0, "N %d: route %d on no row of rank %d", N, id, e_rank);
        if (row >= 0)
          CHECK_MSG(!memcmp(slot, y[e_rank] + row * H, 2 * (size_t)H), "N %d El %d k %d H %d: source %d slot %lld "
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
    CHECK_OK(mok_ep_slots_launch(d_idx, R, d_slot, 0));
    CUDA_CHECK(cudaMemcpy(slot, d_slot, 4 * (size_t)R, cudaMemcpyDeviceToHost));
    for (int64_t q = 0; q < R && !t->failed; q++)
      CHECK_MSG(slot[q] == (idx[0][q] >= 0 ? q : -1), "slot %lld: %d", (long long)q, slot[q]);
    cudaFree(d_idx), cudaFree(d_slot), free(slot);
  }
  for (int s = 0; s < N; s++) {
    cudaFree(d_comb[s]), cudaFree(d_y[s]), cudaFree(d_rr[s]), cudaFree(d_rows[s]);
    free(idx[s]), free(cnt[s]), free(off[s]), free(order[s]), free(rr[s]), free(y[s]);
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
  CHECK_STATUS(mok_ep_slots_launch(NULL, 4, NULL, 0), mokInvalidArgument);
}
