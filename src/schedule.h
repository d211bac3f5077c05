/*
 * schedule.h — the row layout every implementation shares (DESIGN.md section 2a), as
 * host/device inline functions: the CPU reference and the GPU kernels compute the
 * schedule from these, so it is bitwise identical everywhere.
 *
 * On expert-owning rank r, local expert e's routes (s, t, j) are ordered by source
 * rank s, then token t, then slot j; the segment is padded to a multiple of P rows;
 * segments follow in expert order:
 *   row(s, t, j) = offset[e] + sum_{s' < s} src_count[s'][e] + #{(t', j') of rank s
 *                  routed to e with (t', j') < (t, j)}
 *   offset[e + 1] = offset[e] + round_up(count[e], P)
 */
#ifndef MOK_SCHEDULE_H
#define MOK_SCHEDULE_H

#include <stdint.h>

#if defined(__CUDACC__)
#define MOK_SHD __host__ __device__ __forceinline__
#else
#define MOK_SHD static inline
#endif

/* Route id of slot j of token t on source rank s. */
MOK_SHD int32_t mok_route_id(int s, int t, int j, int t_max, int k) {
  return (int32_t)(((int64_t)s * t_max + t) * k + j);
}
MOK_SHD void mok_route_decode(int32_t id, int t_max, int k, int *s, int *t, int *j) {
  *j = id % k;
  *t = (id / k) % t_max;
  *s = id / k / t_max;
}
/* Rows a segment of `count` routes occupies. */
MOK_SHD int32_t mok_segment_rows(int32_t count, int32_t pad) { return (count + pad - 1) / pad * pad; }
/* Owner rank and local index of a global expert id (E_l experts per rank). */
MOK_SHD int mok_expert_owner(int32_t expert, int e_local) { return expert / e_local; }


/* ---- the schedule at N > 1 composed from every source's send order -------------------
 * (docs/MEGAKERNEL.md, "More than one GPU"; host functions in schedule_ep.c.) Source rank s
 * orders its own routes by global expert, then (t, j): inside any segment its routes keep
 * that order, so it can publish, per global expert, their count; the expert-owning rank
 * lays its segments out from every source's counts (the header's formula). With counts
 * seen as counts[s * stride] (s = 0 .. n_src-1; stride: the exchanged array's row length)
 * for one expert: */

/* First row of source s's routes in a segment that starts at seg_offset. */
MOK_SHD int32_t mok_sched_src_base(int32_t seg_offset, const int32_t *counts, int64_t stride, int s) {
  int32_t b = seg_offset;
  for (int q = 0; q < s; q++) b += counts[q * stride];
  return b;
}
/* Row i of a segment (0 = its first row): its source, and (*idx) its index among that
 * source's routes to the expert; -1 on a padding row. */
MOK_SHD int mok_sched_row_source(const int32_t *counts, int64_t stride, int n_src, int32_t i, int32_t *idx) {
  for (int s = 0; s < n_src; s++) {
    const int32_t c = counts[s * stride];
    if (i < c) {
      *idx = i;
      return s;
    }
    i -= c;
  }
  return -1;
}

#endif /* MOK_SCHEDULE_H */
