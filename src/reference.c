/*
 * reference.c — the float64 CPU reference of the expert-parallel MoE layer
 * (DESIGN.md sections 2 and 2a) over N simulated ranks, and the public
 * mokReference* entry points that wrap it for bf16 host tensors.
 *
 * It follows the GPU's data flow, not just the math: each expert-owning rank builds
 * the shared schedule (schedule.h), processes its rows in schedule order, and the
 * source ranks combine in the fixed order shared, j = 0..k-1. With `round` on, values
 * are rounded to bf16 exactly where the GPU stores bf16 (listed in mok.h).
 */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "schedule.h"

#define RND(p, v) ((p)->round ? mok_round_bf16(v) : (v))

static double sigmoid(double g) { return 1.0 / (1.0 + exp(-g)); }

static double dot(const double *a, const double *b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* ---- schedule ------------------------------------------------------------------- */
mokResult_t ref_check_routing(struct mokLayer *layer, const mokConfig_t *c, const int *tokens,
                              const int32_t *const *idx) {
  for (int s = 0; s < c->num_ranks; s++) {
    if (tokens[s] < 0 || tokens[s] > c->max_tokens)
      return mok_error(layer, mokInvalidArgument, "rank %d: num_tokens is %d, it must be in [0, max_tokens=%d]",
                       s, tokens[s], c->max_tokens);
    if (tokens[s] > 0 && !idx[s])
      return mok_error(layer, mokInvalidArgument, "rank %d: topk_idx is NULL", s);
    for (int64_t q = 0; q < (int64_t)tokens[s] * c->topk; q++) {
      int32_t e = idx[s][q];
      if (e < -1 || e >= c->num_experts)
        return mok_error(layer, mokInvalidArgument,
                         "rank %d: topk_idx[%lld, %lld] = %d is not an expert id in [0, %d) or -1", s,
                         (long long)(q / c->topk), (long long)(q % c->topk), (int)e, c->num_experts);
    }
  }
  return mokSuccess;
}

void ref_schedule_build(const mokConfig_t *c, int rank, const int *tokens, const int32_t *const *idx,
                        ref_schedule *sc) {
  const int N = c->num_ranks, El = c->num_experts / N, k = c->topk;
  const int32_t lo = rank * El;
  memset(sc->count, 0, sizeof(int32_t) * (size_t)El);
  if (sc->src_count) memset(sc->src_count, 0, sizeof(int32_t) * (size_t)N * El);
  for (int s = 0; s < N; s++)
    for (int64_t q = 0; q < (int64_t)tokens[s] * k; q++) {
      int32_t e = idx[s][q] - lo;
      if (idx[s][q] < 0 || e < 0 || e >= El) continue;
      sc->count[e]++;
      if (sc->src_count) sc->src_count[(size_t)s * El + e]++;
    }
  sc->offset[0] = 0;
  for (int e = 0; e < El; e++) sc->offset[e + 1] = sc->offset[e] + mok_segment_rows(sc->count[e], c->row_pad);
  if (!sc->row_route) return;
  /* One cursor per expert, visiting routes in (s, t, j) order: that order is the schedule. */
  int32_t *cursor = malloc(sizeof(int32_t) * (size_t)(El ? El : 1));
  if (!cursor) return; /* callers allocate enough to make this unreachable in practice */
  for (int e = 0; e < El; e++) cursor[e] = sc->offset[e];
  for (int s = 0; s < N; s++)
    for (int t = 0; t < tokens[s]; t++)
      for (int j = 0; j < k; j++) {
        int32_t g = idx[s][(int64_t)t * k + j];
        int32_t e = g - lo;
        if (g < 0 || e < 0 || e >= El) continue;
        sc->row_route[cursor[e]++] = mok_route_id(s, t, j, c->max_tokens, k);
      }
  for (int e = 0; e < El; e++)
    for (int32_t q = sc->offset[e] + sc->count[e]; q < sc->offset[e + 1]; q++) sc->row_route[q] = -1;
  free(cursor);
}

/* ---- forward state ---------------------------------------------------------------- */
typedef struct {
  ref_schedule s;
  int32_t rows;       /* rows in use (padded) */
  double *g, *u;      /* [rows, I] pre-activation, as saved for the backward (bf16 when rounding) */
  double *a;          /* [rows, I] */
  double *y;          /* [rows, H] */
} rank_state;

typedef struct {
  int N;
  rank_state *rk;
  int32_t **route_row; /* [N] -> [T_r * k]: row on the owner rank, or -1 for an empty slot */
} fwd_state;

static void fwd_free(fwd_state *st) {
  if (!st->rk) return;
  for (int r = 0; r < st->N; r++) {
    rank_state *R = &st->rk[r];
    free(R->s.count); free(R->s.offset); free(R->s.src_count); free(R->s.row_route);
    free(R->g); free(R->u); free(R->a); free(R->y);
    if (st->route_row) free(st->route_row[r]);
  }
  free(st->rk);
  free(st->route_row);
  st->rk = NULL;
}

static mokResult_t oom(void) { return mok_error(NULL, mokOutOfMemory, "CPU reference: out of host memory"); }

/* The saved forward context of one g or u value: bf16 (when rounding), except that a
 * value the clamp cut is saved as +-inf, so the backward's clamp mask is exactly the
 * forward's (a bf16 value near L could otherwise round across L and flip the mask). */
static double save_g(const ref_problem *p, double g) {
  double L = p->cfg->swiglu_limit;
  return L > 0 && g > L ? INFINITY : RND(p, g);
}
static double save_u(const ref_problem *p, double u) {
  double L = p->cfg->swiglu_limit;
  if (L > 0 && u > L) return INFINITY;
  if (L > 0 && u < -L) return -INFINITY;
  return RND(p, u);
}

/* SwiGLU of one row, with the optional clamp. */
static double swiglu(double g, double u, double L) {
  if (L > 0) {
    g = g < L ? g : L;
    u = u < -L ? -L : (u > L ? L : u);
  }
  return g * sigmoid(g) * u;
}

/* Runs the routed experts of every rank over its schedule; fills st. */
static mokResult_t fwd_routed(const ref_problem *p, fwd_state *st, double *const *gx) {
  const mokConfig_t *c = p->cfg;
  const int N = c->num_ranks, El = c->num_experts / N, H = c->hidden, I = c->inter, k = c->topk;
  const double L = c->swiglu_limit;
  st->N = N;
  st->rk = calloc((size_t)N, sizeof(rank_state));
  st->route_row = calloc((size_t)N, sizeof(int32_t *));
  if (!st->rk || !st->route_row) return oom();
  for (int s = 0; s < N; s++) {
    st->route_row[s] = malloc(sizeof(int32_t) * ((size_t)p->tokens[s] * k + 1));
    if (!st->route_row[s]) return oom();
    for (int64_t q = 0; q < (int64_t)p->tokens[s] * k; q++) st->route_row[s][q] = -1;
  }
  double *gtmp = malloc(sizeof(double) * (size_t)I);
  if (!gtmp) return oom();
  for (int r = 0; r < N; r++) {
    rank_state *R = &st->rk[r];
    R->s.count = malloc(sizeof(int32_t) * (size_t)(El + 1));
    R->s.offset = malloc(sizeof(int32_t) * (size_t)(El + 1));
    if (!R->s.count || !R->s.offset) { free(gtmp); return oom(); }
    ref_schedule_build(c, r, p->tokens, p->idx, &R->s); /* counts and offsets */
    R->rows = R->s.offset[El];
    size_t rows = (size_t)R->rows + 1;
    R->s.row_route = malloc(sizeof(int32_t) * rows);
    R->g = calloc(rows * I, sizeof(double));
    R->u = calloc(rows * I, sizeof(double));
    R->a = calloc(rows * I, sizeof(double));
    R->y = calloc(rows * H, sizeof(double));
    if (!R->s.row_route || !R->g || !R->u || !R->a || !R->y) { free(gtmp); return oom(); }
    ref_schedule_build(c, r, p->tokens, p->idx, &R->s);
    for (int e = 0; e < El; e++) {
      const double *Wg = p->wg[r] + (size_t)e * I * H, *Wu = p->wu[r] + (size_t)e * I * H;
      const double *Wd = p->wd[r] + (size_t)e * H * I;
      for (int32_t q = R->s.offset[e]; q < R->s.offset[e] + R->s.count[e]; q++) {
        int s, t, j;
        mok_route_decode(R->s.row_route[q], c->max_tokens, k, &s, &t, &j);
        st->route_row[s][(int64_t)t * k + j] = q;
        const double *xt = p->x[s] + (size_t)t * H;
        if (gx && gx[r]) memcpy(gx[r] + (size_t)q * H, xt, sizeof(double) * H);
        double *aq = R->a + (size_t)q * I;
        for (int i = 0; i < I; i++) {
          double g = dot(Wg + (size_t)i * H, xt, H), u = dot(Wu + (size_t)i * H, xt, H);
          aq[i] = RND(p, swiglu(g, u, L));
          R->g[(size_t)q * I + i] = save_g(p, g);
          R->u[(size_t)q * I + i] = save_u(p, u);
        }
        double *yq = R->y + (size_t)q * H;
        for (int h = 0; h < H; h++) yq[h] = RND(p, dot(Wd + (size_t)h * I, aq, I));
      }
    }
  }
  free(gtmp);
  return mokSuccess;
}

/* Shared expert of one token: g, u, a (length I_s) and y (length H). */
static void shared_token(const ref_problem *p, int s, const double *xt, double *g, double *u, double *a,
                         double *y) {
  const mokConfig_t *c = p->cfg;
  const int H = c->hidden, Is = c->shared_inter;
  for (int i = 0; i < Is; i++) {
    g[i] = dot(p->sg[s] + (size_t)i * H, xt, H);
    u[i] = dot(p->su[s] + (size_t)i * H, xt, H);
    a[i] = RND(p, swiglu(g[i], u[i], c->swiglu_limit));
    g[i] = save_g(p, g[i]);
    u[i] = save_u(p, u[i]);
  }
  for (int h = 0; h < H; h++) y[h] = RND(p, dot(p->sd[s] + (size_t)h * Is, a, Is));
}

mokResult_t ref_forward(const ref_problem *p, double *const *out, double *const *gx, double *const *act,
                        double *const *y, double *const *shared) {
  const mokConfig_t *c = p->cfg;
  const int N = c->num_ranks, H = c->hidden, I = c->inter, Is = c->shared_inter, k = c->topk;
  fwd_state st = {0};
  mokResult_t rc = fwd_routed(p, &st, gx);
  if (rc != mokSuccess) { fwd_free(&st); return rc; }
  for (int r = 0; r < N; r++) {
    if (act && act[r]) memcpy(act[r], st.rk[r].a, sizeof(double) * (size_t)st.rk[r].rows * I);
    if (y && y[r]) memcpy(y[r], st.rk[r].y, sizeof(double) * (size_t)st.rk[r].rows * H);
  }
  double *buf = malloc(sizeof(double) * ((size_t)3 * (Is ? Is : 1) + 2 * (size_t)H));
  if (!buf) { fwd_free(&st); return oom(); }
  double *g = buf, *u = g + (Is ? Is : 1), *a = u + (Is ? Is : 1), *ys = a + (Is ? Is : 1), *acc = ys + H;
  for (int s = 0; s < N; s++)
    for (int t = 0; t < p->tokens[s]; t++) {
      const double *xt = p->x[s] + (size_t)t * H;
      if (Is) {
        shared_token(p, s, xt, g, u, a, ys);
        memcpy(acc, ys, sizeof(double) * H);
        if (shared && shared[s]) memcpy(shared[s] + (size_t)t * H, ys, sizeof(double) * H);
      } else {
        memset(acc, 0, sizeof(double) * H);
      }
      for (int j = 0; j < k; j++) { /* fixed order: shared, then j = 0..k-1 */
        int32_t q = st.route_row[s][(int64_t)t * k + j];
        if (q < 0) continue;
        int owner = mok_expert_owner(p->idx[s][(int64_t)t * k + j], c->num_experts / N);
        const double *yq = st.rk[owner].y + (size_t)q * H;
        double wt = p->w[s][(int64_t)t * k + j];
        for (int h = 0; h < H; h++) acc[h] += wt * yq[h];
      }
      for (int h = 0; h < H; h++) out[s][(size_t)t * H + h] = RND(p, acc[h]);
    }
  free(buf);
  fwd_free(&st);
  return mokSuccess;
}

/* SwiGLU backward of one element: given da and the saved g, u (+-inf where the clamp
 * cut them, see save_g), returns dg and du. */
static void swiglu_bwd(double da, double g, double u, double L, double *dg, double *du) {
  double gm = 1.0, um = 1.0;
  if (isinf(g)) { g = L; gm = 0.0; }
  if (isinf(u)) { u = u > 0 ? L : -L; um = 0.0; }
  double sg = sigmoid(g);
  *dg = gm * da * u * sg * (1.0 + g * (1.0 - sg));
  *du = um * da * g * sg;
}

mokResult_t ref_backward(const ref_problem *p, const double *const *dout, double *const *dx, double *const *dw,
                         double *const *dwg, double *const *dwu, double *const *dwd, double *const *dsg,
                         double *const *dsu, double *const *dsd) {
  const mokConfig_t *c = p->cfg;
  const int N = c->num_ranks, El = c->num_experts / N, H = c->hidden, I = c->inter, Is = c->shared_inter,
            k = c->topk;
  const double L = c->swiglu_limit;
  fwd_state st = {0};
  mokResult_t rc = fwd_routed(p, &st, NULL);
  if (rc != mokSuccess) { fwd_free(&st); return rc; }
  size_t wmax = (size_t)(I > Is ? I : Is);
  double **dxp = calloc((size_t)N, sizeof(double *)); /* routed d_x partial per route */
  double *buf = malloc(sizeof(double) * (6 * wmax + 2 * (size_t)H));
  int ok = dxp && buf;
  for (int s = 0; ok && s < N; s++) ok = (dxp[s] = calloc((size_t)p->tokens[s] * k * H + 1, sizeof(double))) != NULL;
  if (!ok) {
    if (dxp) for (int s = 0; s < N; s++) free(dxp[s]);
    free(dxp); free(buf); fwd_free(&st);
    return oom();
  }
  double *da = buf, *dg = da + wmax, *du = dg + wmax, *g = du + wmax, *u = g + wmax, *a = u + wmax;
  double *dy = a + wmax, *tmp = dy + H;
  for (int r = 0; r < N; r++) {
    memset(dwg[r], 0, sizeof(double) * (size_t)El * I * H);
    memset(dwu[r], 0, sizeof(double) * (size_t)El * I * H);
    memset(dwd[r], 0, sizeof(double) * (size_t)El * H * I);
  }
  /* d_topk_w from the stored (bf16) expert outputs. */
  for (int s = 0; s < N; s++)
    for (int64_t q = 0; q < (int64_t)p->tokens[s] * k; q++) {
      int32_t row = st.route_row[s][q];
      dw[s][q] = 0.0;
      if (row < 0) continue;
      int owner = mok_expert_owner(p->idx[s][q], El);
      dw[s][q] = dot(dout[s] + (size_t)(q / k) * H, st.rk[owner].y + (size_t)row * H, H);
    }
  /* Routed experts, row by row in schedule order on each owner rank. */
  for (int r = 0; r < N; r++) {
    rank_state *R = &st.rk[r];
    for (int e = 0; e < El; e++) {
      const double *Wg = p->wg[r] + (size_t)e * I * H, *Wu = p->wu[r] + (size_t)e * I * H;
      const double *Wd = p->wd[r] + (size_t)e * H * I;
      double *dWg = dwg[r] + (size_t)e * I * H, *dWu = dwu[r] + (size_t)e * I * H, *dWd = dwd[r] + (size_t)e * H * I;
      for (int32_t q = R->s.offset[e]; q < R->s.offset[e] + R->s.count[e]; q++) {
        int s, t, j;
        mok_route_decode(R->s.row_route[q], c->max_tokens, k, &s, &t, &j);
        const double *xt = p->x[s] + (size_t)t * H, *dot_ = dout[s] + (size_t)t * H;
        const double wt = p->w[s][(int64_t)t * k + j];
        const double *aq = R->a + (size_t)q * I;
        for (int h = 0; h < H; h++) dy[h] = RND(p, wt * dot_[h]);
        memset(da, 0, sizeof(double) * I);
        for (int h = 0; h < H; h++) {
          const double *wrow = Wd + (size_t)h * I;
          double *drow = dWd + (size_t)h * I;
          for (int i = 0; i < I; i++) { da[i] += wrow[i] * dy[h]; drow[i] += dy[h] * aq[i]; }
        }
        for (int i = 0; i < I; i++) {
          swiglu_bwd(da[i], R->g[(size_t)q * I + i], R->u[(size_t)q * I + i], L, &dg[i], &du[i]);
          dg[i] = RND(p, dg[i]);
          du[i] = RND(p, du[i]);
        }
        memset(tmp, 0, sizeof(double) * H);
        for (int i = 0; i < I; i++) {
          const double *gr = Wg + (size_t)i * H, *ur = Wu + (size_t)i * H;
          double *dgr = dWg + (size_t)i * H, *dur = dWu + (size_t)i * H;
          for (int h = 0; h < H; h++) {
            tmp[h] += gr[h] * dg[i] + ur[h] * du[i];
            dgr[h] += dg[i] * xt[h];
            dur[h] += du[i] * xt[h];
          }
        }
        double *part = dxp[s] + ((size_t)t * k + j) * H;
        for (int h = 0; h < H; h++) part[h] = RND(p, tmp[h]);
      }
    }
  }
  /* Shared expert, then d_x = shared + sum_j partial_j in fixed order. */
  for (int s = 0; s < N; s++) {
    if (Is) {
      memset(dsg[s], 0, sizeof(double) * (size_t)Is * H);
      memset(dsu[s], 0, sizeof(double) * (size_t)Is * H);
      memset(dsd[s], 0, sizeof(double) * (size_t)H * Is);
    }
    for (int t = 0; t < p->tokens[s]; t++) {
      const double *xt = p->x[s] + (size_t)t * H, *dot_ = dout[s] + (size_t)t * H;
      memset(tmp, 0, sizeof(double) * H);
      if (Is) {
        shared_token(p, s, xt, g, u, a, dy /* scratch: shared y, unused */);
        memset(da, 0, sizeof(double) * Is);
        for (int h = 0; h < H; h++) {
          const double *wrow = p->sd[s] + (size_t)h * Is;
          double *drow = dsd[s] + (size_t)h * Is;
          for (int i = 0; i < Is; i++) { da[i] += wrow[i] * dot_[h]; drow[i] += dot_[h] * a[i]; }
        }
        for (int i = 0; i < Is; i++) {
          swiglu_bwd(da[i], g[i], u[i], L, &dg[i], &du[i]);
          dg[i] = RND(p, dg[i]);
          du[i] = RND(p, du[i]);
        }
        for (int i = 0; i < Is; i++) {
          const double *gr = p->sg[s] + (size_t)i * H, *ur = p->su[s] + (size_t)i * H;
          double *dgr = dsg[s] + (size_t)i * H, *dur = dsu[s] + (size_t)i * H;
          for (int h = 0; h < H; h++) {
            tmp[h] += gr[h] * dg[i] + ur[h] * du[i];
            dgr[h] += dg[i] * xt[h];
            dur[h] += du[i] * xt[h];
          }
        }
      }
      for (int j = 0; j < k; j++) {
        if (st.route_row[s][(int64_t)t * k + j] < 0) continue;
        const double *part = dxp[s] + ((size_t)t * k + j) * H;
        for (int h = 0; h < H; h++) tmp[h] += part[h];
      }
      for (int h = 0; h < H; h++) dx[s][(size_t)t * H + h] = RND(p, tmp[h]);
    }
  }
  for (int s = 0; s < N; s++) free(dxp[s]);
  free(dxp);
  free(buf);
  fwd_free(&st);
  return mokSuccess;
}

/* ---- sampled weight gradients of one expert ------------------------------------------ */
/* For large shapes: selected rows i of dW_gate and dW_up and columns i of dW_down of one
 * routed expert, from that expert's weights alone. Per route of the expert (any order:
 * float64 sums), with the rounding points of the full backward:
 *   g_i, u_i = W_gate[i] x, W_up[i] x (saved as bf16, +-inf where clamped); a_i = bf16(SwiGLU)
 *   dy = bf16(w d_out); da_i = sum_h W_down[h, i] dy[h]; dg_i, du_i = bf16(SwiGLU backward)
 *   dW_gate[i, :] += dg_i x; dW_up[i, :] += du_i x; dW_down[:, i] += dy a_i */
void ref_expert_grad_sample(const ref_problem *p, int expert, const double *wg, const double *wu, const double *wd,
                            const double *const *dout, int n_idx, const int *idx, double *dwg, double *dwu,
                            double *dwd) {
  const mokConfig_t *c = p->cfg;
  const int N = c->num_ranks, H = c->hidden, I = c->inter, k = c->topk;
  const double L = c->swiglu_limit;
  memset(dwg, 0, sizeof(double) * (size_t)n_idx * H);
  memset(dwu, 0, sizeof(double) * (size_t)n_idx * H);
  memset(dwd, 0, sizeof(double) * (size_t)n_idx * H);
  double *dy = malloc(sizeof(double) * (size_t)H);
  if (!dy) return;
  for (int s = 0; s < N; s++)
    for (int t = 0; t < p->tokens[s]; t++)
      for (int j = 0; j < k; j++) {
        if (p->idx[s][(int64_t)t * k + j] != expert) continue;
        const double *xt = p->x[s] + (size_t)t * H, *dt = dout[s] + (size_t)t * H;
        const double wt = p->w[s][(int64_t)t * k + j];
        for (int h = 0; h < H; h++) dy[h] = RND(p, wt * dt[h]);
        for (int q = 0; q < n_idx; q++) {
          const int i = idx[q];
          double g = dot(wg + (size_t)i * H, xt, H), u = dot(wu + (size_t)i * H, xt, H);
          double a = RND(p, swiglu(g, u, L)), da = 0.0, dg, du;
          for (int h = 0; h < H; h++) da += wd[(size_t)h * I + i] * dy[h];
          swiglu_bwd(da, save_g(p, g), save_u(p, u), L, &dg, &du);
          dg = RND(p, dg);
          du = RND(p, du);
          double *rg = dwg + (size_t)q * H, *ru = dwu + (size_t)q * H, *rd = dwd + (size_t)q * H;
          for (int h = 0; h < H; h++) rg[h] += dg * xt[h], ru[h] += du * xt[h], rd[h] += dy[h] * a;
        }
      }
  free(dy);
}
