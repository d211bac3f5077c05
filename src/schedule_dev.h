/*
 * schedule_dev.h — the schedule of one rank's own routes, computed on the device
 * (src/schedule_dev.cu; internal; C11-compatible). For a rank that owns every expert
 * (EP1): the forward megakernel's rows without a host wait.
 *
 * Results (device arrays), bitwise mokReferenceSchedule's layout for N = 1:
 *   expert_count[e]    routes of expert e;  expert_offset[e]: first row of its segment,
 *                      padded to a multiple of row_pad, [E] = rows in use
 *   send_pos[q]        route q = t * topk + j in expert-sorted (send) order: the number of
 *                      routes of lower experts + its rank among e's routes; -1 = empty slot
 *   route_row[q]       its row (expert_offset[e] + rank); -1 = empty slot
 *   row_tok[row]       token of each row in use, -1 on padding rows
 *   row_map[row]       send position of each row in use (the baseline's receive map), -1
 *                      on padding rows
 *   bad                0, or 1 when an id lay outside [-1, E): then MOK_ERRWORD(INPUT,
 *                      MOK_WAIT_SCHED_INPUT, rank, route) goes to error_word (if not
 *                      NULL) and nothing else is written
 */
#ifndef MOK_SCHEDULE_DEV_H
#define MOK_SCHEDULE_DEV_H

#include <stdint.h>

#include "mok.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOK_SCHEDULE_LOCAL_MAX_EXPERTS 1024

typedef struct mokLocalSchedule {
  const int32_t *topk_idx; /* [num_tokens * topk] */
  int num_tokens, topk, num_experts, row_pad;
  int32_t *expert_count;   /* [E] */
  int32_t *expert_offset;  /* [E + 1] */
  int32_t *send_pos;       /* [num_tokens * topk] */
  int32_t *route_row;      /* [num_tokens * topk] */
  int32_t *row_tok;        /* [rows in use] (capacity of the layer's schedule) */
  int32_t *row_map;        /* [rows in use] */
  int32_t *bad;            /* [1] */
  int32_t *scratch;        /* [mok_schedule_local_scratch(num_experts)] device words */
  unsigned long long *error_word; /* or NULL */
  int rank;
  int32_t *shared_seg;     /* or NULL: [3] the shared expert as a one-expert problem over
                              the tokens, for the megakernel: {count T, offset 0, offset
                              T rounded up to row_pad} (expert_count = shared_seg,
                              expert_offset = shared_seg + 1) */
} mokLocalSchedule_t;

/* Device words of scratch a schedule of num_experts experts needs. */
int64_t mok_schedule_local_scratch(int num_experts);
/* Three small launches on `stream`; validates its arguments (mokInvalidArgument, nothing
 * launched). */
mokResult_t mok_schedule_local_launch(const mokLocalSchedule_t *s, cudaStream_t stream);

/* ---- expert parallel (N > 1): the schedule composed from every source's send order ----
 * (schedule_ep.h is the host version and the arithmetic; docs/MEGAKERNEL.md, "More than one
 * GPU", stage A). Written in session 31 with a one-GPU test of N simulated sources
 * (test_schedule_gpu.cu); not yet run on a GPU, not yet called by the layer.
 *
 * A source's send order: mok_schedule_local_launch over the E global experts with row_pad 1
 * gives count (expert_count), off (expert_offset) and each route's position (send_pos);
 * mok_schedule_send_order_launch then writes order[send_pos[q]] = q (nothing where the
 * schedule refused its input: *bad set). */
mokResult_t mok_schedule_send_order_launch(const int32_t *send_pos, int64_t routes, const int32_t *bad,
                                           int32_t *order, cudaStream_t stream);

#define MOK_SCHEDULE_EP_MAX_RANKS 72
/* Expert rank `rank`'s schedule from the N sources' send orders, read through the device
 * pointers given (peers' windows at N > 1; plain buffers in a test): bitwise
 * mokReferenceSchedule's expert_count, expert_offset, src_count and row_route. */
typedef struct mokEpSchedule {
  int num_ranks, rank, local_experts, row_pad, t_max, topk;
  const int32_t *count[MOK_SCHEDULE_EP_MAX_RANKS]; /* source s: [E] routes to each global expert */
  const int32_t *off[MOK_SCHEDULE_EP_MAX_RANKS];   /* [E + 1] their first send position */
  const int32_t *order[MOK_SCHEDULE_EP_MAX_RANKS]; /* [T_s * topk] slot t * topk + j, send order */
  const int32_t *bad[MOK_SCHEDULE_EP_MAX_RANKS];   /* [1] each source's refusal flag, or NULL */
  int64_t capacity;                                /* rows of row_route */
  int32_t *expert_count;  /* [E_l] */
  int32_t *expert_offset; /* [E_l + 1] */
  int32_t *src_count;     /* [N * E_l] (required: the row pass reads it) */
  int32_t *row_route;     /* [capacity]: route ids (s * t_max + t) * topk + j, -1 on padding rows */
  int32_t *flag;          /* [1] out: 0, 1 = a source refused its input, 2 = rows > capacity;
                             then row_route is not written */
  unsigned long long *error_word; /* or NULL: a nonzero flag also records MOK_ERRWORD(INPUT,
                                     MOK_WAIT_EP_REFUSED, rank, the first refusing source) or
                                     (INPUT, MOK_WAIT_EP_CAPACITY, rank, rows) there (no host
                                     reads the flag: mokLayerSetRecvCapacity; the layer's
                                     status word, not the comm's, so barriers stay exact) */
  const unsigned long long *comm_error; /* or NULL: the comm's error word; nonzero (a timeout
                                     somewhere) = flag 1, nothing read from the sources */
} mokEpSchedule_t;
/* Two launches on `stream`; validates its arguments (mokInvalidArgument, nothing launched). */
mokResult_t mok_schedule_ep_launch(const mokEpSchedule_t *s, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* MOK_SCHEDULE_DEV_H */
