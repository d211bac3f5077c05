/*
 * schedule_dev.cu — the schedule of one rank's own routes on the device (EP1: the rank
 * owns every expert), so that a forward needs no host wait: expert counts, padded
 * segment offsets, and for every route and row where it goes, bitwise the layout of
 * mokReferenceSchedule (include/mok.h: an expert's routes ordered by (t, j), segments
 * padded with rows of -1 to a multiple of P, in expert order).
 *
 * One CTA of 1024 threads (32 warps), two passes over the routes:
 *  1. warp w takes the w-th contiguous slice of the routes and counts, per expert, its
 *     routes (warp-synchronous: __match_any_sync groups the lanes of one expert, the
 *     group's lowest lane adds the group's size to the warp's column in shared memory);
 *  2. per expert, an exclusive scan over the warps gives each warp's first rank; one
 *     thread turns the counts into the cursors (send order) and padded offsets;
 *  3. each warp walks its slice again: a route's rank in its expert = its warp's base +
 *     the lanes of its group below it (+ the groups before, added as it goes).
 * An id outside [-1, E) sets *bad and records MOK_ERRWORD(INPUT, MOK_WAIT_SCHED_INPUT,
 * rank, route) in the error word; nothing else is written then (the megakernel reads
 * *bad and writes nothing either).
 */
#include <cuda_runtime.h>

#include "comm.h"     /* defines: MOK_ERRWORD, MOK_DEVERR_INPUT, MOK_WAIT_SCHED_INPUT */
#include "internal.h" /* defines: mok_error, CUDA_CHECK */
#include "schedule_dev.h"

namespace {

constexpr int kWarps = 32;

__global__ void __launch_bounds__(kWarps * 32, 1) k_schedule_local(mokLocalSchedule_t s) {
  extern __shared__ int sm[];
  const int E = s.num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int *wc = sm;                 /* [kWarps][E]: counts, then each warp's running rank base */
  int *cursor = wc + kWarps * E; /* [E]: first send position of each expert */
  int *off = cursor + E;         /* [E + 1]: padded segment offsets */
  __shared__ int bad_route;
  const int64_t R = (int64_t)s.num_tokens * s.topk;
  const int64_t slice = ((R + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int64_t q0 = warp * slice, q1 = q0 + slice < R ? q0 + slice : R;
  for (int i = threadIdx.x; i < kWarps * E; i += blockDim.x) wc[i] = 0;
  if (threadIdx.x == 0) bad_route = -1;
  __syncthreads();
  /* 1. counts per warp and expert */
  for (int64_t q = q0; q < q1; q += 32) {
    const int64_t my = q + lane;
    const int e = my < q1 ? s.topk_idx[my] : -1;
    if (e < -1 || e >= E) atomicMax(&bad_route, (int)my); /* (some bad route; the message names one) */
    const bool valid = e >= 0 && e < E;
    const unsigned grp = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid && lane == __ffs(grp) - 1) wc[warp * E + e] += __popc(grp);
    __syncwarp();
  }
  __syncthreads();
  if (bad_route >= 0) {
    if (threadIdx.x == 0) {
      *s.bad = 1;
      if (s.error_word)
        atomicCAS(s.error_word, 0ull, MOK_ERRWORD(MOK_DEVERR_INPUT, MOK_WAIT_SCHED_INPUT, s.rank, (uint32_t)bad_route));
      __threadfence_system();
    }
    return;
  }
  /* 2. per expert: exclusive scan over the warps; then cursors and padded offsets */
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int n = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int c = wc[w * E + e];
      wc[w * E + e] = n;
      n += c;
    }
    s.expert_count[e] = n;
    cursor[e] = n; /* (the count, until thread 0 turns it into the cursor) */
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int c = 0, o = 0;
    for (int e = 0; e < E; ++e) {
      const int n = cursor[e];
      cursor[e] = c;
      off[e] = o;
      s.expert_offset[e] = o;
      c += n;
      o += (n + s.row_pad - 1) / s.row_pad * s.row_pad;
    }
    off[E] = o;
    s.expert_offset[E] = o;
    *s.bad = 0;
  }
  __syncthreads();
  /* 3. every route's rank in its expert, in (t, j) order */
  for (int64_t q = q0; q < q1; q += 32) {
    const int64_t my = q + lane;
    const int e = my < q1 ? s.topk_idx[my] : -1;
    const bool valid = e >= 0;
    const unsigned grp = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid) {
      const int rank = wc[warp * E + e] + __popc(grp & ((1u << lane) - 1u));
      const int row = off[e] + rank;
      s.send_pos[my] = cursor[e] + rank;
      s.route_row[my] = row;
      s.row_tok[row] = (int32_t)(my / s.topk);
      s.row_map[row] = cursor[e] + rank;
    } else if (my < q1) {
      s.send_pos[my] = -1;
      s.route_row[my] = -1;
    }
    __syncwarp();
    if (valid && lane == __ffs(grp) - 1) wc[warp * E + e] += __popc(grp);
    __syncwarp();
  }
  /* padding rows: a warp an expert */
  for (int e = warp; e < E; e += kWarps) {
    const int n = s.expert_count[e]; /* (this thread's own write in step 2, or another's before the barrier) */
    for (int r = off[e] + n + lane; r < off[e + 1]; r += 32) s.row_tok[r] = -1, s.row_map[r] = -1;
  }
}

} /* namespace */

extern "C" mokResult_t mok_schedule_local_launch(const mokLocalSchedule_t *s, cudaStream_t stream) {
  static const char fn[] = "mok_schedule_local_launch";
  if (!s) return mok_error(NULL, mokInvalidArgument, "%s: s is NULL", fn);
  if (s->num_experts < 1 || s->num_experts > MOK_SCHEDULE_LOCAL_MAX_EXPERTS || s->num_tokens < 0 || s->topk < 1 ||
      s->row_pad < 1 || (int64_t)s->num_tokens * s->topk > (int64_t)1 << 30)
    return mok_error(NULL, mokInvalidArgument, "%s: experts %d (1..%d), tokens %d, topk %d, row_pad %d", fn,
                     s->num_experts, MOK_SCHEDULE_LOCAL_MAX_EXPERTS, s->num_tokens, s->topk, s->row_pad);
  if (!s->expert_count || !s->expert_offset || !s->row_tok || !s->row_map || !s->bad ||
      (s->num_tokens && (!s->topk_idx || !s->send_pos || !s->route_row)))
    return mok_error(NULL, mokInvalidArgument, "%s: a device pointer is NULL", fn);
  const size_t smem = sizeof(int) * ((size_t)(kWarps + 2) * s->num_experts + 1);
  CUDA_CHECK(NULL, cudaFuncSetAttribute(k_schedule_local, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  k_schedule_local<<<1, kWarps * 32, smem, stream>>>(*s);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}
