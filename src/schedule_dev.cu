/*
 * schedule_dev.cu — the schedule of one rank's own routes on the device (EP1: the rank
 * owns every expert), so that a forward needs no host wait: expert counts, padded
 * segment offsets, and for every route and row where it goes, bitwise the layout of
 * mokReferenceSchedule (include/mok.h: an expert's routes ordered by (t, j), segments
 * padded with rows of -1 to a multiple of P, in expert order).
 *
 * Three launches on the stream (no host wait), over contiguous slices of the routes (a CTA
 * ~2048 routes, at most 128 CTAs; in a CTA a slice a warp):
 *  1. k_sched_count: each warp counts, per expert, its slice's routes (warp-synchronous:
 *     __match_any_sync groups the lanes of one expert, the group's lowest lane adds the
 *     group's size to the warp's column in shared memory); a CTA's sums go to scratch;
 *  2. k_sched_scan (one CTA): per expert an exclusive scan over the CTAs (their bases),
 *     then scans over the experts: the cursors (send order) and the padded offsets;
 *  3. k_sched_rank: each CTA counts its slice again, gives each warp its base (the CTA's
 *     + the warps' before it), and each warp walks its slice: a route's rank in its expert
 *     = its warp's base + the lanes of its group below it (+ its groups before).
 * (Session 27's one-CTA version took 0.30-0.33 ms at 65-82k routes: latency of one
 * warp's 80 dependent load rounds.)
 * An id outside [-1, E) sets *bad and records MOK_ERRWORD(INPUT, MOK_WAIT_SCHED_INPUT,
 * rank, route) in the error word; nothing else is written then (the megakernel reads
 * *bad and writes nothing either).
 */
#include <cuda_runtime.h>

#include "comm.h"     /* defines: MOK_ERRWORD, MOK_DEVERR_INPUT, MOK_WAIT_SCHED_INPUT */
#include "internal.h" /* defines: mok_error, CUDA_CHECK */
#include "schedule.h"     /* defines: mok_segment_rows, mok_sched_row_source, mok_route_id */
#include "schedule_dev.h"
#include "kernels_load.h"

namespace {

constexpr int kWarps = 32;

/* The routes of CTA b (of gridDim.x) and, within it, of warp w: whole groups of 32. */
struct Slice {
  int64_t q0, q1;
};
__device__ __forceinline__ Slice warp_slice(int64_t R, int warp) {
  const int64_t per_cta = ((R + gridDim.x - 1) / gridDim.x + 1023) / 1024 * 1024;
  const int64_t c0 = (int64_t)blockIdx.x * per_cta, c1 = c0 + per_cta < R ? c0 + per_cta : R;
  const int64_t per_warp = per_cta / kWarps;
  Slice s;
  s.q0 = c0 + warp * per_warp;
  s.q1 = s.q0 + per_warp < c1 ? s.q0 + per_warp : c1;
  return s;
}

/* Pass 1 of a CTA: wc[w][e] = routes of expert e in warp w's slice (smem, zeroed here);
 * a bad id's route index into *bad_route (atomicMax). Ends past a __syncthreads. */
__device__ __forceinline__ void count_slice(const mokLocalSchedule_t &s, int *wc, int *bad_route) {
  const int E = s.num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kWarps * E; i += blockDim.x) wc[i] = 0;
  __syncthreads();
  const Slice sl = warp_slice((int64_t)s.num_tokens * s.topk, warp);
  for (int64_t q = sl.q0; q < sl.q1; q += 32) {
    const int64_t my = q + lane;
    const int e = my < sl.q1 ? s.topk_idx[my] : -1;
    if (e < -1 || e >= E) atomicMax(bad_route, (int)my);
    const bool valid = e >= 0 && e < E;
    const unsigned grp = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid && lane == __ffs(grp) - 1) wc[warp * E + e] += __popc(grp);
    __syncwarp();
  }
  __syncthreads();
}

/* 1. per CTA and expert: its routes (scratch [gridDim.x][E]). */
__global__ void __launch_bounds__(kWarps * 32, 1) k_sched_count(mokLocalSchedule_t s, int32_t *cta_cnt,
                                                                int32_t *bad_route) {
  extern __shared__ int wc[];
  count_slice(s, wc, bad_route);
  const int E = s.num_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int n = 0;
    for (int w = 0; w < kWarps; ++w) n += wc[w * E + e];
    cta_cnt[(int64_t)blockIdx.x * E + e] = n;
  }
}

/* 2. one CTA: refuse a bad id, or per expert the CTAs' bases (an exclusive scan over the
 * CTAs, in place), its count, its cursor (send order) and padded offset. */
