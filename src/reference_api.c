/*
 * reference_api.c — the public mokReference* entry points: validate every input the
 * call reads, widen the bf16 host tensors to float64, run the reference core
 * (reference.c) with bf16 rounding on, and narrow the results into the caller's
 * buffers. Nothing is written unless the whole call succeeds.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "reference.h"

/* ---- validation ---------------------------------------------------------------- */
static mokResult_t check_inputs(mokLayer_t l, const char *fn, const mokRankInput_t *in, int need_x) {
  const mokConfig_t *c = &l->cfg;
  if (!in) return mok_error(l, mokInvalidArgument, "%s: inputs is NULL", fn);
  for (int s = 0; s < c->num_ranks; s++) {
    if (in[s].num_tokens < 0 || in[s].num_tokens > c->max_tokens)
      return mok_error(l, mokInvalidArgument, "%s: inputs[%d].num_tokens is %d, it must be in [0, max_tokens=%d]",
                       fn, s, in[s].num_tokens, c->max_tokens);
    if (in[s].num_tokens == 0) continue;
    if (!in[s].topk_idx) return mok_error(l, mokInvalidArgument, "%s: inputs[%d].topk_idx is NULL", fn, s);
    if (need_x && !in[s].x) return mok_error(l, mokInvalidArgument, "%s: inputs[%d].x is NULL", fn, s);
    if (need_x && !in[s].topk_w) return mok_error(l, mokInvalidArgument, "%s: inputs[%d].topk_w is NULL", fn, s);
  }
  int tokens[c->num_ranks > 0 ? c->num_ranks : 1];
  const int32_t *idx[c->num_ranks > 0 ? c->num_ranks : 1];
  for (int s = 0; s < c->num_ranks; s++) { tokens[s] = in[s].num_tokens; idx[s] = in[s].topk_idx; }
  mokResult_t rc = ref_check_routing(l, c, tokens, idx);
  if (rc != mokSuccess) return mok_error(l, rc, "%s: %s", fn, mokGetLastError());
  return mokSuccess;
}

static mokResult_t check_weights(mokLayer_t l, const char *fn, const mokRankWeights_t *w) {
  if (!w) return mok_error(l, mokInvalidArgument, "%s: weights is NULL", fn);
  for (int r = 0; r < l->cfg.num_ranks; r++) {
    if (!w[r].w_gate || !w[r].w_up || !w[r].w_down)
      return mok_error(l, mokInvalidArgument, "%s: weights[%d]: w_gate, w_up and w_down must not be NULL", fn, r);
    if (l->cfg.shared_inter && (!w[r].s_gate || !w[r].s_up || !w[r].s_down))
      return mok_error(l, mokInvalidArgument,
                       "%s: weights[%d]: shared_inter is %d, so s_gate, s_up and s_down must not be NULL", fn, r,
                       l->cfg.shared_inter);
  }
  return mokSuccess;
}

/* ---- widening ------------------------------------------------------------------- */
typedef struct {
  int N;
  double **mem;        /* every allocation, freed together */
  int nmem, cap;
  ref_problem p;
  const int32_t **idx;
  const double **x, **w, **wg, **wu, **wd, **sg, **su, **sd;
} widened;

static double *wd_alloc(widened *W, size_t n) {
  if (W->nmem == W->cap) {
    int cap = W->cap ? 2 * W->cap : 64;
    double **m = realloc(W->mem, sizeof(double *) * (size_t)cap);
    if (!m) return NULL;
    W->mem = m;
    W->cap = cap;
  }
  double *d = malloc(sizeof(double) * (n ? n : 1));
  if (d) W->mem[W->nmem++] = d;
  return d;
}

static const double *wd_bf16(widened *W, const mokBf16 *src, size_t n, int *ok) {
  if (!src) return NULL;
  double *d = wd_alloc(W, n);
  if (!d) { *ok = 0; return NULL; }
  for (size_t i = 0; i < n; i++) d[i] = (double)mok_bf16_to_f32(src[i]);
  return d;
}

