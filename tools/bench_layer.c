/*
 * bench_layer.c — `mok bench layer`: time the whole MoE layer on all local GPUs (one
 * rank per GPU, one process) and check it in float64 on sampled tokens.
 *
 *   mok bench layer [--impl baseline] [--model A,B,..] [--tokens T1,T2,..] [--gpus N]
 *                   [--routing uniform|zipf:S|hot:E] [--iters 20] [--warmup 3]
 *                   [--check-tokens 2] [--seed S] [--json FILE]
 *
 * Formulas (DESIGN.md section 6, GPU.md "Measuring"), per rank:
 *   forward FLOPs  = 6 T (k H I + H I_s); backward = 2 x forward (recompute not counted)
 *   TFLOP/s        = FLOPs / time; time = median of `iters` timed passes (CUDA events,
 *                    after `warmup` passes), the slowest rank's median
 *   floor (fwd)    = max(FLOPs / 790 TFLOP/s, HBM bytes / 3.9 TB/s, NVLink bytes / 336 GB/s)
 *                    HBM bytes = 3 E_l H I 2 (every local expert's weights once) + 3 I_s H 2
 *                              + 8 T k H 2 (rows dispatched, gathered, returned, combined)
 *                    NVLink bytes = 2 T k (N-1)/N H 2 (dispatch + combine leaving this GPU)
 *   check          = relative L2 error of out, d_x and d_topk_w on `check-tokens` sampled
 *                    tokens per rank against the float64 reference (mokReference* on a
 *                    one-token problem with that token's experts), and (check-experts > 0)
 *                    of 3 rows of dW_gate and dW_up and 3 columns of dW_down of the most-
 *                    loaded local expert of every rank (mokReferenceExpertGrads); the
 *                    largest of the four must be < 1e-2.
 * Uses only the public API. Exit code 1 when a check fails.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "mok.h"
#include "internal.h" /* mok_error: the bench's own failures get a message */

#define MAXG 8

typedef struct {
  mokConfig_t cfg;
  int N, T, iters, warmup, check_tokens, check_experts;
  uint64_t seed;
  mokRouting_t routing;
  mokImpl_t impl;
  /* per rank */
  mokLayer_t layer[MAXG];
  mokRankInput_t in[MAXG];
  mokRankWeights_t w[MAXG];
  mokRankGrads_t g[MAXG];
  mokBf16 *out[MAXG], *dout[MAXG];
  int32_t *h_idx[MAXG];
  float *h_w[MAXG];
  float fwd_ms[MAXG], fb_ms[MAXG];
  double err_num[4], err_den[4]; /* out, d_x, d_topk_w, sampled dW */
  pthread_mutex_t mu;
  char fail[512];
} bench_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

#define TRY(call)                                                       \
  do {                                                                  \
    mokResult_t r_ = (call);                                            \
    if (r_ != mokSuccess) return r_;                                    \
  } while (0)
#define CUDA_TRY(call)                                                                              \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess)                                                                          \
      return mok_error(NULL, mokCudaError, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,      \
                       cudaGetErrorString(e_));                                                     \
  } while (0)

/* cudaMalloc of the bench's own buffers; on failure a message with the size and the free
 * memory (a model whose experts do not fit one GPU: more GPUs or fewer tokens). */
static mokResult_t bench_alloc(void **ptr, size_t bytes, const char *what, int N) {
  const cudaError_t e = cudaMalloc(ptr, bytes);
  if (e == cudaSuccess) return mokSuccess;
  *ptr = NULL;
  cudaGetLastError();
  size_t fr = 0, tot = 0;
  cudaMemGetInfo(&fr, &tot);
  return mok_error(NULL, e == cudaErrorMemoryAllocation ? mokOutOfMemory : mokCudaError,
                   "cudaMalloc of %s (%.2f GiB) failed: %s (%.2f of %.2f GiB free); the weights, their "
                   "gradients and the tokens are split over the ranks: more GPUs (--gpus, now %d) or fewer tokens",
                   what, (double)bytes / (1 << 30), cudaGetErrorString(e), (double)fr / (1 << 30),
                   (double)tot / (1 << 30), N);
}

