/*
 * ep_dev.h — the expert-parallel data movement of the megakernel at N > 1, stage A
 * (docs/MEGAKERNEL.md, "More than one GPU"): an expert rank's y rows pushed to their
 * sources' combine buffers, one slot a route (t * topk + j: one writer a slot, so the
 * source's sums over j are deterministic), and the slot map a source's combine reads; in
 * the backward, d_out pulled from the sources into dY rows with d_topk_w pushed back (the
 * dX rows then go back by the same push, summed by the source with weights 1).
 * Device pointers to other ranks' buffers are their windows as seen here (peer_base at
 * N > 1; plain buffers of one GPU in the tests). Internal; C11-compatible. Written in
 * session 31 with a one-GPU test of N simulated ranks (test_ep_gpu.cu): not yet run on a
 * GPU, not yet called by the layer.
 */
#ifndef MOK_EP_DEV_H
#define MOK_EP_DEV_H

#include <stdint.h>

#include "mok.h"
#include "schedule_dev.h" /* defines: MOK_SCHEDULE_EP_MAX_RANKS */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mokEpPush {
  int num_ranks, t_max, topk, hidden;         /* hidden: a multiple of 8 */
  int64_t max_rows;                           /* rows of y and row_route (the schedule's capacity) */
  const int32_t *row_route;                   /* [max_rows] route ids (s * t_max + t) * topk + j, -1 padding */
  const int32_t *rows;                        /* [1] rows in use (the schedule's expert_offset[E_l]) */
  const int32_t *flag;                        /* [1] or NULL: nonzero (the schedule's flag): nothing moves */
  const mokBf16 *y;                           /* [max_rows, hidden] */
  mokBf16 *dst[MOK_SCHEDULE_EP_MAX_RANKS];    /* source s's combine buffer [T_s * topk, hidden] */
} mokEpPush_t;
/* Row `row` of y, route (s, t, j), to dst[s] + (t * topk + j) * hidden; a warp a row.
 * Validates its arguments (mokInvalidArgument, nothing launched). */
mokResult_t mok_ep_push_launch(const mokEpPush_t *p, cudaStream_t stream);

/* slot[q] = q where topk_idx[q] >= 0, else -1: the row map k_combine_rows reads over a
 * combine buffer of T * topk slots (a dropped route's slot is never written); and, where
 * zero_dw is not NULL, zero_dw[q] = 0 for a dropped route (the backward's d_topk_w: the
 * expert ranks write only the routed slots). */
mokResult_t mok_ep_slots_launch(const int32_t *topk_idx, int64_t routes, int32_t *slot, float *zero_dw,
                                cudaStream_t stream);

/* The backward's first step on an expert rank (EP1: baseline.cu's k_dtopk_dy): for each row
 * in use, route (s, t, j), with d = source s's d_out row t and w = its topk_w[t * topk + j]:
 * source s's d_topk_w[t * topk + j] = <d, the row's forward y> (fp32, lanes' sums then a
 * fixed shuffle tree: k_dtopk_dy's order), then the row becomes bf16(w * d) in place (dY).
 * A warp a row. */
typedef struct mokEpPull {
  int num_ranks, t_max, topk, hidden;
  int64_t max_rows;
  const int32_t *row_route;                   /* [max_rows] */
  const int32_t *rows;                        /* [1] rows in use */
  const int32_t *flag;                        /* [1] or NULL: nonzero, nothing read or written */
  mokBf16 *y;                                 /* [max_rows, hidden]: the forward's y in, dY out */
  const mokBf16 *d_out[MOK_SCHEDULE_EP_MAX_RANKS]; /* source s's [T_s, hidden] */
  const float *topk_w[MOK_SCHEDULE_EP_MAX_RANKS];  /* source s's [T_s * topk] */
  float *d_topk_w[MOK_SCHEDULE_EP_MAX_RANKS];      /* source s's [T_s * topk] */
} mokEpPull_t;
mokResult_t mok_ep_dtopk_dy_launch(const mokEpPull_t *p, cudaStream_t stream);
/* Whether any source refused its pass, where no host exchanged it (mokLayerSetRecvCapacity):
 * *flag |= 1 where some bad[s] is nonzero, recording MOK_ERRWORD(INPUT, MOK_WAIT_EP_REFUSED,
 * rank, s) for the lowest such s in error_word (if not NULL). One thread. */
typedef struct mokEpFlags {
  int num_ranks, rank;
  const int32_t *bad[MOK_SCHEDULE_EP_MAX_RANKS]; /* each source's refusal flag (its window) */
  int32_t *flag;                                 /* [1] this rank's pass flag (or'ed into) */
  unsigned long long *error_word;                /* or NULL (the layer's status word) */
  const unsigned long long *comm_error;          /* or NULL: nonzero = *flag |= 1, nothing recorded */
} mokEpFlags_t;
mokResult_t mok_ep_any_bad_launch(const mokEpFlags_t *f, cudaStream_t stream);
/* dst[i] = src[i] for i < n, unless *flag is nonzero (then nothing is written). */
mokResult_t mok_ep_copy_f32_launch(const float *src, float *dst, int64_t n, const int32_t *flag, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* MOK_EP_DEV_H */