__global__ void __launch_bounds__(1024, 1) k_sched_scan(mokLocalSchedule_t s, int32_t *cta_cnt, int ctas,
                                                       int32_t *cursor, const int32_t *bad_route) {
  __shared__ int part[2][32]; /* per warp: counts, padded rows */
  const int E = s.num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (*bad_route >= 0) {
    if (threadIdx.x == 0) {
      *s.bad = 1;
      if (s.error_word)
        atomicCAS(s.error_word, 0ull, MOK_ERRWORD(MOK_DEVERR_INPUT, MOK_WAIT_SCHED_INPUT, s.rank, (uint32_t)*bad_route));
      __threadfence_system();
    }
    return;
  }
  /* one thread an expert (E <= 1024 = blockDim.x) */
  const int e = threadIdx.x;
  int n = 0;
  if (e < E)
    for (int b = 0; b < ctas; ++b) {
      const int c = cta_cnt[(int64_t)b * E + e];
      cta_cnt[(int64_t)b * E + e] = n;
      n += c;
    }
  const int padded = e < E ? (n + s.row_pad - 1) / s.row_pad * s.row_pad : 0;
  /* exclusive scans of n and padded over the experts: warp, then across warps */
  int cn = n, cp = padded;
  for (int o = 1; o < 32; o <<= 1) {
    const int an = __shfl_up_sync(0xffffffffu, cn, o), ap = __shfl_up_sync(0xffffffffu, cp, o);
    if (lane >= o) cn += an, cp += ap;
  }
  if (lane == 31) part[0][warp] = cn, part[1][warp] = cp;
  __syncthreads();
  if (warp == 0) {
    int pn = part[0][lane], pp = part[1][lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int an = __shfl_up_sync(0xffffffffu, pn, o), ap = __shfl_up_sync(0xffffffffu, pp, o);
      if (lane >= o) pn += an, pp += ap;
    }
    part[0][lane] = pn, part[1][lane] = pp; /* inclusive over warps */
  }
  __syncthreads();
  const int bn = (warp ? part[0][warp - 1] : 0) + cn - n, bp = (warp ? part[1][warp - 1] : 0) + cp - padded;
  if (e < E) {
    s.expert_count[e] = n;
    s.expert_offset[e] = bp;
    cursor[e] = bn;
  }
  if (e == E - 1) s.expert_offset[E] = bp + padded;
  if (e == 0) {
    *s.bad = 0;
    if (s.shared_seg) {
      const int T = s.num_tokens;
      s.shared_seg[0] = T, s.shared_seg[1] = 0, s.shared_seg[2] = (T + s.row_pad - 1) / s.row_pad * s.row_pad;
    }
  }
}

/* 3. per CTA: every route's rank in its expert, in (t, j) order (the CTA's base + its
 * warps' counts before it + the lanes of its group below it), then the padding rows of
 * experts b, b + gridDim.x, ... */
__global__ void __launch_bounds__(kWarps * 32, 1) k_sched_rank(mokLocalSchedule_t s, const int32_t *cta_base,
                                                               const int32_t *cursor) {
  extern __shared__ int wc[];
  __shared__ int unused_bad;
  if (*(const volatile int32_t *)s.bad) return;
  const int E = s.num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  count_slice(s, wc, &unused_bad);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int n = cta_base[(int64_t)blockIdx.x * E + e];
    for (int w = 0; w < kWarps; ++w) {
      const int c = wc[w * E + e];
      wc[w * E + e] = n;
      n += c;
    }
  }
  __syncthreads();
  const Slice sl = warp_slice((int64_t)s.num_tokens * s.topk, warp);
  for (int64_t q = sl.q0; q < sl.q1; q += 32) {
    const int64_t my = q + lane;
    const int e = my < sl.q1 ? s.topk_idx[my] : -1;
    const bool valid = e >= 0;
    const unsigned grp = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid) {
      const int rank = wc[warp * E + e] + __popc(grp & ((1u << lane) - 1u));
      const int row = s.expert_offset[e] + rank;
      s.send_pos[my] = cursor[e] + rank;
      s.route_row[my] = row;
      s.row_tok[row] = (int32_t)(my / s.topk);
      s.row_map[row] = cursor[e] + rank;
    } else if (my < sl.q1) {
      s.send_pos[my] = -1;
      s.route_row[my] = -1;
    }
    __syncwarp();
    if (valid && lane == __ffs(grp) - 1) wc[warp * E + e] += __popc(grp);
    __syncwarp();
  }
  for (int e = (int)blockIdx.x * kWarps + warp; e < E; e += (int)gridDim.x * kWarps)
    for (int r = s.expert_offset[e] + s.expert_count[e] + lane; r < s.expert_offset[e + 1]; r += 32)
      s.row_tok[r] = -1, s.row_map[r] = -1;
}

