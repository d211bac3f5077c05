/*
 * reference.h — the float64 CPU reference of the expert-parallel MoE layer over N
 * simulated ranks (internal core; mokReference* in reference.c wrap it for bf16
 * host tensors). The core reads float64 tensors so the gradient check can perturb
 * them; `round` switches the bf16 rounding at the storage points (DESIGN.md 2a) on.
 */
#ifndef MOK_REFERENCE_H
#define MOK_REFERENCE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ref_problem {
  const mokConfig_t *cfg;     /* validated config (row_pad set) */
  int round;                  /* 1: bf16 rounding where the GPU stores bf16; 0: exact */
  const int *tokens;          /* [N] T_r */
  const int32_t *const *idx;  /* [N] -> [T_r, k] */
  const double *const *x;     /* [N] -> [T_r, H] */
  const double *const *w;     /* [N] -> [T_r, k] router weights */
  const double *const *wg;    /* [N] -> [E_l, I, H] */
  const double *const *wu;    /* [N] -> [E_l, I, H] */
  const double *const *wd;    /* [N] -> [E_l, H, I] */
  const double *const *sg;    /* [N] -> [I_s, H] (NULL entries when I_s == 0) */
  const double *const *su;    /* [N] -> [I_s, H] */
  const double *const *sd;    /* [N] -> [H, I_s] */
} ref_problem;

/* The schedule of one expert-owning rank (see schedule.h). Arrays owned by the caller. */
typedef struct ref_schedule {
  int32_t *count;      /* [E_l] */
  int32_t *offset;     /* [E_l + 1] */
  int32_t *src_count;  /* [N, E_l] */
  int32_t *row_route;  /* [capacity] */
} ref_schedule;

/* Checks every expert id (in [-1, E)) and T_r (0..T_max); message names rank/token/slot. */
mokResult_t ref_check_routing(struct mokLayer *layer, const mokConfig_t *cfg, const int *tokens,
                              const int32_t *const *idx);
/* Counts (pass 1) and, when sched->row_route != NULL, fills the rows (pass 2). */
void ref_schedule_build(const mokConfig_t *cfg, int rank, const int *tokens, const int32_t *const *idx,
                        ref_schedule *sched);

/* Forward. out[N] -> [T_r, H]. Optional (NULL) per-rank traces in schedule order:
 * gx[N] -> [rows, H], act[N] -> [rows, I], y[N] -> [rows, H] (rows = offset[E_l] of that rank),
 * shared[N] -> [T_r, H]. Returns mokOutOfMemory on allocation failure. */
mokResult_t ref_forward(const ref_problem *p, double *const *out, double *const *gx, double *const *act,
                        double *const *y, double *const *shared);

/* Backward given d_out[N] -> [T_r, H]. Gradients (all float64, overwritten):
 * dx[N] [T_r, H], dw[N] [T_r, k], dwg/dwu [N] [E_l, I, H], dwd [N] [E_l, H, I],
 * dsg/dsu [N] [I_s, H], dsd [N] [H, I_s] (shared entries unused when I_s == 0). */
mokResult_t ref_backward(const ref_problem *p, const double *const *dout, double *const *dx, double *const *dw,
                         double *const *dwg, double *const *dwu, double *const *dwd, double *const *dsg,
                         double *const *dsu, double *const *dsd);

/* Selected rows idx[q] of dW_gate and dW_up and columns idx[q] of dW_down of global
 * expert `expert`, from its weights alone (wg, wu [I, H], wd [H, I]); each output
 * [n_idx, H] (dwd[q, h] = dW_down[h, idx[q]]). The routing must be valid. */
void ref_expert_grad_sample(const ref_problem *p, int expert, const double *wg, const double *wu, const double *wd,
                            const double *const *dout, int n_idx, const int *idx, double *dwg, double *dwu,
                            double *dwd);

#ifdef __cplusplus
}
#endif
#endif