static mokResult_t rank_setup(mokComm_t comm, int r, void *arg) {
  bench_t *b = arg;
  const mokConfig_t *c = &b->cfg;
  const int64_t H = c->hidden, I = c->inter, Is = c->shared_inter, k = c->topk, T = b->T, El = c->num_experts / b->N;
  const float sh = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I), ss = Is ? 1.0f / sqrtf((float)Is) : 0.f;
  void *p[12] = {0};
  size_t bytes[12] = {2 * T * H, 4 * T * k, 4 * T * k, 2 * El * I * H, 2 * El * I * H, 2 * El * H * I,
                      2 * Is * H, 2 * Is * H, 2 * H * Is, 2 * T * H, 2 * T * H, 0};
  static const char *pname[12] = {"x", "topk_idx", "topk_w", "w_gate and w_up", "", "w_down", "s_gate and s_up", "",
                                  "s_down", "out", "d_out", ""};
  size_t gs = c->grad_dtype == mokDtypeBF16 ? 2 : 4;
  void *q[8] = {0};
  size_t gb[8] = {2 * T * H, 4 * T * k, gs * El * I * H, gs * El * I * H, gs * El * H * I, gs * Is * H, gs * Is * H,
                  gs * H * Is};
  static const char *qname[8] = {"d_x", "d_topk_w", "d_w_gate", "d_w_up", "d_w_down", "d_s_gate", "d_s_up",
                                 "d_s_down"};
  /* W_gate and W_up in one block, W_up right after W_gate (mok.h: one TMA box a stage), and
   * so s_gate and s_up (mokImplMega then runs the shared expert as tiles of its launch);
   * every buffer lands in b as soon as it exists, so that rank_free frees what a failed
   * setup left (the bench goes on with the next model) */
  mokResult_t rc = mokSuccess;
  for (int i = 0; i < 11 && rc == mokSuccess; i++)
    if (i != 4 && i != 7 && !(Is == 0 && i >= 6 && i <= 8))
      rc = bench_alloc(&p[i], (i == 3 || i == 6 ? bytes[i] + bytes[i + 1] : bytes[i]) + 16, pname[i], b->N);
  if (p[3]) p[4] = (char *)p[3] + bytes[3];
  if (p[6]) p[7] = (char *)p[6] + bytes[6];
  b->in[r] = (mokRankInput_t){(int)T, p[0], p[1], p[2]};
  b->w[r] = (mokRankWeights_t){p[3], p[4], p[5], p[6], p[7], p[8]};
  b->out[r] = p[9];
  b->dout[r] = p[10];
  for (int i = 0; i < 8 && rc == mokSuccess; i++)
    if (!(Is == 0 && i >= 5)) rc = bench_alloc(&q[i], gb[i] ? gb[i] : 16, qname[i], b->N);
  b->g[r] = (mokRankGrads_t){q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], 0};
  if (rc != mokSuccess) return rc;
  /* data: the same generator as mokGenerateRankData, on the device */
  TRY(mokGenerateBf16Device(b->seed, mokTensorX, r, 0, T * H, 1.0f, p[0], NULL));
  TRY(mokGenerateBf16Device(b->seed, mokTensorDOut, r, 0, T * H, 1.0f, p[10], NULL));
  for (int64_t e = 0; e < El; e++) {
    int64_t ge = r * El + e;
    TRY(mokGenerateBf16Device(b->seed, mokTensorWGate, ge, 0, I * H, sh, (mokBf16 *)p[3] + e * I * H, NULL));
    TRY(mokGenerateBf16Device(b->seed, mokTensorWUp, ge, 0, I * H, sh, (mokBf16 *)p[4] + e * I * H, NULL));
    TRY(mokGenerateBf16Device(b->seed, mokTensorWDown, ge, 0, H * I, si, (mokBf16 *)p[5] + e * H * I, NULL));
  }
  if (Is) {
    TRY(mokGenerateBf16Device(b->seed, mokTensorSGate, 0, 0, Is * H, sh, p[6], NULL));
    TRY(mokGenerateBf16Device(b->seed, mokTensorSUp, 0, 0, Is * H, sh, p[7], NULL));
    TRY(mokGenerateBf16Device(b->seed, mokTensorSDown, 0, 0, H * Is, ss, p[8], NULL));
  }
  b->h_idx[r] = malloc(4 * T * k + 4);
  b->h_w[r] = malloc(4 * T * k + 4);
  if (!b->h_idx[r] || !b->h_w[r]) return mok_error(NULL, mokOutOfMemory, "rank %d: out of host memory for the routes", r);
  TRY(mokGenerateRouting(b->seed, &b->routing, c->num_experts, (int)k, r, 0, T, b->h_idx[r], b->h_w[r]));
  CUDA_TRY(cudaMemcpy(p[1], b->h_idx[r], 4 * T * k, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(p[2], b->h_w[r], 4 * T * k, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaDeviceSynchronize());
  return mokLayerCreateOnComm(&b->layer[r], c, comm);
}

static mokResult_t rank_time(mokComm_t comm, int r, void *arg) {
  bench_t *b = arg;
  (void)comm;
  cudaStream_t st;
  CUDA_TRY(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float *ms = malloc(sizeof(float) * (size_t)b->iters);
  mokResult_t rc = mokSuccess;
  for (int pass = 0; pass < 2 && rc == mokSuccess; pass++) { /* 0: forward, 1: forward + backward */
    for (int it = -b->warmup; it < b->iters && rc == mokSuccess; it++) {
      cudaEventRecord(e0, st);
      rc = mokLayerForward(b->layer[r], b->impl, &b->in[r], &b->w[r], b->out[r], st);
      if (rc == mokSuccess && pass)
        rc = mokLayerBackward(b->layer[r], b->impl, &b->in[r], &b->w[r], b->dout[r], &b->g[r], st);
      cudaEventRecord(e1, st);
      cudaEventSynchronize(e1);
      if (it >= 0) cudaEventElapsedTime(&ms[it], e0, e1);
    }
    qsort(ms, (size_t)b->iters, sizeof(float), cmp_f);
    (pass ? b->fb_ms : b->fwd_ms)[r] = ms[b->iters / 2];
  }
  /* leave out and the gradients of one final forward + backward for the check */
  free(ms);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
  return rc;
}

static mokResult_t rank_free(mokComm_t comm, int r, void *arg) {
  bench_t *b = arg;
  (void)comm;
  mokLayerDestroy(b->layer[r]);
  void *p[] = {(void *)b->in[r].x, (void *)b->in[r].topk_idx, (void *)b->in[r].topk_w, (void *)b->w[r].w_gate,
               NULL /* w_up: in w_gate's block */, (void *)b->w[r].w_down, (void *)b->w[r].s_gate,
               NULL /* s_up: in s_gate's */,
               (void *)b->w[r].s_down, b->out[r], b->dout[r], b->g[r].d_x, b->g[r].d_topk_w, b->g[r].d_w_gate,
               b->g[r].d_w_up, b->g[r].d_w_down, b->g[r].d_s_gate, b->g[r].d_s_up, b->g[r].d_s_down};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
  free(b->h_idx[r]);
  free(b->h_w[r]);
  memset(&b->layer[r], 0, sizeof b->layer[r]);
  return mokSuccess;
}

/* ---- sampled float64 check -------------------------------------------------------- */
typedef struct {
  bench_t *b;
  int rank, token;
} check_job;

static void add_err(bench_t *b, int which, const mokBf16 *got16, const float *got32, const void *ref16,
                    const float *ref32, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double a = got16 ? mokBf16ToFloat(got16[i]) : got32[i];
    double r = ref16 ? mokBf16ToFloat(((const mokBf16 *)ref16)[i]) : ref32[i];
    num += a != a ? INFINITY : (a - r) * (a - r);
    den += r * r;
  }
  pthread_mutex_lock(&b->mu);
  b->err_num[which] += num;
  b->err_den[which] += den;
  pthread_mutex_unlock(&b->mu);
}

/* The layer restricted to one token is a one-rank layer whose experts are that token's
 * (distinct) experts, padded to k with unused ones: its reference gives the token's out,
 * d_x and d_topk_w exactly as the full layer's would. */
static void *check_token(void *arg) {
  check_job *j = arg;
  bench_t *b = j->b;
  const mokConfig_t *c = &b->cfg;
  const int H = c->hidden, I = c->inter, Is = c->shared_inter, k = c->topk, El = c->num_experts / b->N;
  const int r = j->rank, t = j->token;
  const int32_t *idx = b->h_idx[r] + (size_t)t * k;
  int32_t lidx[32];
  int distinct[32], m = 0;
  for (int q = 0; q < k; q++) {
    lidx[q] = -1;
    if (idx[q] < 0) continue;
    int f = -1;
    for (int d = 0; d < m; d++) f = distinct[d] == idx[q] ? d : f;
    if (f < 0) distinct[f = m++] = idx[q];
    lidx[q] = f;
  }
  mokConfig_t one = *c;
  one.num_ranks = 1, one.num_experts = k, one.max_tokens = 1;
  mokLayer_t l = NULL;
  size_t ew = (size_t)I * H;
  mokBf16 *wg = calloc((size_t)k * ew, 2), *wu = calloc((size_t)k * ew, 2), *wd = calloc((size_t)k * ew, 2);
  mokBf16 *sg = Is ? malloc(2 * (size_t)Is * H) : NULL, *su = Is ? malloc(2 * (size_t)Is * H) : NULL;
  mokBf16 *sd = Is ? malloc(2 * (size_t)Is * H) : NULL;
  mokBf16 *x = malloc(2 * (size_t)H), *dout = malloc(2 * (size_t)H), *gx = malloc(2 * (size_t)H);
  mokBf16 *ref_out = malloc(2 * (size_t)H), *ref_dx = malloc(2 * (size_t)H);
  mokBf16 *got_out = malloc(2 * (size_t)H);
  float wt[32], ref_dw[32], got_dw[32];
  size_t gsz = c->grad_dtype == mokDtypeBF16 ? 2 : 4;
  void *dwg = malloc(gsz * k * ew), *dwu = malloc(gsz * k * ew), *dwd = malloc(gsz * k * ew);
  void *dsg = Is ? malloc(gsz * Is * H) : NULL, *dsu = Is ? malloc(gsz * Is * H) : NULL, *dsd = Is ? malloc(gsz * Is * H) : NULL;
  int ok = wg && wu && wd && x && dout && gx && ref_out && ref_dx && got_out && dwg && dwu && dwd &&
           (!Is || (sg && su && sd && dsg && dsu && dsd)) && mokLayerCreate(&l, &one) == mokSuccess;
  const char *why = "setup";
  if (ok) {
    cudaSetDevice(r); /* rank r runs on device r (mokLocalCommsCreate with devices NULL) */
    for (int d = 0; d < m; d++) {
      int owner = distinct[d] / El, le = distinct[d] % El;
      cudaSetDevice(owner);
      cudaMemcpy(wg + d * ew, b->w[owner].w_gate + (size_t)le * ew, 2 * ew, cudaMemcpyDeviceToHost);
      cudaMemcpy(wu + d * ew, b->w[owner].w_up + (size_t)le * ew, 2 * ew, cudaMemcpyDeviceToHost);
      cudaMemcpy(wd + d * ew, b->w[owner].w_down + (size_t)le * ew, 2 * ew, cudaMemcpyDeviceToHost);
    }
    cudaSetDevice(r);
    if (Is) {
      cudaMemcpy(sg, b->w[r].s_gate, 2 * (size_t)Is * H, cudaMemcpyDeviceToHost);
      cudaMemcpy(su, b->w[r].s_up, 2 * (size_t)Is * H, cudaMemcpyDeviceToHost);
      cudaMemcpy(sd, b->w[r].s_down, 2 * (size_t)Is * H, cudaMemcpyDeviceToHost);
    }
    cudaMemcpy(x, b->in[r].x + (size_t)t * H, 2 * (size_t)H, cudaMemcpyDeviceToHost);
    cudaMemcpy(dout, b->dout[r] + (size_t)t * H, 2 * (size_t)H, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_out, b->out[r] + (size_t)t * H, 2 * (size_t)H, cudaMemcpyDeviceToHost);
    cudaMemcpy(gx, b->g[r].d_x + (size_t)t * H, 2 * (size_t)H, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_dw, b->g[r].d_topk_w + (size_t)t * k, 4 * (size_t)k, cudaMemcpyDeviceToHost);
    for (int q = 0; q < k; q++) wt[q] = b->h_w[r][(size_t)t * k + q];
    mokRankInput_t in = {1, x, lidx, wt};
    mokRankWeights_t w = {wg, wu, wd, sg, su, sd};
    mokRankGrads_t g = {ref_dx, ref_dw, dwg, dwu, dwd, dsg, dsu, dsd, 0};
    mokBf16 *outs[1] = {ref_out};
    const mokBf16 *douts[1] = {dout};
    ok = mokReferenceForward(l, &in, &w, outs, NULL) == mokSuccess &&
         mokReferenceBackward(l, &in, &w, douts, &g) == mokSuccess;
    why = mokGetLastError();
  }
  if (ok) {
    add_err(b, 0, got_out, NULL, ref_out, NULL, (size_t)H);
    add_err(b, 1, gx, NULL, ref_dx, NULL, (size_t)H);
    add_err(b, 2, NULL, got_dw, NULL, ref_dw, (size_t)k);
  } else {
    pthread_mutex_lock(&b->mu);
    snprintf(b->fail, sizeof b->fail, "check of rank %d token %d failed: %s", r, t, why);
    pthread_mutex_unlock(&b->mu);
  }
  mokLayerDestroy(l);
  free(wg); free(wu); free(wd); free(sg); free(su); free(sd); free(x); free(dout); free(gx);
  free(ref_out); free(ref_dx); free(got_out); free(dwg); free(dwu); free(dwd); free(dsg); free(dsu); free(dsd);
  return NULL;
}

/* Sampled weight gradients: on every rank its most-loaded local expert; rows {0, I/2,
 * I-1} of dW_gate and dW_up and the same columns of dW_down, against
 * mokReferenceExpertGrads (float64, from host copies of every rank's x and d_out and
 * that expert's weights). Adds to err category 3. */
static void check_experts(bench_t *b) {
  const mokConfig_t *c = &b->cfg;
  const int N = b->N, T = b->T, H = c->hidden, I = c->inter, k = c->topk, El = c->num_experts / N;
  const size_t gs = c->grad_dtype == mokDtypeBF16 ? 2 : 4, ew = (size_t)I * H;
  mokConfig_t hc = *c;
  mokLayer_t hl = NULL;
  mokRankInput_t hin[MAXG];
  mokBf16 *hx[MAXG] = {0}, *hd[MAXG] = {0};
  mokBf16 *wg = malloc(2 * ew), *wu = malloc(2 * ew), *wd = malloc(2 * ew);
  void *gg = malloc(gs * ew), *gu = malloc(gs * ew), *gd = malloc(gs * ew);
  double *rg = malloc(sizeof(double) * 3 * H), *ru = malloc(sizeof(double) * 3 * H), *rd = malloc(sizeof(double) * 3 * H);
  int64_t *load = calloc((size_t)c->num_experts, sizeof(int64_t));
  int ok = wg && wu && wd && gg && gu && gd && rg && ru && rd && load && mokLayerCreate(&hl, &hc) == mokSuccess;
  for (int r = 0; ok && r < N; r++) {
    hx[r] = malloc(2 * (size_t)T * H + 2), hd[r] = malloc(2 * (size_t)T * H + 2);
    ok = hx[r] && hd[r];
    if (!ok) break;
    cudaSetDevice(r);
    cudaMemcpy(hx[r], b->in[r].x, 2 * (size_t)T * H, cudaMemcpyDeviceToHost);
    cudaMemcpy(hd[r], b->dout[r], 2 * (size_t)T * H, cudaMemcpyDeviceToHost);
    hin[r] = (mokRankInput_t){T, hx[r], b->h_idx[r], b->h_w[r]};
    for (int64_t q = 0; q < (int64_t)T * k; q++)
      if (b->h_idx[r][q] >= 0) load[b->h_idx[r][q]]++;
  }
  const int idx[3] = {0, I / 2, I - 1};
  double num = 0, den = 0;
  for (int r = 0; ok && r < N && b->check_experts > 0; r++) {
    int le = 0;
    for (int e = 1; e < El; e++) le = load[r * El + e] > load[r * El + le] ? e : le;
    cudaSetDevice(r);
    cudaMemcpy(wg, b->w[r].w_gate + (size_t)le * ew, 2 * ew, cudaMemcpyDeviceToHost);
    cudaMemcpy(wu, b->w[r].w_up + (size_t)le * ew, 2 * ew, cudaMemcpyDeviceToHost);
    cudaMemcpy(wd, b->w[r].w_down + (size_t)le * ew, 2 * ew, cudaMemcpyDeviceToHost);
    cudaMemcpy(gg, (char *)b->g[r].d_w_gate + gs * (size_t)le * ew, gs * ew, cudaMemcpyDeviceToHost);
    cudaMemcpy(gu, (char *)b->g[r].d_w_up + gs * (size_t)le * ew, gs * ew, cudaMemcpyDeviceToHost);
    cudaMemcpy(gd, (char *)b->g[r].d_w_down + gs * (size_t)le * ew, gs * ew, cudaMemcpyDeviceToHost);
    if (mokReferenceExpertGrads(hl, hin, (const mokBf16 *const *)hd, r * El + le, wg, wu, wd, 3, idx, rg, ru, rd) !=
        mokSuccess) {
      ok = 0;
      break;
    }
#define GOT(p, i) (gs == 2 ? (double)mokBf16ToFloat(((const mokBf16 *)(p))[i]) : (double)((const float *)(p))[i])
    for (int q = 0; q < 3; q++)
      for (int h = 0; h < H; h++) {
        double ref[3] = {rg[q * H + h], ru[q * H + h], rd[q * H + h]};
        double got[3] = {GOT(gg, (size_t)idx[q] * H + h), GOT(gu, (size_t)idx[q] * H + h), GOT(gd, (size_t)h * I + idx[q])};
        for (int m = 0; m < 3; m++) {
          num += got[m] != got[m] ? INFINITY : (got[m] - ref[m]) * (got[m] - ref[m]);
          den += ref[m] * ref[m];
        }
      }
#undef GOT
  }
  if (ok) {
    b->err_num[3] += num;
    b->err_den[3] += den;
  } else {
    snprintf(b->fail, sizeof b->fail, "sampled expert gradient check failed: %s", mokGetLastError());
  }
  for (int r = 0; r < N; r++) free(hx[r]), free(hd[r]);
  free(wg); free(wu); free(wd); free(gg); free(gu); free(gd); free(rg); free(ru); free(rd); free(load);
  mokLayerDestroy(hl);
}

/* ---- driver -------------------------------------------------------------------------- */
static int split_list(char *s, char **items, int max) {
  int n = 0;
  for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) items[n++] = tok;
  return n;
}