static void wd_free(widened *W) {
  for (int i = 0; i < W->nmem; i++) free(W->mem[i]);
  free(W->mem);
  free((void *)W->idx); free((void *)W->x); free((void *)W->w);
  free((void *)W->wg); free((void *)W->wu); free((void *)W->wd);
  free((void *)W->sg); free((void *)W->su); free((void *)W->sd);
}

static mokResult_t widen(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *wt, widened *W) {
  const mokConfig_t *c = &l->cfg;
  const int N = c->num_ranks, El = l->local_experts, H = c->hidden, I = c->inter, Is = c->shared_inter, k = c->topk;
  memset(W, 0, sizeof *W);
  W->N = N;
  size_t pn = sizeof(void *) * (size_t)N;
  W->idx = malloc(pn); W->x = malloc(pn); W->w = malloc(pn);
  W->wg = malloc(pn); W->wu = malloc(pn); W->wd = malloc(pn);
  W->sg = calloc((size_t)N, sizeof(void *)); W->su = calloc((size_t)N, sizeof(void *)); W->sd = calloc((size_t)N, sizeof(void *));
  int ok = W->idx && W->x && W->w && W->wg && W->wu && W->wd && W->sg && W->su && W->sd;
  int *tokens = ok ? malloc(sizeof(int) * (size_t)N) : NULL;
  ok = ok && tokens;
  for (int s = 0; ok && s < N; s++) {
    int T = in[s].num_tokens;
    tokens[s] = T;
    W->idx[s] = T ? in[s].topk_idx : NULL;
    static const mokBf16 none = 0;
    W->x[s] = wd_bf16(W, T ? in[s].x : &none, (size_t)T * H, &ok);
    double *wv = wd_alloc(W, (size_t)T * k);
    ok = ok && wv;
    for (int64_t q = 0; ok && q < (int64_t)T * k; q++) wv[q] = in[s].topk_w[q];
    W->w[s] = wv;
    W->wg[s] = wd_bf16(W, wt[s].w_gate, (size_t)El * I * H, &ok);
    W->wu[s] = wd_bf16(W, wt[s].w_up, (size_t)El * I * H, &ok);
    W->wd[s] = wd_bf16(W, wt[s].w_down, (size_t)El * H * I, &ok);
    if (Is) {
      W->sg[s] = wd_bf16(W, wt[s].s_gate, (size_t)Is * H, &ok);
      W->su[s] = wd_bf16(W, wt[s].s_up, (size_t)Is * H, &ok);
      W->sd[s] = wd_bf16(W, wt[s].s_down, (size_t)H * Is, &ok);
    }
  }
  if (tokens) {
    /* keep the token array alive with the rest */
    double *keep = wd_alloc(W, ((size_t)N * sizeof(int) + sizeof(double) - 1) / sizeof(double));
    if (keep) { memcpy(keep, tokens, sizeof(int) * (size_t)N); W->p.tokens = (const int *)keep; } else ok = 0;
    free(tokens);
  }
  if (!ok) { wd_free(W); return mok_error(l, mokOutOfMemory, "CPU reference: out of host memory"); }
  W->p.cfg = &l->cfg;
  W->p.round = 1;
  W->p.idx = W->idx; W->p.x = W->x; W->p.w = W->w;
  W->p.wg = W->wg; W->p.wu = W->wu; W->p.wd = W->wd;
  W->p.sg = W->sg; W->p.su = W->su; W->p.sd = W->sd;
  return mokSuccess;
}

/* Per-rank float64 output buffers: n[r] elements each (NULL where want[r] is 0). */
static double **alloc_outs(widened *W, int N, const size_t *n, const int *want) {
  double **o = calloc((size_t)N, sizeof(double *));
  if (!o) return NULL;
  for (int r = 0; r < N; r++)
    if (!want || want[r]) {
      o[r] = wd_alloc(W, n[r]);
      if (!o[r]) { free(o); return NULL; }
    }
  return o;
}

static void narrow_bf16(mokBf16 *dst, const double *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = mok_f32_to_bf16((float)src[i]);
}
/* acc: add the fp32-rounded gradient to what dst holds (fp32 only), as the GPU does */
static void narrow_grad(void *dst, mokDtype_t dt, const double *src, size_t n, int acc) {
  if (dt == mokDtypeBF16) narrow_bf16((mokBf16 *)dst, src, n);
  else if (acc) for (size_t i = 0; i < n; i++) ((float *)dst)[i] = ((float *)dst)[i] + (float)src[i];
  else for (size_t i = 0; i < n; i++) ((float *)dst)[i] = (float)src[i];
}

