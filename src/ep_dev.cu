/*
 * ep_dev.cu — the expert-parallel data movement of stage A (ep_dev.h): the y rows' push
 * to their sources' combine slots, the slot map, and the backward's d_out pull with
 * d_topk_w pushed back. Plain copies through pointers; the
 * ordering against the peers (a cross-rank barrier before the sources read their slots)
 * is the caller's.
 */
#include <cuda_runtime.h>

#include "comm.h"           /* defines: MOK_ERRWORD, MOK_DEVERR_INPUT, MOK_WAIT_EP_REFUSED */
#include "ep_dev.h"
#include "internal.h"       /* defines: mok_error, CUDA_CHECK */
#include "route_rows.cuh"   /* defines: mok_dtopk_dy_row */
#include "schedule.h"       /* defines: mok_route_decode */
#include "kernels_load.h"

namespace {

__global__ void k_ep_push(mokEpPush_t p) {
  if (p.flag && *(const volatile int32_t *)p.flag) return;
  const int64_t rows = *p.rows, warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31, row_u4 = p.hidden / 8;
  for (int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
    const int32_t id = p.row_route[row];
    if (id < 0) continue;
    int s, t, j;
    mok_route_decode(id, p.t_max, p.topk, &s, &t, &j);
    const uint4 *src = reinterpret_cast<const uint4 *>(p.y) + row * row_u4;
    uint4 *dst = reinterpret_cast<uint4 *>(p.dst[s]) + ((int64_t)t * p.topk + j) * row_u4;
    for (int u = lane; u < row_u4; u += 32) dst[u] = src[u];
  }
}

__global__ void k_ep_slots(const int32_t *topk_idx, int64_t routes, int32_t *slot, float *zero_dw) {
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < routes; q += (int64_t)gridDim.x * blockDim.x) {
    const bool routed = topk_idx[q] >= 0;
    slot[q] = routed ? (int32_t)q : -1;
    if (zero_dw && !routed) zero_dw[q] = 0.f;
  }
}

__global__ void k_ep_dtopk_dy(mokEpPull_t p) {
  if (p.flag && *(const volatile int32_t *)p.flag) return;
  const int64_t rows = *p.rows, warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31, H = p.hidden;
  for (int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
    const int32_t id = p.row_route[row];
    if (id < 0) continue;
    int s, t, j;
    mok_route_decode(id, p.t_max, p.topk, &s, &t, &j);
    const int64_t q = (int64_t)t * p.topk + j;
    const float sum = mok_dtopk_dy_row(p.d_out[s] + (int64_t)t * H, p.y + row * H, p.topk_w[s][q], H, lane);
    if (lane == 0) p.d_topk_w[s][q] = sum;
  }
}