static void usage(void) {
  printf("usage: mok bench layer [--impl nccl,baseline] [--model A,B,..] [--tokens T1,T2,..] [--gpus N]\n"
         "                       [--routing uniform|zipf:S|hot:E] [--iters 20] [--warmup 3]\n"
         "                       [--check-tokens 2] [--check-experts 1] [--seed S] [--grad-dtype bf16|fp32]\n"
         "                       [--json FILE]\n"
         "  Times forward and forward+backward of the MoE layer on N local GPUs (EP over N ranks;\n"
         "  default all visible) and checks sampled tokens in float64. Formulas in tools/bench_layer.c.\n"
         "  --impl: one or more of auto, nccl (NCCL all-to-all + mok's grouped Hopper GEMMs) and\n"
         "  baseline (NCCL all-to-all + cuBLAS) and mega (the forward megakernel; N > 1: stage A),\n"
         "  each timed on the same data, side by side.\n");
}

int mok_bench_layer_main(int argc, char **argv) {
  char models_s[512] = "glm-5.2", tokens_s[256] = "2048";
  const char *json = NULL, *routing_s = "uniform";
  int gpus = 0, iters = 20, warmup = 3, check_tokens = 2, check_exp = 1;
  long long seed = 1;
  char impls_s[64] = "nccl,baseline";
  mokDtype_t gdt = mokDtypeBF16;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(), 0;
    if (i + 1 >= argc) return fprintf(stderr, "mok bench layer: %s needs a value\n", a), 2;
    const char *v = argv[++i];
    if (!strcmp(a, "--model")) snprintf(models_s, sizeof models_s, "%s", v);
    else if (!strcmp(a, "--tokens")) snprintf(tokens_s, sizeof tokens_s, "%s", v);
    else if (!strcmp(a, "--json")) json = v;
    else if (!strcmp(a, "--routing")) routing_s = v;
    else if (!strcmp(a, "--gpus")) gpus = atoi(v);
    else if (!strcmp(a, "--iters")) iters = atoi(v);
    else if (!strcmp(a, "--warmup")) warmup = atoi(v);
    else if (!strcmp(a, "--check-tokens")) check_tokens = atoi(v);
    else if (!strcmp(a, "--check-experts")) check_exp = atoi(v);
    else if (!strcmp(a, "--seed")) seed = atoll(v);
    else if (!strcmp(a, "--grad-dtype")) gdt = !strcmp(v, "fp32") ? mokDtypeFP32 : mokDtypeBF16;
    else if (!strcmp(a, "--impl")) {
      snprintf(impls_s, sizeof impls_s, "%s", v);
    } else return fprintf(stderr, "mok bench layer: unknown option '%s' (see --help)\n", a), 2;
  }
  if (iters < 1 || warmup < 0 || check_tokens < 0)
    return fprintf(stderr, "mok bench layer: --iters >= 1, --warmup >= 0, --check-tokens >= 0\n"), 2;
  mokRouting_t routing = {mokRoutingUniform, 0};
  if (!strncmp(routing_s, "zipf:", 5)) routing = (mokRouting_t){mokRoutingZipf, atof(routing_s + 5)};
  else if (!strncmp(routing_s, "hot:", 4)) routing = (mokRouting_t){mokRoutingHot, atof(routing_s + 4)};
  else if (strcmp(routing_s, "uniform")) return fprintf(stderr, "mok bench layer: bad --routing '%s'\n", routing_s), 2;
  char *impl_names[4];
  mokImpl_t impls[4];
  const int ni = split_list(impls_s, impl_names, 4);
  for (int q = 0; q < ni; q++) {
    if (!strcmp(impl_names[q], "auto")) impls[q] = mokImplAuto;
    else if (!strcmp(impl_names[q], "nccl")) impls[q] = mokImplNccl;
    else if (!strcmp(impl_names[q], "baseline")) impls[q] = mokImplBaseline;
    else if (!strcmp(impl_names[q], "mega")) impls[q] = mokImplMega;
    else return fprintf(stderr, "mok bench layer: --impl '%s' is not built (auto, nccl, baseline, mega)\n", impl_names[q]), 2;
  }
  if (ni == 0) return fprintf(stderr, "mok bench layer: --impl needs at least one of auto, nccl, baseline, mega\n"), 2;
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0)
    return fprintf(stderr, "mok bench layer: no CUDA GPU found; this benchmark needs GPUs\n"), 2;
  if (gpus <= 0) gpus = visible;
  if (gpus > visible || gpus > MAXG) return fprintf(stderr, "mok bench layer: --gpus %d but %d visible\n", gpus, visible), 2;
  char *models[16], *tokens[16];
  int nm = split_list(models_s, models, 16), nt = split_list(tokens_s, tokens, 16);
  mokComm_t comms[MAXG] = {0};
  if (mokLocalCommsCreate(gpus, NULL, NULL, comms) != mokSuccess)
    return fprintf(stderr, "mok bench layer: %s\n", mokGetLastError()), 1;
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) fprintf(stderr, "mok bench layer: cannot write %s\n", json);
  if (jf) fprintf(jf, "[\n");
  int bad = 0, rows = 0;
  static char table[16 * 16 * 4][320];
  for (int mi = 0; mi < nm; mi++)
    for (int ti = 0; ti < nt; ti++)
      for (int ii = 0; ii < ni; ii++) {
      const char *label = impl_names[ii];
      const mokImpl_t impl = impls[ii];
      bench_t *b = calloc(1, sizeof *b);
      pthread_mutex_init(&b->mu, NULL);
      mokConfig_t cfg = MOK_CONFIG_INITIALIZER;
      if (mokConfigSetModel(&cfg, models[mi]) != mokSuccess) {
        fprintf(stderr, "mok bench layer: %s\n", mokGetLastError());
        bad = 2;
        free(b);
        continue;
      }
      b->T = atoi(tokens[ti]);
      cfg.num_ranks = gpus, cfg.max_tokens = b->T > 0 ? b->T : 1, cfg.grad_dtype = gdt;
      b->cfg = cfg, b->N = gpus, b->iters = iters, b->warmup = warmup, b->check_tokens = check_tokens;
      b->check_experts = check_exp;
      b->seed = (uint64_t)seed, b->routing = routing, b->impl = impl;
      printf("[%s T=%d EP%d %s] generating data and creating the layer ...\n", models[mi], b->T, gpus, label);
      fflush(stdout);
      double t0 = now_s();
      mokResult_t rc = mokLocalRun(gpus, comms, rank_setup, b);
      if (rc == mokSuccess) {
        printf("[%s T=%d EP%d %s] timing %d+%d forward and forward+backward passes ...\n", models[mi], b->T, gpus, label, warmup,
               iters);
        fflush(stdout);
        rc = mokLocalRun(gpus, comms, rank_time, b);
      }
      if (rc != mokSuccess) {
        fprintf(stderr, "mok bench layer: %s T=%d: %s\n", models[mi], b->T, mokGetLastError());
        bad = 1;
        mokLocalRun(gpus, comms, rank_free, b);
        free(b);
        continue;
      }
      /* float64 check of sampled tokens (first, last, spread), one thread each */
      printf("[%s T=%d EP%d %s] float64 check of %d tokens per rank ...\n", models[mi], b->T, gpus, label, check_tokens);
      fflush(stdout);
      int nj = 0;
      check_job jobs[MAXG * 16];
      pthread_t th[MAXG * 16];
      for (int r = 0; r < gpus; r++)
        for (int q = 0; q < check_tokens && q < 16 && q < b->T; q++)
          jobs[nj++] = (check_job){b, r, check_tokens == 1 ? b->T / 2 : (int)((int64_t)q * (b->T - 1) / (check_tokens - 1))};
      for (int q = 0; q < nj; q++) pthread_create(&th[q], NULL, check_token, &jobs[q]);
      for (int q = 0; q < nj; q++) pthread_join(th[q], NULL);
      if (check_exp > 0) {
        printf("[%s T=%d EP%d %s] float64 check of sampled weight gradients (most-loaded expert per rank) ...\n",
               models[mi], b->T, gpus, label);
        fflush(stdout);
        check_experts(b);
      }
      double err[4];
      for (int q = 0; q < 4; q++) err[q] = b->err_den[q] ? sqrt(b->err_num[q] / b->err_den[q]) : sqrt(b->err_num[q]);
      double maxerr = fmax(fmax(err[0], err[3]), fmax(err[1], err[2]));
      int ok = !b->fail[0] && maxerr < 1e-2;
      if (!ok) bad = 1;
      float fwd = 0, fb = 0;
      for (int r = 0; r < gpus; r++) fwd = fmaxf(fwd, b->fwd_ms[r]), fb = fmaxf(fb, b->fb_ms[r]);
      size_t own = 0, scratch = 0; /* device memory after the passes (rank 0) */
      mokLayerMemoryInfo(b->layer[0], &own, &scratch);
      const double H = cfg.hidden, I = cfg.inter, Is = cfg.shared_inter, k = cfg.topk, T = b->T, N = gpus;
      const double El = cfg.num_experts / N;
      double flops = 6 * T * (k * H * I + H * Is);
      double hbm = 3 * El * H * I * 2 + 3 * Is * H * 2 + 8 * T * k * H * 2;
      double nvl = 2 * T * k * (N - 1) / N * H * 2;
      double floor_ms = 1e3 * fmax(flops / 790e12, fmax(hbm / 3.9e12, nvl / 336e9));
      snprintf(table[rows++], sizeof table[0], "%-18s %6d %4d %-9s %9.3f %8.1f %10.3f %8.1f %9.3f %6.2fx  %.2e %s",
               models[mi], b->T, gpus, label, fwd, flops / (fwd * 1e-3) / 1e12, fb,
               3 * flops / (fb * 1e-3) / 1e12, floor_ms, fwd / floor_ms, maxerr, ok ? "ok" : b->fail[0] ? "FAILED" : "WRONG");
      printf("[%s T=%d EP%d %s] forward %.3f ms, forward+backward %.3f ms, check %.2e (%s), %.1f s; device memory: "
             "layer %.2f GiB, comm scratch %.2f GiB\n", models[mi], b->T, gpus, label, fwd, fb, maxerr,
             ok ? "ok" : "WRONG", now_s() - t0, own / 1073741824.0, scratch / 1073741824.0);
      if (jf)
        fprintf(jf,
                "%s  {\"model\": \"%s\", \"tokens\": %d, \"gpus\": %d, \"impl\": \"%s\", \"routing\": \"%s\", "
                "\"fwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, \"fwd_tflops\": %.2f, \"fwd_bwd_tflops\": %.2f, "
                "\"fwd_floor_ms\": %.4f, \"err_out\": %.3e, \"err_dx\": %.3e, \"err_dtopk_w\": %.3e, \"err_dw\": %.3e, "
                "\"layer_bytes\": %zu, \"comm_scratch_bytes\": %zu, \"ok\": %s}",
                rows > 1 ? ",\n" : "", models[mi], b->T, gpus, label, routing_s, fwd, fb, flops / (fwd * 1e-3) / 1e12,
                3 * flops / (fb * 1e-3) / 1e12, floor_ms, err[0], err[1], err[2], err[3], own, scratch,
                ok ? "true" : "false");
      fflush(stdout);
      mokLocalRun(gpus, comms, rank_free, b);
      pthread_mutex_destroy(&b->mu);
      free(b);
    }
  if (jf) fprintf(jf, "\n]\n"), fclose(jf);
  mokLocalCommsDestroy(gpus, comms);
  printf("\nMoE layer, EP over %d GPU(s), routing %s; ms = median of %d passes, slowest rank; TFLOP/s per GPU\n"
         "(fwd 6T(kHI+HI_s), fwd+bwd 3x that); floor = fwd roofline (FLOPs/790T, HBM/3.9TB/s, NVLink/336GB/s);\n"
         "check = max rel L2 of out, d_x, d_topk_w on sampled tokens and of sampled dW rows/columns vs float64\n",
         gpus, routing_s, iters);
  printf("%-18s %6s %4s %-9s %9s %8s %10s %8s %9s %7s  %s\n", "model", "T", "GPUs", "impl", "fwd ms", "TFLOP/s",
         "fwd+bwd ms", "TFLOP/s", "floor ms", "/floor", "check");
  for (int i = 0; i < rows; i++) printf("%s\n", table[i]);
  return bad;
}