/* ---- schedule ------------------------------------------------------------------- */
mokResult_t mokReferenceSchedule(mokLayer_t l, int rank, const mokRankInput_t *in, mokSchedule_t *sc) {
  static const char fn[] = "mokReferenceSchedule";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  const mokConfig_t *c = &l->cfg;
  if (rank < 0 || rank >= c->num_ranks)
    return mok_error(l, mokInvalidArgument, "%s: rank %d is not in [0, num_ranks=%d)", fn, rank, c->num_ranks);
  if (!sc) return mok_error(l, mokInvalidArgument, "%s: schedule is NULL", fn);
  if (!sc->expert_count || !sc->expert_offset || !sc->row_route)
    return mok_error(l, mokInvalidArgument, "%s: schedule->expert_count, expert_offset and row_route must not be NULL", fn);
  MOK_CHECK(check_inputs(l, fn, in, 0));
  const int N = c->num_ranks, El = l->local_experts;
  int *tokens = malloc(sizeof(int) * (size_t)N);
  const int32_t **idx = malloc(sizeof(void *) * (size_t)N);
  int32_t *count = malloc(sizeof(int32_t) * (size_t)El), *offset = malloc(sizeof(int32_t) * (size_t)(El + 1));
  int32_t *srcc = malloc(sizeof(int32_t) * (size_t)N * El);
  if (!tokens || !idx || !count || !offset || !srcc) {
    free(tokens); free(idx); free(count); free(offset); free(srcc);
    return mok_error(l, mokOutOfMemory, "%s: out of host memory", fn);
  }
  for (int s = 0; s < N; s++) { tokens[s] = in[s].num_tokens; idx[s] = in[s].topk_idx; }
  ref_schedule tmp = {count, offset, srcc, NULL};
  ref_schedule_build(c, rank, tokens, idx, &tmp);
  mokResult_t rc = mokSuccess;
  if (offset[El] > sc->capacity) {
    rc = mok_error(l, mokInvalidArgument, "%s: the schedule needs %d rows, schedule->capacity is %lld", fn,
                   (int)offset[El], (long long)sc->capacity);
  } else {
    ref_schedule out = {sc->expert_count, sc->expert_offset, sc->src_count, sc->row_route};
    ref_schedule_build(c, rank, tokens, idx, &out);
  }
  free(tokens); free(idx); free(count); free(offset); free(srcc);
  return rc;
}

