/*
 * schedule_ep.c — the expert-parallel schedule composed from every source's send order
 * (schedule_ep.h). The per-row step is schedule.h's mok_sched_row_source, as a device
 * kernel would run it, one row at a time.
 */
#include "schedule_ep.h"

#include "schedule.h"

#include <stdlib.h>

int64_t mok_sched_send(const int32_t *topk_idx, int T, int k, int E, int32_t *count, int32_t *off, int32_t *order) {
  const int64_t routes = (int64_t)T * k;
  for (int64_t q = 0; q < routes; q++)
    if (topk_idx[q] < -1 || topk_idx[q] >= E) return q;
  for (int e = 0; e < E; e++) count[e] = 0;
  for (int64_t q = 0; q < routes; q++)
    if (topk_idx[q] >= 0) count[topk_idx[q]]++;
  off[0] = 0;
  for (int e = 0; e < E; e++) off[e + 1] = off[e] + count[e];
  /* a counting sort, stable: slots in (t, j) order inside each expert */
  for (int e = 0; e < E; e++) count[e] = 0;
  for (int64_t q = 0; q < routes; q++) {
    const int32_t e = topk_idx[q];
    if (e >= 0) order[off[e] + count[e]++] = (int32_t)q;
  }
  return -1;
}

int64_t mok_sched_compose(int N, int E_l, int r, int P, int t_max, int k, const int32_t *const *count,
                          const int32_t *const *off, const int32_t *const *order, int32_t *expert_count,
                          int32_t *expert_offset, int32_t *src_count, int32_t *row_route, int64_t capacity) {
  /* the sources' counts of this rank's experts, [N, E_l] (src_count's layout): what the
   * device exchange gathers from the peers' windows */
  int32_t *src = src_count ? src_count : malloc(sizeof(int32_t) * (size_t)N * (size_t)E_l);
  if (!src) return -2;
  for (int s = 0; s < N; s++)
    for (int e = 0; e < E_l; e++) src[s * E_l + e] = count[s][r * E_l + e];
  int64_t rows = 0;
  for (int e = 0; e < E_l; e++) {
    int32_t n = 0;
    for (int s = 0; s < N; s++) n += src[s * E_l + e];
    expert_count[e] = n;
    expert_offset[e] = (int32_t)rows;
    rows += mok_segment_rows(n, P);
  }
  expert_offset[E_l] = (int32_t)rows;
  if (rows <= capacity)
    for (int e = 0; e < E_l; e++) {
      const int eg = r * E_l + e;
      for (int32_t row = expert_offset[e]; row < expert_offset[e + 1]; row++) {
        int32_t i = 0;
        const int s = mok_sched_row_source(src + e, E_l, N, row - expert_offset[e], &i);
        if (s < 0) {
          row_route[row] = -1;
          continue;
        }
        const int32_t q = order[s][off[s][eg] + i]; /* slot t * k + j on source s */
        row_route[row] = mok_route_id(s, q / k, q % k, t_max, k);
      }
    }
  if (src != src_count) free(src);
  return rows <= capacity ? rows : -1;
}
