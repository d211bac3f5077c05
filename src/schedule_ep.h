/*
 * schedule_ep.h — the schedule of an expert-parallel pass composed from every source
 * rank's send order (schedule.h's last section), on the host: the arithmetic the
 * megakernel at N > 1 will run on the device (each source its send order, the exchange of
 * the counts, each expert rank its segments), checked against mokReferenceSchedule in
 * tests/test_schedule.c. Plain C, no device work.
 */
#ifndef MOK_SCHEDULE_EP_H
#define MOK_SCHEDULE_EP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A source rank's send order over E global experts, from its T * k routes topk_idx (-1: a
 * dropped route): count[e] its routes to e, off[e] (E + 1 entries) their first position,
 * order[off[e] + i] the slot t * k + j of the i-th of them, in (t, j) order. Returns -1, or
 * the first slot whose id lies outside [-1, E) (then nothing is written). */
int64_t mok_sched_send(const int32_t *topk_idx, int T, int k, int E, int32_t *count, int32_t *off, int32_t *order);

/* Expert rank r's schedule (mokSchedule_t's arrays: expert_count[E_l], expert_offset[E_l + 1],
 * src_count[N * E_l] or NULL, row_route[capacity]) from the N sources' send orders
 * (count[s], off[s], order[s] as mok_sched_send wrote them over E = N * E_l experts), segments
 * padded to P rows, route ids (s * t_max + t) * k + j. Returns the rows in use; -1 where they
 * exceed capacity (then row_route is not written), -2 out of host memory (nothing written). */
int64_t mok_sched_compose(int N, int E_l, int r, int P, int t_max, int k, const int32_t *const *count,
                          const int32_t *const *off, const int32_t *const *order, int32_t *expert_count,
                          int32_t *expert_offset, int32_t *src_count, int32_t *row_route, int64_t capacity);

#ifdef __cplusplus
}
#endif

#endif /* MOK_SCHEDULE_EP_H */