/* ---- forward -------------------------------------------------------------------- */
mokResult_t mokReferenceForward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *wt,
                                mokBf16 *const *out, const mokRankTrace_t *trace) {
  static const char fn[] = "mokReferenceForward";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  MOK_CHECK(check_inputs(l, fn, in, 1));
  MOK_CHECK(check_weights(l, fn, wt));
  const mokConfig_t *c = &l->cfg;
  const int N = c->num_ranks, H = c->hidden, I = c->inter;
  if (!out) return mok_error(l, mokInvalidArgument, "%s: out is NULL", fn);
  for (int s = 0; s < N; s++)
    if (in[s].num_tokens && !out[s]) return mok_error(l, mokInvalidArgument, "%s: out[%d] is NULL", fn, s);
  widened W;
  MOK_CHECK(widen(l, in, wt, &W));
  size_t *sz = calloc((size_t)(unsigned)N * 3, sizeof(size_t));
  int *want = calloc((size_t)(unsigned)N * 4, sizeof(int));
  if (!sz || !want) {
    free(sz); free(want); wd_free(&W);
    return mok_error(l, mokOutOfMemory, "%s: out of host memory", fn);
  }
  size_t *n_out = sz, *n_rows_h = sz + N, *n_rows_i = sz + 2 * N;
  int *want_gx = want, *want_act = want + N, *want_y = want + 2 * N, *want_sh = want + 3 * N;
  for (int s = 0; s < N; s++) {
    n_out[s] = (size_t)in[s].num_tokens * H;
    n_rows_h[s] = (size_t)l->sched_capacity * H;
    n_rows_i[s] = (size_t)l->sched_capacity * I;
    want_gx[s] = trace && trace[s].gathered_x;
    want_act[s] = trace && trace[s].act;
    want_y[s] = trace && trace[s].expert_out;
    want_sh[s] = trace && trace[s].shared_out && c->shared_inter;
  }
  double **o = alloc_outs(&W, N, n_out, NULL);
  double **gx = alloc_outs(&W, N, n_rows_h, want_gx), **act = alloc_outs(&W, N, n_rows_i, want_act);
  double **y = alloc_outs(&W, N, n_rows_h, want_y), **sh = alloc_outs(&W, N, n_out, want_sh);
  mokResult_t rc = mokSuccess;
  if (!o || !gx || !act || !y || !sh) rc = mok_error(l, mokOutOfMemory, "%s: out of host memory", fn);
  for (int s = 0; rc == mokSuccess && s < N; s++) {
    if (gx[s]) memset(gx[s], 0, sizeof(double) * n_rows_h[s]);
    if (act[s]) memset(act[s], 0, sizeof(double) * n_rows_i[s]);
    if (y[s]) memset(y[s], 0, sizeof(double) * n_rows_h[s]);
  }
  if (rc == mokSuccess) rc = ref_forward(&W.p, o, gx, act, y, sh);
  if (rc == mokSuccess) {
    for (int s = 0; s < N; s++) {
      narrow_bf16(out[s], o[s], n_out[s]);
      if (!trace) continue;
      /* Trace rows in use on rank s: recompute the row count from the schedule. */
      int32_t *cnt = calloc((size_t)l->local_experts + 1, sizeof(int32_t));
      int32_t *off = calloc((size_t)l->local_experts + 1, sizeof(int32_t));
      size_t rows = 0;
      if (cnt && off) {
        ref_schedule t = {cnt, off, NULL, NULL};
        ref_schedule_build(c, s, W.p.tokens, W.p.idx, &t);
        rows = (size_t)off[l->local_experts];
      }
      free(cnt); free(off);
      if (gx[s]) narrow_bf16(trace[s].gathered_x, gx[s], rows * H);
      if (act[s]) narrow_bf16(trace[s].act, act[s], rows * I);
      if (y[s]) narrow_bf16(trace[s].expert_out, y[s], rows * H);
      if (sh[s]) narrow_bf16(trace[s].shared_out, sh[s], n_out[s]);
    }
  } else if (rc == mokOutOfMemory) {
    mok_error(l, rc, "%s: %s", fn, mokGetLastError());
  }
  free(o); free(gx); free(act); free(y); free(sh); free(sz); free(want);
  wd_free(&W);
  return rc;
}

