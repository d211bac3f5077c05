/*
 * gemm_check.h — float64 host reference of one row (or one weight row) of each grouped
 * GEMM kind, shared by tests/test_gemm.cu and tools/bench_gemm.cu. Inputs are the bf16
 * tensors the GPU read (host copies); the math is float64, with the SwiGLU of
 * include/mok.h (clamp L, 0 = off). Internal, host only, C11-compatible.
 */
#ifndef MOK_GEMM_CHECK_H
#define MOK_GEMM_CHECK_H

#include <math.h>
#include <stdint.h>

#include "bf16.h" /* defines: mok_bf16_to_f32 */

/* Running ||got - ref||^2 and ||ref||^2 of one tensor; NaN in got poisons it. */
typedef struct mokGemmErr {
  double diff2, ref2;
  int64_t nan;
} mokGemmErr_t;

static inline void mok_gemm_err_add(mokGemmErr_t *e, double got, double ref) {
  if (isinf(got) && got == ref) return; /* a clamped value saved as +-inf, as expected */
  if (isnan(got) || isinf(got)) e->nan++;
  else e->diff2 += (got - ref) * (got - ref);
  e->ref2 += ref * ref;
}
/* Relative L2 error; +inf when any element was NaN/inf or the reference is zero but
 * got is not. */
static inline double mok_gemm_err_rel(const mokGemmErr_t *e) {
  if (e->nan) return INFINITY;
  if (e->ref2 == 0.0) return e->diff2 == 0.0 ? 0.0 : INFINITY;
  return sqrt(e->diff2 / e->ref2);
}

#define MOK_B2D(v) ((double)mok_bf16_to_f32(v))

static inline double mok_ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* dot of a bf16 row with a bf16 row */
static inline double mok_ref_dot(const uint16_t *a, const uint16_t *b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += MOK_B2D(a[i]) * MOK_B2D(b[i]);
  return s;
}

/* Forward gate+up of one row: g, u as saved (unrounded; +-inf where the clamp cut them,
 * include/mok.h), a = silu(gc) * uc. wg, wu: [I, H]. */
static inline void mok_ref_gateup_row(const uint16_t *x, const uint16_t *wg, const uint16_t *wu, int H, int I,
                                      double L, double *g, double *u, double *a) {
  for (int i = 0; i < I; ++i) {
    const double gv = mok_ref_dot(x, wg + (int64_t)i * H, H), uv = mok_ref_dot(x, wu + (int64_t)i * H, H);
    double gc = gv, uc = uv;
    if (L > 0) {
      gc = gv < L ? gv : L;
      uc = uv < -L ? -L : (uv > L ? L : uv);
    }
    g[i] = L > 0 && gv > L ? INFINITY : gv;
    u[i] = L > 0 && uv > L ? INFINITY : L > 0 && uv < -L ? -INFINITY : uv;
    a[i] = gc * mok_ref_sigmoid(gc) * uc;
  }
}

/* A clamp decided on the two sides (one of got, ref is a clamp's +-inf marker, the other
 * not) for a value within rounding of the limit: the GPU's fp32 sums and the float64
 * reference may decide a value that close to L either way, and both are right (the clamp
 * is a step; what follows uses the GPU's saved g, u). x: the row, w: the weight row of the
 * value (gate or up). Callers skip such elements and bound how many they skip. */
static inline int mok_clamp_boundary(double got, double ref, const uint16_t *x, const uint16_t *w, int H, double L) {
  if (L <= 0 || (isinf(got) != 0) == (isinf(ref) != 0)) return 0;
  return fabs(fabs(mok_ref_dot(x, w, H)) - L) <= 1e-5 * L;
}

/* y = act W_down^T for one row. wd: [H, I]. */
static inline void mok_ref_down_row(const uint16_t *act, const uint16_t *wd, int H, int I, double *y) {
  for (int h = 0; h < H; ++h) y[h] = mok_ref_dot(act, wd + (int64_t)h * I, I);
}

/* da = dy W_down, then the SwiGLU backward with the saved bf16 g, u (gu row [2I]). */
static inline void mok_ref_down_dgrad_row(const uint16_t *dy, const uint16_t *wd, const uint16_t *gu, int H, int I,
                                          double L, double *dg, double *du) {
  for (int i = 0; i < I; ++i) {
    double da = 0.0;
    for (int h = 0; h < H; ++h) da += MOK_B2D(dy[h]) * MOK_B2D(wd[(int64_t)h * I + i]);
    const double g = MOK_B2D(gu[i]), u = MOK_B2D(gu[I + i]);
    double gc = g, uc = u, gm = 1.0, um = 1.0;
    if (L > 0) {
      if (isinf(g)) { gc = L; gm = 0.0; }
      if (isinf(u)) { uc = u < 0 ? -L : L; um = 0.0; }
    }
    const double s = mok_ref_sigmoid(gc);
    dg[i] = da * uc * s * (1.0 + gc * (1.0 - s)) * gm;
    du[i] = da * gc * s * um;
  }
}

/* dx = dg W_gate + du W_up for one row (dgu row [2I]); wg, wu: [I, H]. */
static inline void mok_ref_gateup_dgrad_row(const uint16_t *dgu, const uint16_t *wg, const uint16_t *wu, int H,
                                            int I, double *dx) {
  for (int h = 0; h < H; ++h) dx[h] = 0.0;
  for (int i = 0; i < I; ++i) {
    const double dg = MOK_B2D(dgu[i]), du = MOK_B2D(dgu[I + i]);
    const uint16_t *rg = wg + (int64_t)i * H, *ru = wu + (int64_t)i * H;
    for (int h = 0; h < H; ++h) dx[h] += dg * MOK_B2D(rg[h]) + du * MOK_B2D(ru[h]);
  }
}

/* One weight-gradient row: out[n] = sum over rows r of A[r, m] * B[r, n], for the rows of
 * one expert (a: rows x lda, b: rows x N, both host copies of that expert's rows). */
static inline void mok_ref_wgrad_row(const uint16_t *a, int64_t lda, int m, const uint16_t *b, int N, int64_t rows,
                                     double *out) {
  for (int n = 0; n < N; ++n) out[n] = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const double av = MOK_B2D(a[r * lda + m]);
    if (av == 0.0) continue;
    const uint16_t *br = b + r * N;
    for (int n = 0; n < N; ++n) out[n] += av * MOK_B2D(br[n]);
  }
}

#endif /* MOK_GEMM_CHECK_H */
