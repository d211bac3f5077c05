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

#ifdef __cplusplus
}
#endif
#endif /* MOK_SCHEDULE_DEV_H */