/* ---- backward ------------------------------------------------------------------- */
mokResult_t mokReferenceBackward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *wt,
                                 const mokBf16 *const *d_out, const mokRankGrads_t *gr) {
  static const char fn[] = "mokReferenceBackward";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  MOK_CHECK(check_inputs(l, fn, in, 1));
  MOK_CHECK(check_weights(l, fn, wt));
  const mokConfig_t *c = &l->cfg;
  const int N = c->num_ranks, El = l->local_experts, H = c->hidden, I = c->inter, Is = c->shared_inter, k = c->topk;
  if (!d_out) return mok_error(l, mokInvalidArgument, "%s: d_out is NULL", fn);
  if (!gr) return mok_error(l, mokInvalidArgument, "%s: grads is NULL", fn);
  for (int s = 0; s < N; s++) {
    if (in[s].num_tokens && !d_out[s]) return mok_error(l, mokInvalidArgument, "%s: d_out[%d] is NULL", fn, s);
    if (in[s].num_tokens && (!gr[s].d_x || !gr[s].d_topk_w))
      return mok_error(l, mokInvalidArgument, "%s: grads[%d].d_x and d_topk_w must not be NULL", fn, s);
    if (!gr[s].d_w_gate || !gr[s].d_w_up || !gr[s].d_w_down)
      return mok_error(l, mokInvalidArgument, "%s: grads[%d].d_w_gate, d_w_up and d_w_down must not be NULL", fn, s);
    if (Is && (!gr[s].d_s_gate || !gr[s].d_s_up || !gr[s].d_s_down))
      return mok_error(l, mokInvalidArgument, "%s: grads[%d]: shared_inter is %d, so d_s_gate, d_s_up and d_s_down "
                       "must not be NULL", fn, s, Is);
    MOK_CHECK(mok_check_accumulate(l, fn, s, gr[s].accumulate));
  }
  widened W;
  MOK_CHECK(widen(l, in, wt, &W));
  int ok = 1;
  const double **dout = calloc((size_t)(unsigned)N, sizeof(double *));
  ok = dout != NULL;
  for (int s = 0; ok && s < N; s++) {
    static const mokBf16 none = 0;
    dout[s] = wd_bf16(&W, in[s].num_tokens ? d_out[s] : &none, (size_t)in[s].num_tokens * H, &ok);
  }
  size_t *sz = calloc((size_t)(unsigned)N * 5, sizeof(size_t));
  if (!sz) {
    free(dout);
    wd_free(&W);
    return mok_error(l, mokOutOfMemory, "%s: out of host memory", fn);
  }
  size_t *n_dx = sz, *n_dw = sz + N, *n_wgu = sz + 2 * N, *n_wd = sz + 3 * N, *n_s = sz + 4 * N;
  for (int s = 0; ok && s < N; s++) {
    n_dx[s] = (size_t)in[s].num_tokens * H;
    n_dw[s] = (size_t)in[s].num_tokens * k;
    n_wgu[s] = (size_t)El * I * H;
    n_wd[s] = (size_t)El * H * I;
    n_s[s] = (size_t)Is * H;
  }
  double **dx = ok ? alloc_outs(&W, N, n_dx, NULL) : NULL, **dw = ok ? alloc_outs(&W, N, n_dw, NULL) : NULL;
  double **dwg = ok ? alloc_outs(&W, N, n_wgu, NULL) : NULL, **dwu = ok ? alloc_outs(&W, N, n_wgu, NULL) : NULL;
  double **dwd = ok ? alloc_outs(&W, N, n_wd, NULL) : NULL;
  double **dsg = ok ? alloc_outs(&W, N, n_s, NULL) : NULL, **dsu = ok ? alloc_outs(&W, N, n_s, NULL) : NULL;
  double **dsd = ok ? alloc_outs(&W, N, n_s, NULL) : NULL;
  mokResult_t rc = mokSuccess;
  if (!ok || !dx || !dw || !dwg || !dwu || !dwd || !dsg || !dsu || !dsd)
    rc = mok_error(l, mokOutOfMemory, "%s: out of host memory", fn);
  if (rc == mokSuccess) rc = ref_backward(&W.p, dout, dx, dw, dwg, dwu, dwd, dsg, dsu, dsd);
  if (rc == mokSuccess) {
    for (int s = 0; s < N; s++) {
      narrow_bf16(gr[s].d_x, dx[s], n_dx[s]);
      for (size_t q = 0; q < n_dw[s]; q++) gr[s].d_topk_w[q] = (float)dw[s][q];
      narrow_grad(gr[s].d_w_gate, c->grad_dtype, dwg[s], n_wgu[s], gr[s].accumulate);
      narrow_grad(gr[s].d_w_up, c->grad_dtype, dwu[s], n_wgu[s], gr[s].accumulate);
      narrow_grad(gr[s].d_w_down, c->grad_dtype, dwd[s], n_wd[s], gr[s].accumulate);
      if (Is) {
        narrow_grad(gr[s].d_s_gate, c->grad_dtype, dsg[s], n_s[s], gr[s].accumulate);
        narrow_grad(gr[s].d_s_up, c->grad_dtype, dsu[s], n_s[s], gr[s].accumulate);
        narrow_grad(gr[s].d_s_down, c->grad_dtype, dsd[s], n_s[s], gr[s].accumulate);
      }
    }
  } else if (rc == mokOutOfMemory) {
    mok_error(l, rc, "%s: %s", fn, mokGetLastError());
  }
  free(sz);
  free(dout); free(dx); free(dw); free(dwg); free(dwu); free(dwd); free(dsg); free(dsu); free(dsd);
  wd_free(&W);
  return rc;
}

