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

#endif /* MOK_SCHEDULE_H */