/* CTAs of the count and rank passes: about 2048 routes each, at most kMaxCtas. */
constexpr int kMaxCtas = 128;
int sched_ctas(int64_t routes) {
  const int64_t c = (routes + 2047) / 2048;
  return c < 1 ? 1 : c > kMaxCtas ? kMaxCtas : (int)c;
}

} /* namespace */

extern "C" int64_t mok_schedule_local_scratch(int num_experts) {
  return (int64_t)kMaxCtas * num_experts + num_experts + 1;
}

extern "C" mokResult_t mok_schedule_local_launch(const mokLocalSchedule_t *s, cudaStream_t stream) {
  static const char fn[] = "mok_schedule_local_launch";
  if (!s) return mok_error(NULL, mokInvalidArgument, "%s: s is NULL", fn);
  if (s->num_experts < 1 || s->num_experts > MOK_SCHEDULE_LOCAL_MAX_EXPERTS || s->num_tokens < 0 || s->topk < 1 ||
      s->row_pad < 1 || (int64_t)s->num_tokens * s->topk > (int64_t)1 << 30)
    return mok_error(NULL, mokInvalidArgument, "%s: experts %d (1..%d), tokens %d, topk %d, row_pad %d", fn,
                     s->num_experts, MOK_SCHEDULE_LOCAL_MAX_EXPERTS, s->num_tokens, s->topk, s->row_pad);
  if (!s->expert_count || !s->expert_offset || !s->row_tok || !s->row_map || !s->bad || !s->scratch ||
      (s->num_tokens && (!s->topk_idx || !s->send_pos || !s->route_row)))
    return mok_error(NULL, mokInvalidArgument, "%s: a device pointer is NULL", fn);
  const int E = s->num_experts, ctas = sched_ctas((int64_t)s->num_tokens * s->topk);
  int32_t *cta_cnt = s->scratch, *cursor = cta_cnt + (int64_t)kMaxCtas * E, *bad_route = cursor + E;
  const size_t smem = sizeof(int) * (size_t)kWarps * E;
  CUDA_CHECK(NULL, cudaFuncSetAttribute(k_sched_count, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  CUDA_CHECK(NULL, cudaFuncSetAttribute(k_sched_rank, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  CUDA_CHECK(NULL, cudaMemsetAsync(bad_route, 0xff, sizeof(int32_t), stream)); /* -1: no bad route */
  k_sched_count<<<ctas, kWarps * 32, smem, stream>>>(*s, cta_cnt, bad_route);
  k_sched_scan<<<1, 1024, 0, stream>>>(*s, cta_cnt, ctas, cursor, bad_route);
  k_sched_rank<<<ctas, kWarps * 32, smem, stream>>>(*s, cta_cnt, cursor);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

/* ---- expert parallel: the composed schedule (schedule_dev.h) ----------------------------- */
namespace {

__global__ void k_send_order(const int32_t *send_pos, int64_t routes, const int32_t *bad, int32_t *order) {
  if (bad && *(const volatile int32_t *)bad) return;
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < routes; q += (int64_t)gridDim.x * blockDim.x)
    if (send_pos[q] >= 0) order[send_pos[q]] = (int32_t)q;
}

/* 1. one CTA, a thread an expert (E_l <= 1024): the sources' counts of each local expert,
 * their sum, the padded offsets (a serial scan by thread 0: E_l <= 1024), the flag. */
__global__ void __launch_bounds__(1024, 1) k_ep_segments(mokEpSchedule_t s) {
  __shared__ int32_t seg[MOK_SCHEDULE_LOCAL_MAX_EXPERTS];
  __shared__ int refused;
  const int N = s.num_ranks, El = s.local_experts;
  if (threadIdx.x == 0) {
    refused = 0;
    for (int q = N - 1; q >= 0; --q)
      if (s.bad[q] && *(const volatile int32_t *)s.bad[q]) refused = q + 1;
    if (!refused && s.comm_error && *(const volatile unsigned long long *)s.comm_error) refused = -1;
  }
  __syncthreads();
  if (refused) {
    if (threadIdx.x == 0) {
      *s.flag = 1;
      if (s.error_word && refused > 0) /* (a comm error is the comm's to report) */
        atomicCAS(s.error_word, 0ull, MOK_ERRWORD(MOK_DEVERR_INPUT, MOK_WAIT_EP_REFUSED, s.rank, refused - 1));
    }
    return;
  }
  for (int e = threadIdx.x; e < El; e += blockDim.x) {
    const int eg = s.rank * El + e;
    int32_t n = 0;
    for (int q = 0; q < N; ++q) {
      const int32_t c = s.count[q][eg];
      s.src_count[q * El + e] = c;
      n += c;
    }
    s.expert_count[e] = n;
    seg[e] = mok_segment_rows(n, s.row_pad);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t rows = 0;
    for (int e = 0; e < El; ++e) {
      s.expert_offset[e] = (int32_t)rows;
      rows += seg[e];
    }
    s.expert_offset[El] = (int32_t)rows;
    *s.flag = rows > s.capacity ? 2 : 0;
    if (rows > s.capacity && s.error_word)
      atomicCAS(s.error_word, 0ull, MOK_ERRWORD(MOK_DEVERR_INPUT, MOK_WAIT_EP_CAPACITY, s.rank, (uint32_t)rows));
  }
}

/* 2. a thread a row: its expert (binary search over the offsets), its source and index
 * (mok_sched_row_source over src_count), its route from the source's send order. */
__global__ void k_ep_rows(mokEpSchedule_t s) {
  if (*(const volatile int32_t *)s.flag) return;
  const int N = s.num_ranks, El = s.local_experts;
  const int32_t rows = s.expert_offset[El];
  for (int64_t row = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; row < rows;
       row += (int64_t)gridDim.x * blockDim.x) {
    int lo = 0, hi = El - 1; /* the last e with expert_offset[e] <= row */
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s.expert_offset[mid] <= row) lo = mid;
      else hi = mid - 1;
    }
    int32_t i = 0;
    const int src = mok_sched_row_source(s.src_count + lo, El, N, (int32_t)(row - s.expert_offset[lo]), &i);
    if (src < 0) {
      s.row_route[row] = -1;
      continue;
    }
    const int32_t q = s.order[src][s.off[src][s.rank * El + lo] + i];
    s.row_route[row] = mok_route_id(src, q / s.topk, q % s.topk, s.t_max, s.topk);
  }
}

} /* namespace */

extern "C" mokResult_t mok_schedule_send_order_launch(const int32_t *send_pos, int64_t routes, const int32_t *bad,
                                                      int32_t *order, cudaStream_t stream) {
  static const char fn[] = "mok_schedule_send_order_launch";
  if (routes < 0 || (routes && (!send_pos || !order)))
    return mok_error(NULL, mokInvalidArgument, "%s: routes %lld, send_pos %p, order %p", fn, (long long)routes,
                     (const void *)send_pos, (void *)order);
  if (!routes) return mokSuccess;
  const int64_t blocks = (routes + 255) / 256;
  k_send_order<<<(unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, stream>>>(send_pos, routes, bad, order);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

extern "C" mokResult_t mok_schedule_ep_launch(const mokEpSchedule_t *s, cudaStream_t stream) {
  static const char fn[] = "mok_schedule_ep_launch";
  if (!s) return mok_error(NULL, mokInvalidArgument, "%s: s is NULL", fn);
  if (s->num_ranks < 1 || s->num_ranks > MOK_SCHEDULE_EP_MAX_RANKS || s->rank < 0 || s->rank >= s->num_ranks ||
      s->local_experts < 1 || s->local_experts > MOK_SCHEDULE_LOCAL_MAX_EXPERTS || s->row_pad < 1 || s->t_max < 1 ||
      s->topk < 1 || s->capacity < 0)
    return mok_error(NULL, mokInvalidArgument, "%s: ranks %d (1..%d), rank %d, local experts %d (1..%d), row_pad %d, "
                     "t_max %d, topk %d, capacity %lld", fn, s->num_ranks, MOK_SCHEDULE_EP_MAX_RANKS, s->rank,
                     s->local_experts, MOK_SCHEDULE_LOCAL_MAX_EXPERTS, s->row_pad, s->t_max, s->topk,
                     (long long)s->capacity);
  if (!s->expert_count || !s->expert_offset || !s->src_count || !s->row_route || !s->flag)
    return mok_error(NULL, mokInvalidArgument, "%s: an output pointer is NULL", fn);
  for (int q = 0; q < s->num_ranks; ++q)
    if (!s->count[q] || !s->off[q] || !s->order[q])
      return mok_error(NULL, mokInvalidArgument, "%s: source %d's count, off or order is NULL", fn, q);
  k_ep_segments<<<1, 1024, 0, stream>>>(*s);
  const int64_t blocks = (s->capacity + 255) / 256;
  k_ep_rows<<<(unsigned)(blocks < 1 ? 1 : blocks < 1024 ? blocks : 1024), 256, 0, stream>>>(*s);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
extern "C" mokKernelAnchor mok_anchor_schedule_dev(void) {
  mokKernelAnchor a = {"src/schedule_dev.cu", (const void *)k_send_order, {NULL}};
  return a;
}