/* ---- sampled weight gradients of one expert -------------------------------------------- */
mokResult_t mokReferenceExpertGrads(mokLayer_t l, const mokRankInput_t *in, const mokBf16 *const *d_out, int expert,
                                    const mokBf16 *w_gate, const mokBf16 *w_up, const mokBf16 *w_down, int n_idx,
                                    const int *idx, double *d_w_gate_rows, double *d_w_up_rows,
                                    double *d_w_down_cols) {
  static const char fn[] = "mokReferenceExpertGrads";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  MOK_CHECK(check_inputs(l, fn, in, 1));
  const mokConfig_t *c = &l->cfg;
  const int N = c->num_ranks, H = c->hidden, I = c->inter, k = c->topk;
  if (!d_out) return mok_error(l, mokInvalidArgument, "%s: d_out is NULL", fn);
  for (int s = 0; s < N; s++)
    if (in[s].num_tokens && !d_out[s]) return mok_error(l, mokInvalidArgument, "%s: d_out[%d] is NULL", fn, s);
  if (expert < 0 || expert >= c->num_experts)
    return mok_error(l, mokInvalidArgument, "%s: expert %d is not in [0, %d)", fn, expert, c->num_experts);
  if (!w_gate || !w_up || !w_down)
    return mok_error(l, mokInvalidArgument, "%s: w_gate, w_up and w_down must not be NULL", fn);
  if (n_idx < 1 || !idx) return mok_error(l, mokInvalidArgument, "%s: need n_idx >= 1 and idx", fn);
  for (int q = 0; q < n_idx; q++)
    if (idx[q] < 0 || idx[q] >= I)
      return mok_error(l, mokInvalidArgument, "%s: idx[%d] = %d is not in [0, inter=%d)", fn, q, idx[q], I);
  if (!d_w_gate_rows || !d_w_up_rows || !d_w_down_cols)
    return mok_error(l, mokInvalidArgument, "%s: the three outputs must not be NULL", fn);
  /* float64 copies of what the sample reads: every rank's x, router weights and d_out,
   * and this expert's three weights */
  int ok = 1;
  widened W;
  memset(&W, 0, sizeof W);
  size_t pn = sizeof(void *) * (size_t)N;
  int *tokens = malloc(sizeof(int) * (size_t)N);
  const int32_t **idxs = malloc(pn);
  const double **x = malloc(pn), **w = malloc(pn), **dout = malloc(pn);
  ok = tokens && idxs && x && w && dout;
  for (int s = 0; ok && s < N; s++) {
    static const mokBf16 none = 0;
    int T = in[s].num_tokens;
    tokens[s] = T;
    idxs[s] = in[s].topk_idx;
    x[s] = wd_bf16(&W, T ? in[s].x : &none, (size_t)T * H, &ok);
    dout[s] = wd_bf16(&W, T ? d_out[s] : &none, (size_t)T * H, &ok);
    double *wv = ok ? wd_alloc(&W, (size_t)T * k) : NULL;
    ok = ok && wv;
    for (int64_t q = 0; ok && q < (int64_t)T * k; q++) wv[q] = in[s].topk_w[q];
    w[s] = wv;
  }
  const double *wg = ok ? wd_bf16(&W, w_gate, (size_t)I * H, &ok) : NULL;
  const double *wu = ok ? wd_bf16(&W, w_up, (size_t)I * H, &ok) : NULL;
  const double *wdn = ok ? wd_bf16(&W, w_down, (size_t)H * I, &ok) : NULL;
  mokResult_t rc = mokSuccess;
  if (!ok) {
    rc = mok_error(l, mokOutOfMemory, "%s: out of host memory", fn);
  } else {
    ref_problem p = {c, 1, tokens, idxs, x, w, NULL, NULL, NULL, NULL, NULL, NULL};
    ref_expert_grad_sample(&p, expert, wg, wu, wdn, dout, n_idx, idx, d_w_gate_rows, d_w_up_rows, d_w_down_cols);
  }
  for (int i = 0; i < W.nmem; i++) free(W.mem[i]);
  free(W.mem);
  free(tokens); free(idxs); free(x); free(w); free(dout);
  return rc;
}