unsigned grid_of(int64_t items, int per_cta) {
  const int64_t b = (items + per_cta - 1) / per_cta;
  return (unsigned)(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

__global__ void k_ep_any_bad(mokEpFlags_t f) {
  if (f.comm_error && *(const volatile unsigned long long *)f.comm_error) {
    *f.flag = 1;
    return;
  }
  for (int q = 0; q < f.num_ranks; ++q)
    if (*(const volatile int32_t *)f.bad[q]) {
      *f.flag = 1;
      if (f.error_word) atomicCAS(f.error_word, 0ull, MOK_ERRWORD(MOK_DEVERR_INPUT, MOK_WAIT_EP_REFUSED, f.rank, q));
      return;
    }
}

__global__ void k_ep_copy_f32(const float *src, float *dst, int64_t n, const int32_t *flag) {
  if (*(const volatile int32_t *)flag) return;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

} /* namespace */

extern "C" mokResult_t mok_ep_any_bad_launch(const mokEpFlags_t *f, cudaStream_t stream) {
  static const char fn[] = "mok_ep_any_bad_launch";
  if (!f || f->num_ranks < 1 || f->num_ranks > MOK_SCHEDULE_EP_MAX_RANKS || !f->flag)
    return mok_error(NULL, mokInvalidArgument, "%s: no flags, or ranks outside 1..%d, or flag NULL", fn,
                     MOK_SCHEDULE_EP_MAX_RANKS);
  for (int q = 0; q < f->num_ranks; ++q)
    if (!f->bad[q]) return mok_error(NULL, mokInvalidArgument, "%s: bad[%d] is NULL", fn, q);
  k_ep_any_bad<<<1, 1, 0, stream>>>(*f);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

extern "C" mokResult_t mok_ep_copy_f32_launch(const float *src, float *dst, int64_t n, const int32_t *flag,
                                              cudaStream_t stream) {
  static const char fn[] = "mok_ep_copy_f32_launch";
  if (n < 0 || (n && (!src || !dst || !flag)))
    return mok_error(NULL, mokInvalidArgument, "%s: n %lld, src %p, dst %p, flag %p", fn, (long long)n,
                     (const void *)src, (void *)dst, (const void *)flag);
  if (!n) return mokSuccess;
  k_ep_copy_f32<<<grid_of(n, 256), 256, 0, stream>>>(src, dst, n, flag);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

extern "C" mokResult_t mok_ep_push_launch(const mokEpPush_t *p, cudaStream_t stream) {
  static const char fn[] = "mok_ep_push_launch";
  if (!p) return mok_error(NULL, mokInvalidArgument, "%s: p is NULL", fn);
  if (p->num_ranks < 1 || p->num_ranks > MOK_SCHEDULE_EP_MAX_RANKS || p->t_max < 1 || p->topk < 1 ||
      p->hidden < 8 || p->hidden % 8 || p->max_rows < 0)
    return mok_error(NULL, mokInvalidArgument, "%s: ranks %d (1..%d), t_max %d, topk %d, hidden %d (a multiple of 8), "
                     "max_rows %lld", fn, p->num_ranks, MOK_SCHEDULE_EP_MAX_RANKS, p->t_max, p->topk, p->hidden,
                     (long long)p->max_rows);
  if (!p->row_route || !p->rows || !p->y)
    return mok_error(NULL, mokInvalidArgument, "%s: row_route, rows or y is NULL", fn);
  for (int s = 0; s < p->num_ranks; ++s)
    if (!p->dst[s]) return mok_error(NULL, mokInvalidArgument, "%s: dst[%d] is NULL", fn, s);
  if (!p->max_rows) return mokSuccess;
  k_ep_push<<<grid_of(p->max_rows, 8), 256, 0, stream>>>(*p);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

extern "C" mokResult_t mok_ep_slots_launch(const int32_t *topk_idx, int64_t routes, int32_t *slot, float *zero_dw,
                                           cudaStream_t stream) {
  static const char fn[] = "mok_ep_slots_launch";
  if (routes < 0 || (routes && (!topk_idx || !slot)))
    return mok_error(NULL, mokInvalidArgument, "%s: routes %lld, topk_idx %p, slot %p", fn, (long long)routes,
                     (const void *)topk_idx, (void *)slot);
  if (!routes) return mokSuccess;
  k_ep_slots<<<grid_of(routes, 256), 256, 0, stream>>>(topk_idx, routes, slot, zero_dw);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

extern "C" mokResult_t mok_ep_dtopk_dy_launch(const mokEpPull_t *p, cudaStream_t stream) {
  static const char fn[] = "mok_ep_dtopk_dy_launch";
  if (!p) return mok_error(NULL, mokInvalidArgument, "%s: p is NULL", fn);
  if (p->num_ranks < 1 || p->num_ranks > MOK_SCHEDULE_EP_MAX_RANKS || p->t_max < 1 || p->topk < 1 || p->hidden < 1 ||
      p->max_rows < 0)
    return mok_error(NULL, mokInvalidArgument, "%s: ranks %d (1..%d), t_max %d, topk %d, hidden %d, max_rows %lld", fn,
                     p->num_ranks, MOK_SCHEDULE_EP_MAX_RANKS, p->t_max, p->topk, p->hidden, (long long)p->max_rows);
  if (!p->row_route || !p->rows || !p->y) return mok_error(NULL, mokInvalidArgument, "%s: row_route, rows or y is NULL", fn);
  for (int s = 0; s < p->num_ranks; ++s)
    if (!p->d_out[s] || !p->topk_w[s] || !p->d_topk_w[s])
      return mok_error(NULL, mokInvalidArgument, "%s: source %d's d_out, topk_w or d_topk_w is NULL", fn, s);
  if (!p->max_rows) return mokSuccess;
  k_ep_dtopk_dy<<<grid_of(p->max_rows, 8), 256, 0, stream>>>(*p);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
extern "C" mokKernelAnchor mok_anchor_ep_dev(void) {
  mokKernelAnchor a = {"src/ep_dev.cu", (const void *)k_ep_slots, {NULL}};
  return a;
}
