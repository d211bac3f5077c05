/*
 * bench_gemm.cu — `mok bench gemm`: TFLOP/s of each grouped expert GEMM kind of
 * src/gemm.cu beside cuBLAS strided-batched GEMMs doing the same balanced work, in the
 * same run, on one GPU.
 *
 *   mok bench gemm [--model NAME | --hidden H --inter I --experts E_l]
 *                  [--rows-per-expert R] [--routing uniform|zipf:S|random] [--limit L]
 *                  [--iters N] [--json FILE] [--sched auto|static|tickets] [--tail split|one]
 *                  [--ffn on|off] ...
 *
 * Rows: E_l local experts (default: the model's E / 8, the local experts of 8 GPUs);
 * R rows each (default: the published per-expert load of the model, else 512), or the
 * same total rows split over experts in proportion to 1/(e+1)^S (zipf:S; the heaviest
 * expert first, or with zipf:S,shuffled the same counts in a fixed pseudo-random order of
 * experts, as routing puts them, or with ,reversed the lightest first), or each of those
 * rows given to an expert drawn uniformly at random (random[:SEED]: the counts of random
 * tokens under a balanced router, R +- sqrt(R), fixed for a SEED, default 1); each segment
 * padded to 64 rows. Under random routing every "zipf" below reads "random". Inputs are
 * random (never zeros), padding rows zero.
 * Formulas: FLOP = 2 * rows * N * K of the GEMM (rows = routed rows, padding not
 * counted; gate+up N = 2I); TFLOP/s = FLOP / median time; HBM GB/s = (weights or
 * weight gradients once + activation rows read and written once) / median time.
 * cuBLAS: cublasGemmStridedBatchedEx, bf16 in, fp32 compute, E_l batches of
 * total_rows / E_l rows (gate+up on a stacked [E_l, 2I, H] copy of the weights; its
 * SwiGLU pass is not counted). err: relative L2 error against float64 on sampled rows
 * (first and last row of three experts; three weight rows of three experts).
 * Timing: median of --iters runs each, ours and cuBLAS taken in turn, each launch queued
 * behind a 50 us spin kernel (GPU time only, not the host's launch work). Our GEMMs get
 * the expert counts (--counts on): forward token tiles skip the padding rows.
 * Zipf routing (--vs-balanced on, its default there): each kind is timed a second time
 * against itself on balanced rows (R each, the same buffers, weights and total rows; the
 * kind's inputs refilled for each layout), the two in turn as above, and the row prints
 * zipf / balanced of those two medians: the issue's "within 10% of the balanced figure",
 * measured in one process (processes differ by up to +-6%: docs/PERF.md, session 17).
 * Also under zipf (--vs-cublas-zipf on, its default there): cuBLAS on the same zipf rows
 * as users run uneven experts today, one cublasGemmGroupedBatchedEx call and a
 * cublasGemmEx an expert with rows (the two checked to agree on every expert's first and
 * last output rows), each timed in turn with ours; the row prints the faster, ours over it,
 * and its own zipf / balanced (against the strided-batched call above).
 * Exit status: 0 ok, 1 a wrong result or a failed call, 2 bad usage. MOK_BENCH_VERBOSE=1
 * prints each stage (run, check) to stderr, to locate a hang.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "gemm.h"
#include "gemm_check.h"

typedef struct model_shape {
  const char *name;
  int E, H, I, k, I_s;
  int rows; /* published per-expert load at EP8, T = 2048 (0: none published) */
} model_shape;

/* DESIGN.md section 6 */
static const model_shape kModels[] = {
    {"kimi-k2.7-code", 384, 7168, 2048, 8, 2048, 341},
    {"glm-5.2", 256, 6144, 2048, 8, 2048, 512},
    {"qwen3.5-397b-a17b", 512, 4096, 1024, 10, 1024, 320},
    {"deepseek-v4-pro", 384, 7168, 3072, 6, 3072, 256},
    {"deepseek-v3", 256, 7168, 2048, 8, 2048, 0},
    {"qwen3-30b-a3b", 128, 2048, 768, 8, 0, 0},
    {"gpt-oss-120b", 128, 2880, 2880, 4, 0, 0},
};

#define BCUDA(call)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "bench gemm: %s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)
#define BMOK(call)                                                                       \
  do {                                                                                   \
    mokResult_t r_ = (call);                                                             \
    if (r_ != mokSuccess) {                                                              \
      fprintf(stderr, "bench gemm: %s: %s\n", #call, mokGetLastError());                 \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)
#define BCUBLAS(call)                                                                    \
  do {                                                                                   \
    cublasStatus_t s_ = (call);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      fprintf(stderr, "bench gemm: %s:%d %s: cublas status %d\n", __FILE__, __LINE__, #call, (int)s_); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

static void usage(void) {
  fprintf(stderr,
          "usage: mok bench gemm [--model NAME | --hidden H --inter I --experts E_l]\n"
          "                      [--rows-per-expert R] [--routing uniform|zipf:S[,shuffled|,reversed]|random[:SEED]]\n"
          "                      [--limit L]\n"
          "                      [--iters N] [--json FILE] [--sched auto|static|tickets]\n"
          "                      [--tail split|one] [--counts on|off] [--raster N] [--tok-units U]\n"
          "                      [--mix on|off] [--pairs on|off|solo] [--stagger on|off] [--row-box 32|128]\n"
          "                      [--mix-ctas P] [--eager-rows N] [--gu-box one|two|four]\n"
          "                      [--gu-order gate-first|up-first] [--l2-promo W,R] [--cold-evict on|off]\n"
          "                      [--tok-ring auto|176|128] [--epi-debug 0|1|2]\n"
          "                      [--ddown-tok on|off] [--gu-tiles grouped|token-n|token-m] [--dn-tiles token-n|token-m]\n"
          "                      [--seed N|clock]\n"
          "                      [--vs-balanced on|off] [--vs-cublas-zipf on|off] [--kinds LIST]\n"
          "                      [--trace FILE] [--stage-clock on|off] [--ctas N] [--ffn on|off]\n"
          "  --kinds: comma-separated subset of gateup,down,ddown,dgateup,wgateup,wdown,\n"
          "  wgateup32,wdown32 (default all)\n"
          "  --sched, --tail, --counts, --raster: diagnostics: how tiles reach the CTAs (default\n"
          "  auto: the library's rule); 64-row tails of 256-wide tiles on both warpgroups (split,\n"
          "  default) or one; expert counts given to the GEMMs (on, default: forward token tiles\n"
          "  skip padding) or not; row tiles per raster group (default 8); most 16-row units of a\n"
          "  forward token tile (default 11); token tiles of single-tile experts run beside the\n"
          "  others' (mix on) or after them (off) (default: the library's rule, on);\n"
          "  forward token tiles in 2-CTA clusters sharing loads by multicast (--pairs, default: the rule;\n"
          "  solo: clusters without multicast, diagnostics); expert 0's token tiles half as large\n"
          "  (--stagger, default: the rule); forward token tiles' rows in TMA boxes of 32 rows, or of\n"
          "  128 first (--row-box, default: the rule); mix order splits the CTAs, the first P on the\n"
          "  single-tile experts' tiles (--mix-ctas P; default 0: the rule; -1: no split, those\n"
          "  tiles spread evenly over the others' order); token tiles of <= N rows free each stage\n"
          "  once their MMAs on it are done (--eager-rows N, at most 96; default -1: the rule; 0: never);\n"
          "  gate+up token tiles load a stage's weights as one 4-D TMA box over W_gate and W_up, two\n"
          "  3-D boxes or four 2-D ones (--gu-box one|two|four; default: the rule, one); W_up placed\n"
          "  after W_gate (gate-first, default) or before it (up-first: four boxes then); L2 promotion of the forward\n"
          "  token tiles' weight and row loads in bytes (--l2-promo W,R; default 256,256); the split\n"
          "  mix order's one-tile experts' weights loaded L2 evict-first (--cold-evict); the down\n"
          "  GEMM's token tiles in stages of 176 rows or of 128 with an epilogue area (--tok-ring;\n"
          "  default auto: the rule, 128 where every expert's tiles are <= 128 rows)\n"
          "  --ctas N: diagnostics, every launch of ours on at most N CTAs (default: one an SM)\n"
          "  --ddown-tok on: experiment, down dgrad on token tiles (default off: 128 x 128 tiles)\n"
          "  --gu-tiles: forward gate+up on the row-grouped 128-row tiles of I %% 128 != 0 (grouped,\n"
          "  diagnostics), or on token tiles, those of 128 rows with the rows as wgmma N (token-n) or\n"
          "  as M (token-m) (default: the library's rule)\n"
          "  --dn-tiles: forward down's 128-row token tiles with the rows as wgmma N (token-n) or M\n"
          "  (token-m) (default: the library's rule, token-m)\n"
          "  --expert-order: token tiles under tickets walk the experts with most rows first (load)\n"
          "  or in index order (index) (default auto: the library's rule)\n"
          "  --routing random[:SEED]: each row to a uniformly drawn expert (R +- sqrt(R) an expert, as\n"
          "  random tokens under a balanced router; SEED default 1); the zipf options below apply\n"
          "  --vs-balanced on|off: under zipf routing, ours also timed on balanced rows in turn with\n"
          "  the zipf launch, zipf / balanced printed (default on with zipf)\n"
          "  --vs-cublas-zipf on|off: under zipf routing, cuBLAS also timed on the zipf rows, as one\n"
          "  grouped call and as a GEMM an expert, each in turn with ours (default on with zipf)\n"
          "  --seed: the inputs' random seed (default clock: another each run; printed in the header)\n"
          "  --epi-debug: timing only, token-tile outputs WRONG: 1 no TMA stores, 2 no epilogue\n"
          "  --trace FILE: per-tile start/end times of one more forward launch, CSV\n"
          "  (kind,cta,tile,expert,rows,block,start_ns,end_ns; scripts/trace-summary.py reads it)\n"
          "  --stage-clock on: one more forward launch each; pipeline stages' issue -> use times\n"
          "  --ffn on: also the routed forward as one fused launch (mok_gemm_ffn_fwd) against its two\n"
          "  launches, in turn, checked bitwise equal (with --kinds gateup,down: beside cuBLAS's two)\nmodels:");
  for (size_t i = 0; i < sizeof kModels / sizeof kModels[0]; ++i) fprintf(stderr, " %s", kModels[i].name);
  fprintf(stderr, "\n");
}

/* ---- state --------------------------------------------------------------------------- */
enum { K_GATEUP, K_DOWN, K_DDOWN, K_DGATEUP, K_WGATEUP, K_WDOWN, K_WGATEUP32, K_WDOWN32, K_N };
typedef struct bench {
  int E, H, I;
  float limit;
  int iters;
  int64_t rows_real, rows_used, cap;
  int32_t *off_h, *cnt_h;
  int rows_bal; /* cuBLAS rows per expert */
  int64_t seg_bal;
  mokGemmRows_t rows;
  int32_t *off, *cnt;
  int vs_bal;              /* --vs-balanced: zipf rows timed against balanced rows too */
  const char *uneven;      /* the uneven routing's name in the output: "zipf" or "random" */
  mokGemmRows_t bal_rows;  /* R rows an expert, segments of seg_bal rows */
  int32_t *off_bal, *cnt_bal, *off_bal_h, *cnt_bal_h;
  uint64_t seed;
  mokBf16 *x, *wblk, *wg, *wu, *wd, *act, *gu, *y, *dy, *dgu, *dx, *wgu_cub, *cub_out;
  int up_first; /* --gu-order up-first: W_up, then W_gate in one block */
  void *dw0, *dw1, *dw2, *cub_dw;
  int *bad;
  cublasHandle_t cub;
  unsigned long long spin_ns; /* time_pair's spin before each timed launch (0: 50 us) */
  int vs_cub_zipf;            /* --vs-cublas-zipf: cuBLAS also timed on the zipf rows */
  struct cub_groups *cg;      /* its per-expert calls (cub_zipf_prep) */
  cudaEvent_t ev0, ev1;
  int wrong;
  FILE *json;
  int json_first;
  int sclk;    /* --stage-clock: one more launch of each forward kind, stage times printed */
  FILE *trace; /* --trace: token-tile records of one more launch of each forward kind (CSV) */
  int ffn;     /* --ffn: the fused forward (mok_gemm_ffn_fwd) timed against the two launches */
  float cub_ms[K_N]; /* cuBLAS's median of each kind run (0: not run) */
  char shape[128];
} bench;

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

typedef int (*run_fn)(bench *b, void *ctx);

/* Holds the GPU for ns nanoseconds, so that the launch after it is queued before the
 * timing event before it fires: the host's launch work is not timed. */
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < ns);
}

static float median(float *t, int n) {
  qsort(t, (size_t)n, sizeof(float), cmp_float);
  return t[n / 2];
}

/* Median ms of `iters` runs of each of two calls, after 3 warm-ups of each, the two taken
 * in turn (a, b, a, b, ...) so that drifting clocks or temperature hit both alike; each
 * timed launch sits behind a 50 us spin kernel, so only GPU time is measured. -1 on
 * failure. */
static int time_pair(bench *b, run_fn fa, run_fn fb, void *ctx, float *ma, float *mb) {
  float *t = (float *)malloc(sizeof(float) * 2 * (size_t)b->iters);
  int rc = 0;
  for (int i = 0; i < 3 && !rc; ++i) rc = fa(b, ctx) || fb(b, ctx);
  for (int i = 0; i < 2 * b->iters && !rc; ++i) {
    spin_kernel<<<1, 1>>>(b->spin_ns ? b->spin_ns : 50000ull);
    cudaEventRecord(b->ev0, 0);
    rc = (i & 1 ? fb : fa)(b, ctx);
    cudaEventRecord(b->ev1, 0);
    cudaEventSynchronize(b->ev1);
    cudaEventElapsedTime(&t[(i & 1) * b->iters + i / 2], b->ev0, b->ev1);
  }
  if (!rc && cudaGetLastError() != cudaSuccess) rc = 1;
  if (!rc) {
    *ma = median(t, b->iters);
    *mb = median(t + b->iters, b->iters);
  }
  free(t);
  return rc;
}

/* ---- the GEMM calls -------------------------------------------------------------------- */
static const char *kKindFlag[K_N] = {"gateup", "down", "ddown", "dgateup", "wgateup", "wdown", "wgateup32", "wdown32"};
static const char *kKindName[K_N] = {"gateup+swiglu", "down", "dgrad down+swiglu'", "dgrad gate+up",
                                     "wgrad gate+up bf16", "wgrad down bf16", "wgrad gate+up fp32",
                                     "wgrad down fp32"};

static int run_ours(bench *b, void *ctx) {
  const int k = (int)(intptr_t)ctx;
  mokResult_t r = mokSuccess;
  switch (k) {
    case K_GATEUP: r = mok_gemm_gateup_fwd(&b->rows, b->H, b->I, b->limit, b->x, b->wg, b->wu, b->act, b->gu, 0); break;
    case K_DOWN: r = mok_gemm_down_fwd(&b->rows, b->H, b->I, b->act, b->wd, b->y, 0); break;
    case K_DDOWN: r = mok_gemm_down_dgrad(&b->rows, b->H, b->I, b->limit, b->dy, b->wd, b->gu, b->dgu, 0); break;
    case K_DGATEUP: r = mok_gemm_gateup_dgrad(&b->rows, b->H, b->I, b->dgu, b->wg, b->wu, b->dx, 0); break;
    case K_WGATEUP: r = mok_gemm_wgrad_gateup(&b->rows, b->H, b->I, b->dgu, b->x, mokDtypeBF16, b->dw0, b->dw1, 0); break;
    case K_WDOWN: r = mok_gemm_wgrad_down(&b->rows, b->H, b->I, b->dy, b->act, mokDtypeBF16, b->dw2, 0); break;
    case K_WGATEUP32: r = mok_gemm_wgrad_gateup(&b->rows, b->H, b->I, b->dgu, b->x, mokDtypeFP32, b->dw0, b->dw1, 0); break;
    case K_WDOWN32: r = mok_gemm_wgrad_down(&b->rows, b->H, b->I, b->dy, b->act, mokDtypeFP32, b->dw2, 0); break;
  }
  if (r != mokSuccess) {
    fprintf(stderr, "bench gemm: %s: %s\n", kKindName[k], mokGetLastError());
    return 1;
  }
  return 0;
}

/* Kind k on the balanced rows (--vs-balanced). */
static int run_ours_bal(bench *b, void *ctx) {
  const mokGemmRows_t z = b->rows;
  b->rows = b->bal_rows;
  const int rc = run_ours(b, ctx);
  b->rows = z;
  return rc;
}

/* The row buffers' random values: buffer r's rows of the layout (off, cnt) (device arrays)
 * from seed + its own offset (a row's values depend on its index alone; padding rows zero),
 * at the start and again for --vs-balanced. */
enum { R_X, R_DY, R_ACT, R_GU, R_DGU };
static int fill_buf(bench *b, int r, const int32_t *off, const int32_t *cnt) {
  mokBf16 *const p[] = {b->x, b->dy, b->act, b->gu, b->dgu};
  const int cols[] = {b->H, b->H, b->I, 2 * b->I, 2 * b->I}, seed[] = {1, 2, 7, 8, 9};
  BMOK(mok_gemm_fill_rows(p[r], b->cap, cols[r], b->seed + seed[r], 1.f, b->E, off, cnt, 0));
  return 0;
}

/* --vs-balanced: refills, in the layout of (off, cnt), the buffers kind k reads and those of
 * its outputs that later kinds read, with the values the run started with. */
static int fill_kind(bench *b, int k, const int32_t *off, const int32_t *cnt) {
  int f[3], n = 0;
  switch (k) {
    case K_GATEUP: f[n++] = R_X; f[n++] = R_ACT; f[n++] = R_GU; break;
    case K_DOWN: f[n++] = R_ACT; break;
    case K_DDOWN: f[n++] = R_DY; f[n++] = R_GU; f[n++] = R_DGU; break;
    case K_DGATEUP: f[n++] = R_DGU; break;
    case K_WGATEUP: case K_WGATEUP32: f[n++] = R_DGU; f[n++] = R_X; break;
    default: f[n++] = R_DY; f[n++] = R_ACT; break;
  }
  for (int i = 0; i < n; ++i)
    if (fill_buf(b, f[i], off, cnt)) return 1;
  return 0;
}

/* --stage-clock: one more launch with mok_gemm_debug_stage_clock on; prints, in SM cycles
 * and in us at the SM clock the device reports, how long stages took from issue to use and
 * how long the consumers waited on the full barrier a stage. */
static double sclk_pct(const unsigned long long *h, double bin, double q) {
  unsigned long long n = 0, acc = 0;
  for (int i = 0; i < 32; ++i) n += h[i];
  for (int i = 0; i < 32; ++i) {
    acc += h[i];
    if (n && acc >= q * n) return (i + 0.5) * bin;
  }
  return 32 * bin;
}
static int sclk_kind(bench *b, int k) {
  unsigned long long *d = NULL, h[67];
  int rc = 1, khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  const double cyc_us = khz > 0 ? khz * 1e-3 : 1755.0;
  if (cudaMalloc(&d, sizeof h) == cudaSuccess && cudaMemset(d, 0, sizeof h) == cudaSuccess &&
      mok_gemm_debug_stage_clock(d) == mokSuccess) {
    rc = run_ours(b, (void *)(intptr_t)k);
    mok_gemm_debug_stage_clock(NULL);
    if (!rc && cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess && h[64] > 0) {
      const double n = (double)h[64];
      /* (the wait runs from the end of the previous stage's MMA issue: it overlaps those MMAs) */
      printf("  stage clock %s: %llu stages; issue->use mean %.0f cyc (%.2f us), p50 %.0f, p90 %.0f; full-barrier "
             "wait a stage %.0f cyc (%.2f us) (SM clock %.0f MHz)\n",
             kKindName[k], h[64], h[65] / n, h[65] / n / cyc_us, sclk_pct(h, 256, 0.5), sclk_pct(h, 256, 0.9),
             h[66] / n, h[66] / n / cyc_us, cyc_us);
    } else {
      rc = 1;
    }
  }
  if (rc) fprintf(stderr, "bench gemm: --stage-clock failed\n");
  cudaFree(d);
  return rc;
}

/* --trace: one more launch with mok_gemm_debug_trace on; its records as CSV lines
 * kind,cta,tile,expert,rows,block,start_ns,end_ns (times from the launch's first start). */
static int trace_kind(bench *b, int k) {
  enum { kCap = 1 << 16 };
  unsigned long long *d = NULL, *h = (unsigned long long *)malloc((1 + 4 * (size_t)kCap) * 8);
  int rc = 1;
  if (h && cudaMalloc(&d, (1 + 4 * (size_t)kCap) * 8) == cudaSuccess && cudaMemset(d, 0, 8) == cudaSuccess &&
      mok_gemm_debug_trace(d, kCap) == mokSuccess) {
    rc = run_ours(b, (void *)(intptr_t)k);
    mok_gemm_debug_trace(NULL, 0);
    if (!rc && cudaMemcpy(h, d, (1 + 4 * (size_t)kCap) * 8, cudaMemcpyDeviceToHost) == cudaSuccess) {
      const unsigned long long n = h[0] < kCap ? h[0] : kCap;
      unsigned long long t0 = ~0ull;
      for (unsigned long long i = 0; i < n; ++i) t0 = h[1 + 4 * i] < t0 ? h[1 + 4 * i] : t0;
      for (unsigned long long i = 0; i < n; ++i) {
        const unsigned long long *r = h + 1 + 4 * i;
        fprintf(b->trace, "%s,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n", kKindFlag[k], r[2] >> 32, r[2] & 0xffffffffull,
                r[3] >> 32, (r[3] >> 16) & 0xffff, r[3] & 0xffff, r[0] - t0, r[1] - t0);
      }
      if (h[0] > kCap) fprintf(stderr, "bench gemm: --trace kept %d of %llu records\n", kCap, h[0]);
    } else {
      rc = 1;
    }
  }
  if (rc) fprintf(stderr, "bench gemm: --trace failed\n");
  cudaFree(d);
  free(h);
  return rc;
}

/* Kind k as one cuBLAS GEMM an expert, in column-major terms (row-major C[rows, N] = A[rows,
 * K] op(B) is C^T = op(B)^T A^T): op[0] A, op[1] B, op[2] C, each a weight (w_stride
 * elements an expert) or rows (w_stride 0: the expert's rows from its first, ld elements a
 * row); one of m, n, k is -1: the expert's rows. */
typedef struct cub_op {
  const void *p;
  int ld, esz;
  long long w_stride;
} cub_op;
typedef struct cub_desc {
  cublasOperation_t ta, tb;
  int m, n, k;
  cub_op op[3];
  cudaDataType ct;
} cub_desc;
static cub_desc cub_kind(const bench *b, int k) {
  const int H = b->H, I = b->I;
  const long long wgu = 2LL * I * H, wd = (long long)H * I;
  const cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
  const int f32 = k == K_WGATEUP32 || k == K_WDOWN32;
  cub_desc d;
  switch (k) {
    case K_GATEUP: /* gu[R, 2I] = x[R, H] Wgu[2I, H]^T: col-major gu^T = Wgu^T(T) x^T */
      d = {T, N, 2 * I, -1, H, {{b->wgu_cub, H, 2, wgu}, {b->x, H, 2, 0}, {b->cub_out, 2 * I, 2, 0}}, CUDA_R_16BF};
      break;
    case K_DOWN: /* y[R, H] = act[R, I] Wd[H, I]^T */
      d = {T, N, H, -1, I, {{b->wd, I, 2, wd}, {b->act, I, 2, 0}, {b->cub_out, H, 2, 0}}, CUDA_R_16BF};
      break;
    case K_DDOWN: /* da[R, I] = dy[R, H] Wd[H, I] */
      d = {N, N, I, -1, H, {{b->wd, I, 2, wd}, {b->dy, H, 2, 0}, {b->cub_out, I, 2, 0}}, CUDA_R_16BF};
      break;
    case K_DGATEUP: /* dx[R, H] = dgu[R, 2I] Wgu[2I, H] */
      d = {N, N, H, -1, 2 * I, {{b->wgu_cub, H, 2, wgu}, {b->dgu, 2 * I, 2, 0}, {b->cub_out, H, 2, 0}}, CUDA_R_16BF};
      break;
    case K_WGATEUP:
    case K_WGATEUP32: /* dWgu[2I, H] = dgu[R, 2I]^T x[R, H]: col-major dWgu^T = x^T(N) dgu(T) */
      d = {N, T, H, 2 * I, -1, {{b->x, H, 2, 0}, {b->dgu, 2 * I, 2, 0}, {b->cub_dw, H, f32 ? 4 : 2, wgu}},
           f32 ? CUDA_R_32F : CUDA_R_16BF};
      break;
    default: /* K_WDOWN, K_WDOWN32: dWd[H, I] = dy[R, H]^T act[R, I] */
      d = {N, T, I, H, -1, {{b->act, I, 2, 0}, {b->dy, H, 2, 0}, {b->cub_dw, I, f32 ? 4 : 2, wd}},
           f32 ? CUDA_R_32F : CUDA_R_16BF};
      break;
  }
  return d;
}

/* Kind k on the balanced rows: one strided-batched call, E_l batches of rows_bal rows. */
static int run_cublas(bench *b, void *ctx) {
  const int k = (int)(intptr_t)ctx;
  const float one = 1.f, zero = 0.f;
  const cub_desc d = cub_kind(b, k);
  const int R = b->rows_bal;
  long long st[3];
  for (int q = 0; q < 3; ++q) st[q] = d.op[q].w_stride ? d.op[q].w_stride : b->seg_bal * d.op[q].ld;
  const cudaDataType bf = CUDA_R_16BF;
  const cublasStatus_t s = cublasGemmStridedBatchedEx(
      b->cub, d.ta, d.tb, d.m < 0 ? R : d.m, d.n < 0 ? R : d.n, d.k < 0 ? R : d.k, &one, d.op[0].p, bf, d.op[0].ld,
      st[0], d.op[1].p, bf, d.op[1].ld, st[1], &zero, (void *)d.op[2].p, d.ct, d.op[2].ld, st[2], b->E,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "bench gemm: cuBLAS %s: status %d\n", kKindName[k], (int)s);
    return 1;
  }
  return 0;
}

/* --vs-cublas-zipf: kind k on the zipf rows as cuBLAS runs uneven experts today, one GEMM
 * an expert with rows (n of them): in one grouped call (cublasGemmGroupedBatchedEx, the
 * pointers in device memory) or in a loop of cublasGemmEx calls. */
struct cub_groups {
  int n, kind;
  int grouped_ok; /* 0: this cuBLAS's grouped call does not take the kind's types */
  cublasOperation_t *ta, *tb;
  int *m, *nn, *kk, *lda, *ldb, *ldc, *size;
  float *alpha, *beta;
  const void **hp; /* [3][E]: A, B, C */
  void **dp;       /* its device copy */
};
static void *cub_ptr(const cub_op &o, int e, int64_t off) {
  return (char *)o.p + (size_t)o.esz * (size_t)(o.w_stride ? e * o.w_stride : off * o.ld);
}
static int cub_zipf_prep(bench *b, int k) {
  struct cub_groups *g = b->cg;
  const cub_desc d = cub_kind(b, k);
  const int E = b->E;
  g->n = 0, g->kind = k, g->grouped_ok = 1;
  for (int e = 0; e < E; ++e) {
    const int r = b->cnt_h[e], q = g->n;
    if (!r) continue;
    g->ta[q] = d.ta, g->tb[q] = d.tb, g->m[q] = d.m < 0 ? r : d.m, g->nn[q] = d.n < 0 ? r : d.n;
    g->kk[q] = d.k < 0 ? r : d.k, g->lda[q] = d.op[0].ld, g->ldb[q] = d.op[1].ld, g->ldc[q] = d.op[2].ld;
    g->alpha[q] = 1.f, g->beta[q] = 0.f, g->size[q] = 1;
    for (int o = 0; o < 3; ++o) g->hp[o * E + q] = cub_ptr(d.op[o], e, b->off_h[e]);
    g->n++;
  }
  BCUDA(cudaMemcpy(g->dp, g->hp, sizeof(void *) * 3 * (size_t)E, cudaMemcpyHostToDevice));
  return 0;
}
static int run_cublas_grouped(bench *b, void *ctx) {
  (void)ctx;
  const struct cub_groups *g = b->cg;
  const int E = b->E;
  const cublasStatus_t s = cublasGemmGroupedBatchedEx(
      b->cub, g->ta, g->tb, g->m, g->nn, g->kk, g->alpha, (const void *const *)g->dp, CUDA_R_16BF, g->lda,
      (const void *const *)(g->dp + E), CUDA_R_16BF, g->ldb, g->beta, g->dp + 2 * E, cub_kind(b, g->kind).ct, g->ldc,
      g->n, g->size, CUBLAS_COMPUTE_32F);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) { /* (the fp32 outputs) */
    b->cg->grouped_ok = 0;
    return 0;
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "bench gemm: cublasGemmGroupedBatchedEx %s: status %d\n", kKindName[g->kind], (int)s);
    return 1;
  }
  return 0;
}
static int run_cublas_loop(bench *b, void *ctx) {
  (void)ctx;
  const struct cub_groups *g = b->cg;
  const int E = b->E;
  const cudaDataType ct = cub_kind(b, g->kind).ct;
  for (int q = 0; q < g->n; ++q) {
    const cublasStatus_t s = cublasGemmEx(b->cub, g->ta[q], g->tb[q], g->m[q], g->nn[q], g->kk[q], &g->alpha[q],
                                          g->hp[q], CUDA_R_16BF, g->lda[q], g->hp[E + q], CUDA_R_16BF, g->ldb[q],
                                          &g->beta[q], (void *)g->hp[2 * E + q], ct, g->ldc[q], CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      fprintf(stderr, "bench gemm: cublasGemmEx %s: status %d\n", kKindName[g->kind], (int)s);
      return 1;
    }
  }
  return 0;
}

/* The two cuBLAS forms must compute the same thing: each writes, from a NaN-filled output,
 * the first and last output rows (ldc elements each, in column-major terms) of every
 * expert's GEMM; -1 on a failed call, else the relative L2 difference between the two
 * forms on those rows (+inf where one left NaN; where the grouped call does not take the
 * kind's types (grouped_ok 0), 0 if the loop wrote every such row). */
static double cub_zipf_agree(bench *b) {
  const struct cub_groups *g = b->cg;
  const int E = b->E, esz = cub_kind(b, g->kind).ct == CUDA_R_32F ? 4 : 2;
  size_t cols = 0;
  for (int q = 0; q < g->n; ++q) cols += 2 * (size_t)g->ldc[q];
  float *v[2] = {(float *)malloc(cols * sizeof(float)), (float *)malloc(cols * sizeof(float))};
  void *row = malloc((size_t)4 * (b->H > 2 * b->I ? b->H : 2 * b->I));
  double r = -1;
  for (int f = 0; f < 2 && v[0] && v[1] && row; ++f) {
    for (int q = 0; q < g->n; ++q) /* NaN into the two rows of each output */
      for (int t = 0; t < 2; ++t)
        cudaMemset((char *)g->hp[2 * E + q] + (size_t)esz * g->ldc[q] * (t ? g->nn[q] - 1 : 0), 0xFF,
                   (size_t)esz * g->ldc[q]);
    if ((f ? run_cublas_loop : run_cublas_grouped)(b, NULL) || cudaDeviceSynchronize() != cudaSuccess) goto done;
    if (!g->grouped_ok && !f) continue; /* (v[0] stays unread) */
    size_t at = 0;
    for (int q = 0; q < g->n; ++q)
      for (int t = 0; t < 2; ++t) {
        if (cudaMemcpy(row, (char *)g->hp[2 * E + q] + (size_t)esz * g->ldc[q] * (t ? g->nn[q] - 1 : 0),
                       (size_t)esz * g->ldc[q], cudaMemcpyDeviceToHost) != cudaSuccess)
          goto done;
        for (int c = 0; c < g->ldc[q]; ++c)
          v[f][at++] = esz == 4 ? ((float *)row)[c] : (float)MOK_B2D(((uint16_t *)row)[c]);
      }
  }
  if (v[0] && v[1] && row) {
    double num = 0, den = 0;
    if (!g->grouped_ok) memcpy(v[0], v[1], cols * sizeof(float));
    for (size_t i = 0; i < cols; ++i) {
      if (v[0][i] != v[0][i] || v[1][i] != v[1][i]) { num = INFINITY; break; }
      num += ((double)v[0][i] - v[1][i]) * ((double)v[0][i] - v[1][i]), den += (double)v[1][i] * v[1][i];
    }
    r = isinf(num) ? INFINITY : den > 0 ? sqrt(num / den) : num > 0 ? INFINITY : 0;
  }
done:
  free(v[0]);
  free(v[1]);
  free(row);
  return r;
}

/* ---- correctness on sampled rows -------------------------------------------------------- */
static int copy_rows(uint16_t *dst, const mokBf16 *src, int64_t row, int64_t n, int cols) {
  BCUDA(cudaMemcpy(dst, src + row * cols, (size_t)n * cols * 2, cudaMemcpyDeviceToHost));
  return 0;
}

/* Relative error of kind k on sampled rows; +inf on NaN or unwritten output. */
static double check_kind(bench *b, int k) {
  const int E = b->E, H = b->H, I = b->I;
  const int experts[3] = {0, E / 2, E - 1};
  mokGemmErr_t err = {0, 0, 0};
  const size_t wsz = (size_t)I * H;
  uint16_t *w0 = (uint16_t *)malloc(wsz * 2), *w1 = (uint16_t *)malloc(wsz * 2);
  const int maxd = H > 2 * I ? H : 2 * I;
  uint16_t *r_in = (uint16_t *)malloc((size_t)maxd * 2), *r_aux = (uint16_t *)malloc((size_t)maxd * 2),
           *r_out = (uint16_t *)malloc((size_t)maxd * 4);
  double *d1 = (double *)malloc(sizeof(double) * maxd), *d2 = (double *)malloc(sizeof(double) * maxd),
         *d3 = (double *)malloc(sizeof(double) * maxd);
  int fail = 0;
  for (int xi = 0; xi < 3 && !fail; ++xi) {
    const int e = experts[xi];
    if (xi > 0 && e == experts[xi - 1]) continue;
    const int64_t o = b->off_h[e], n = b->cnt_h[e], seg = b->off_h[e + 1] - b->off_h[e];
    if (k <= K_DGATEUP) {
      if (n == 0) continue;
      /* weights of expert e */
      if (k == K_GATEUP || k == K_DGATEUP) {
        fail |= copy_rows(w0, b->wg, (int64_t)e * I, I, H);
        fail |= copy_rows(w1, b->wu, (int64_t)e * I, I, H);
      } else {
        fail |= copy_rows(w0, b->wd, (int64_t)e * H, H, I);
      }
      const int64_t pick[2] = {o, o + n - 1};
      for (int pi = 0; pi < 2 && !fail; ++pi) {
        const int64_t r = pick[pi];
        if (pi == 1 && n == 1) break;
        if (k == K_GATEUP) {
          fail |= copy_rows(r_in, b->x, r, 1, H) | copy_rows(r_out, b->gu, r, 1, 2 * I) |
                  copy_rows(r_aux, b->act, r, 1, I);
          mok_ref_gateup_row(r_in, w0, w1, H, I, b->limit, d1, d2, d3);
          for (int i = 0; i < I; ++i) { /* (a g or u clamped on one side only at the limit: skipped) */
            const double g = MOK_B2D(r_out[i]), u = MOK_B2D(r_out[I + i]);
            if (!mok_clamp_boundary(g, d1[i], r_in, w0 + (size_t)i * H, H, b->limit)) mok_gemm_err_add(&err, g, d1[i]);
            if (!mok_clamp_boundary(u, d2[i], r_in, w1 + (size_t)i * H, H, b->limit)) mok_gemm_err_add(&err, u, d2[i]);
            mok_gemm_err_add(&err, MOK_B2D(r_aux[i]), d3[i]);
          }
        } else if (k == K_DOWN) {
          fail |= copy_rows(r_in, b->act, r, 1, I) | copy_rows(r_out, b->y, r, 1, H);
          mok_ref_down_row(r_in, w0, H, I, d1);
          for (int h = 0; h < H; ++h) mok_gemm_err_add(&err, MOK_B2D(r_out[h]), d1[h]);
        } else if (k == K_DDOWN) {
          fail |= copy_rows(r_in, b->dy, r, 1, H) | copy_rows(r_aux, b->gu, r, 1, 2 * I) |
                  copy_rows(r_out, b->dgu, r, 1, 2 * I);
          mok_ref_down_dgrad_row(r_in, w0, r_aux, H, I, b->limit, d1, d2);
          for (int i = 0; i < I; ++i) {
            mok_gemm_err_add(&err, MOK_B2D(r_out[i]), d1[i]);
            mok_gemm_err_add(&err, MOK_B2D(r_out[I + i]), d2[i]);
          }
        } else {
          fail |= copy_rows(r_in, b->dgu, r, 1, 2 * I) | copy_rows(r_out, b->dx, r, 1, H);
          mok_ref_gateup_dgrad_row(r_in, w0, w1, H, I, d1);
          for (int h = 0; h < H; ++h) mok_gemm_err_add(&err, MOK_B2D(r_out[h]), d1[h]);
        }
      }
    } else {
      const int fp32 = k == K_WGATEUP32 || k == K_WDOWN32;
      const int gate = k == K_WGATEUP || k == K_WGATEUP32;
      const int lda = gate ? 2 * I : H, N = gate ? H : I, M = gate ? 2 * I : H;
      uint16_t *A = (uint16_t *)malloc((size_t)(seg ? seg : 1) * lda * 2);
      uint16_t *B = (uint16_t *)malloc((size_t)(seg ? seg : 1) * N * 2);
      if (seg) {
        fail |= copy_rows(A, gate ? b->dgu : b->dy, o, seg, lda);
        fail |= copy_rows(B, gate ? b->x : b->act, o, seg, N);
      }
      const int ms[3] = {0, M / 2 + 1, M - 1};
      for (int mi = 0; mi < 3 && !fail; ++mi) {
        const int m = ms[mi];
        mok_ref_wgrad_row(A, lda, m, B, N, seg, d1);
        const void *base;
        size_t idx;
        if (gate) {
          base = m < I ? b->dw0 : b->dw1;
          idx = ((size_t)e * I + (m < I ? m : m - I)) * N;
        } else {
          base = b->dw2;
          idx = ((size_t)e * H + m) * N;
        }
        if (cudaMemcpy(r_out, (const char *)base + idx * (fp32 ? 4 : 2), (size_t)N * (fp32 ? 4 : 2),
                       cudaMemcpyDeviceToHost) != cudaSuccess)
          fail = 1;
        for (int nn = 0; nn < N; ++nn)
          mok_gemm_err_add(&err, fp32 ? (double)((float *)r_out)[nn] : MOK_B2D(r_out[nn]), d1[nn]);
      }
      free(A);
      free(B);
    }
  }
  free(w0); free(w1); free(r_in); free(r_aux); free(r_out); free(d1); free(d2); free(d3);
  return fail ? INFINITY : mok_gemm_err_rel(&err);
}

/* NaN scan of the output of kind k over every row in use. */
static int nan_count(bench *b, int k) {
  const int64_t used = b->rows_used, E = b->E;
  int h = 0, total = 0;
  struct { const void *p; int64_t rows; int cols; int fp32; } o[3];
  int n = 0;
  switch (k) {
    case K_GATEUP: o[n++] = {b->act, used, b->I, 0}; o[n++] = {b->gu, used, 2 * b->I, 0}; break;
    case K_DOWN: o[n++] = {b->y, used, b->H, 0}; break;
    case K_DDOWN: o[n++] = {b->dgu, used, 2 * b->I, 0}; break;
    case K_DGATEUP: o[n++] = {b->dx, used, b->H, 0}; break;
    case K_WGATEUP: case K_WGATEUP32:
      o[n++] = {b->dw0, E * b->I, b->H, k == K_WGATEUP32}; o[n++] = {b->dw1, E * b->I, b->H, k == K_WGATEUP32}; break;
    default: o[n++] = {b->dw2, E * b->H, b->I, k == K_WDOWN32}; break;
  }
  for (int i = 0; i < n; ++i) {
    if (mok_gemm_count_nan(o[i].p, o[i].rows, o[i].cols, o[i].fp32, b->bad, 0) != mokSuccess) return -1;
    if (cudaMemcpy(&h, b->bad, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
    total += h;
  }
  return total;
}

static void poison(bench *b, int k) {
  const size_t used = (size_t)b->rows_used, wsz = (size_t)b->E * b->I * b->H;
  switch (k) {
    case K_GATEUP: cudaMemset(b->act, 0xFF, used * b->I * 2); cudaMemset(b->gu, 0xFF, used * b->I * 4); break;
    case K_DOWN: cudaMemset(b->y, 0xFF, used * b->H * 2); break;
    case K_DDOWN: cudaMemset(b->dgu, 0xFF, used * b->I * 4); break;
    case K_DGATEUP: cudaMemset(b->dx, 0xFF, used * b->H * 2); break;
    default: cudaMemset(b->dw0, 0xFF, wsz * 4); cudaMemset(b->dw1, 0xFF, wsz * 4); cudaMemset(b->dw2, 0xFF, wsz * 4);
  }
}

static int bench_kind(bench *b, int k) {
  const double E = b->E, H = b->H, I = b->I, R = (double)b->rows_real, U = (double)b->rows_used;
  double flop = 0, bytes = 0;
  const double W = E * H * I * 2; /* one weight matrix, bf16 */
  switch (k) {
    case K_GATEUP: flop = 2 * R * 2 * I * H; bytes = 2 * W + U * H * 2 + U * I * 2 * 3; break;
    case K_DOWN: flop = 2 * R * H * I; bytes = W + U * I * 2 + U * H * 2; break;
    case K_DDOWN: flop = 2 * R * I * H; bytes = W + U * H * 2 + U * I * 4 * 2; break;
    case K_DGATEUP: flop = 2 * R * H * 2 * I; bytes = 2 * W + U * I * 4 + U * H * 2; break;
    case K_WGATEUP: flop = 2 * R * 2 * I * H; bytes = 2 * W + U * I * 4 + U * H * 2; break;
    case K_WDOWN: flop = 2 * R * H * I; bytes = W + U * H * 2 + U * I * 2; break;
    case K_WGATEUP32: flop = 2 * R * 2 * I * H; bytes = 4 * W + U * I * 4 + U * H * 2; break;
    case K_WDOWN32: flop = 2 * R * H * I; bytes = 2 * W + U * H * 2 + U * I * 2; break;
  }
  poison(b, k);
  if (getenv("MOK_BENCH_VERBOSE")) fprintf(stderr, "[%s: run]\n", kKindName[k]);
  if (run_ours(b, (void *)(intptr_t)k)) return 1;
  BCUDA(cudaDeviceSynchronize());
  if (getenv("MOK_BENCH_VERBOSE")) fprintf(stderr, "[%s: check]\n", kKindName[k]);
  const int nans = nan_count(b, k);
  const double rel = nans ? INFINITY : check_kind(b, k);
  const int ok = rel < 1e-2;
  if (!ok) b->wrong = 1;
  float ms = 0, cms = 0;
  if (time_pair(b, run_ours, run_cublas, (void *)(intptr_t)k, &ms, &cms)) return 1;
  b->cub_ms[k] = cms;
  if (b->trace && (k == K_GATEUP || k == K_DOWN) && trace_kind(b, k)) return 1;
  float zms = 0, bms = 0;
  if (b->vs_bal) { /* balanced inputs, the pair, then the run's own inputs back */
    if (fill_kind(b, k, b->off_bal, b->cnt_bal) ||
        time_pair(b, run_ours, run_ours_bal, (void *)(intptr_t)k, &zms, &bms) || fill_kind(b, k, b->off, b->cnt))
      return 1;
    BCUDA(cudaDeviceSynchronize());
  }
  /* --vs-cublas-zipf: cuBLAS on the zipf rows, as one grouped call and as a GEMM an expert,
   * each timed in turn with ours (the loop's host work, ~10 us a call, hidden behind a
   * longer spin) once the two are seen to agree */
  float gz = 0, gms = 0, lz = 0, lms = 0;
  double agree = 0;
  if (b->vs_cub_zipf) {
    if (cub_zipf_prep(b, k) || (agree = cub_zipf_agree(b)) < 0) return 1;
    if (!(agree < 1e-2)) {
      fprintf(stderr, "bench gemm: %s: cuBLAS's grouped call and its GEMM an expert differ on the zipf rows (%.2e)\n",
              kKindName[k], agree);
      b->wrong = 1;
    }
    if (!b->cg->grouped_ok) gz = 1, gms = INFINITY; /* not timed */
    else if (time_pair(b, run_ours, run_cublas_grouped, (void *)(intptr_t)k, &gz, &gms)) return 1;
    b->spin_ns = 50000ull + 10000ull * (unsigned long long)b->cg->n;
    const int rc = time_pair(b, run_ours, run_cublas_loop, (void *)(intptr_t)k, &lz, &lms);
    b->spin_ns = 0;
    if (rc) return 1;
  }
  /* cuBLAS does the same useful work on balanced rows: rows_bal * E (== R when balanced) */
  const double cflop = flop / R * ((double)b->rows_bal * E);
  const double tf = flop / (ms * 1e-3) / 1e12, ctf = cflop / (cms * 1e-3) / 1e12;
  printf("%-20s %-24s %8.3f %8.1f %8.3f %8.1f %6.3f %8.0f %9.2e%s\n", kKindName[k], b->shape, ms, tf, cms, ctf,
         tf / ctf, bytes / (ms * 1e-3) / 1e9, rel, ok ? "" : (nans ? "  UNWRITTEN/NaN" : "  WRONG"));
  if (b->vs_bal)
    printf("%-20s %-24s %8.3f %8.1f  %s / balanced rows, ours in turn: %.3f (%s %.3f ms)\n", "", "balanced rows",
           bms, flop / (bms * 1e-3) / 1e12, b->uneven, bms / zms, b->uneven, zms);
  const int grp = gms <= lms; /* the faster cuBLAS form on the zipf rows */
  const double cz_ms = grp ? gms : lms, ours_cz = b->vs_cub_zipf ? (grp ? gms / gz : lms / lz) : 0;
  const double cz_tf = b->vs_cub_zipf ? flop / (cz_ms * 1e-3) / 1e12 : 0;
  char gtxt[48];
  if (b->vs_cub_zipf && b->cg->grouped_ok) snprintf(gtxt, sizeof gtxt, "%.3f", gms);
  else snprintf(gtxt, sizeof gtxt, "n/a (not for these types)");
  if (b->vs_cub_zipf)
    printf("%-20s %-24s %8.3f %8.1f  cuBLAS on the %s rows (%s faster): grouped %s ms, a GEMM an expert %.3f ms; "
           "ours / it, in turn: %.3f; its %s / its balanced: %.3f\n",
           "", !strcmp(b->uneven, "zipf") ? "cuBLAS zipf rows" : "cuBLAS random rows", cz_ms, cz_tf, b->uneven,
           grp ? "grouped" : "per expert", gtxt, lms, ours_cz, b->uneven, cz_tf / ctf);
  if (b->sclk && (k == K_GATEUP || k == K_DOWN) && sclk_kind(b, k)) return 1;
  if (b->json) {
    fprintf(b->json,
            "%s\n  {\"kind\": \"%s\", \"experts\": %d, \"hidden\": %d, \"inter\": %d, \"rows\": %lld, "
            "\"rows_used\": %lld, \"ms\": %.5f, \"tflops\": %.2f, \"cublas_ms\": %.5f, \"cublas_tflops\": %.2f, "
            "\"ratio\": %.4f, \"hbm_gbs\": %.1f, \"rel_err\": %.3e, \"ok\": %s",
            b->json_first ? "" : ",", kKindName[k], b->E, b->H, b->I, (long long)b->rows_real,
            (long long)b->rows_used, ms, tf, cms, ctf, tf / ctf, bytes / (ms * 1e-3) / 1e9, isfinite(rel) ? rel : -1.0,
            ok ? "true" : "false");
    if (b->vs_bal)
      fprintf(b->json, ", \"zipf_ms\": %.5f, \"balanced_ms\": %.5f, \"zipf_over_balanced\": %.4f", zms, bms,
              bms / zms);
    if (b->vs_cub_zipf)
      fprintf(b->json,
              ", \"cublas_zipf_grouped_ms\": %.5f, \"cublas_zipf_loop_ms\": %.5f, \"cublas_zipf_tflops\": %.2f, "
              "\"ours_over_cublas_zipf\": %.4f, \"cublas_zipf_over_balanced\": %.4f, \"cublas_zipf_forms_diff\": %.3e",
              isfinite(gms) ? gms : -1.0, lms, cz_tf, ours_cz, cz_tf / ctf, isfinite(agree) ? agree : -1.0);
    fprintf(b->json, "}");
    b->json_first = 0;
  }
  return 0;
}

/* ---- the fused forward (--ffn) ---------------------------------------------------------- */
/* ctx 1: mok_gemm_ffn_fwd with the fused launch; 0: the same call making the two launches */
static int run_ffn(bench *b, void *ctx) {
  if (mok_gemm_debug_ffn(ctx ? 1 : 2) != mokSuccess ||
      mok_gemm_ffn_fwd(&b->rows, b->H, b->I, b->limit, b->x, b->wg, b->wu, b->wd, b->act, b->gu, b->y, 0) !=
          mokSuccess) {
    fprintf(stderr, "bench gemm: fused forward: %s\n", mokGetLastError());
    mok_gemm_debug_ffn(0);
    return 1;
  }
  return mok_gemm_debug_ffn(0) != mokSuccess;
}
static int run_ffn_fused(bench *b, void *ctx) { return run_ffn(b, (void *)1); }
static int run_ffn_two(bench *b, void *ctx) { return run_ffn(b, NULL); }

/* act, g|u and y of one forward into host memory (h: rows_used * (3I + H) values). */
static int ffn_snapshot(bench *b, int fused, uint16_t *h) {
  const size_t u = (size_t)b->rows_used;
  if (run_ffn(b, fused ? (void *)1 : NULL)) return 1;
  BCUDA(cudaMemcpy(h, b->act, u * b->I * 2, cudaMemcpyDeviceToHost));
  BCUDA(cudaMemcpy(h + u * b->I, b->gu, u * b->I * 4, cudaMemcpyDeviceToHost));
  BCUDA(cudaMemcpy(h + u * b->I * 3, b->y, u * b->H * 2, cudaMemcpyDeviceToHost));
  return 0;
}

/* The fused forward against the two launches it replaces (ours, in turn), both checked to
 * agree in every bit; beside cuBLAS's two GEMMs of this run (their medians above). */
static int bench_ffn(bench *b) {
  const size_t n = (size_t)b->rows_used * (3 * (size_t)b->I + b->H);
  uint16_t *h0 = (uint16_t *)malloc(n * 2), *h1 = (uint16_t *)malloc(n * 2);
  unsigned long long n0 = 0, n1 = 0;
  int rc = !h0 || !h1 || ffn_snapshot(b, 0, h0) || mok_gemm_debug_ffn_launches(&n0) != mokSuccess ||
           ffn_snapshot(b, 1, h1) || mok_gemm_debug_ffn_launches(&n1) != mokSuccess;
  size_t diff = 0;
  for (size_t i = 0; !rc && i < n; ++i) diff += h0[i] != h1[i];
  free(h0);
  free(h1);
  if (rc) return 1;
  if (diff) {
    fprintf(stderr, "bench gemm: the fused forward differs from the two launches in %zu of %zu outputs\n", diff, n);
    b->wrong = 1;
  }
  float fms = 0, tms = 0;
  if (time_pair(b, run_ffn_fused, run_ffn_two, NULL, &fms, &tms)) return 1;
  const double flop = 2.0 * (double)b->rows_real * 3.0 * b->I * b->H;
  const double cms = b->cub_ms[K_GATEUP] + b->cub_ms[K_DOWN];
  printf("%-20s %-24s %8.3f %8.1f  two launches %.3f ms (%.1f): fused / two %.3f; cuBLAS gate+up + down %.3f ms: "
         "ours fused / it %.3f; bitwise %s%s\n",
         "fused gate+up+down", b->shape, fms, flop / (fms * 1e-3) / 1e12, tms, flop / (tms * 1e-3) / 1e12, tms / fms,
         cms, cms > 0 ? cms / fms : 0.0, diff ? "DIFFERENT" : "equal",
         n1 == n0 + 1 ? "" : " (NOT FUSED: the library made the two launches; see mok_gemm_ffn_fwd)");
  if (b->json)
    fprintf(b->json,
            "%s\n  {\"kind\": \"fused gate+up+down\", \"experts\": %d, \"hidden\": %d, \"inter\": %d, "
            "\"rows\": %lld, \"ms\": %.5f, \"tflops\": %.2f, \"two_launches_ms\": %.5f, \"cublas_ms\": %.5f, "
            "\"bitwise\": %s}",
            b->json_first ? "" : ",", b->E, b->H, b->I, (long long)b->rows_real, fms, flop / (fms * 1e-3) / 1e12, tms,
            cms, diff ? "false" : "true");
  b->json_first = 0;
  return 0;
}

/* ---- main ----------------------------------------------------------------------------- */
static int bench_main(int argc, char **argv, bench *b) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* rows appear as they are measured, even under a pipe */
  const model_shape *m = &kModels[0];
  int H = 0, I = 0, E = 0, R = -1;
  double zipf = 0;
  int zipf_order = 0; /* 0: expert e holds rank e's count; 1: shuffled; 2: reversed */
  unsigned long long rnd = 0; /* --routing random[:SEED]: the seed (0: not random routing) */
  const char *json = NULL, *trace = NULL;
  b->iters = 20;
  int sched = 0, split = 1, counts = 1, raster = 0, tok_units = 0, mix = 0, epi_debug = 0, pairs = 0, stagger = 0;
  unsigned long long seed_arg = 0;
  int seed_given = 0;
  int vs_bal = -1; /* --vs-balanced: -1 the default (on with zipf routing) */
  int vs_cz = -1;  /* --vs-cublas-zipf: likewise */
  int ctas = 0; /* --ctas: diagnostics, at most this many CTAs a launch */
  int tok_ring = 0, row_box = 0, mix_ctas = 0, eager_rows = -1, gu_box = 0, promo_w = -1, promo_r = -1, cold_evict = 0;
  unsigned kinds = (1u << K_N) - 1;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 2; }
    if (!v) { usage(); return 2; }
    ++i;
    if (!strcmp(a, "--model")) {
      m = NULL;
      for (size_t j = 0; j < sizeof kModels / sizeof kModels[0]; ++j)
        if (!strcmp(v, kModels[j].name)) m = &kModels[j];
      if (!m) { fprintf(stderr, "bench gemm: unknown model '%s'\n", v); usage(); return 2; }
    } else if (!strcmp(a, "--hidden")) H = atoi(v);
    else if (!strcmp(a, "--inter")) I = atoi(v);
    else if (!strcmp(a, "--experts")) E = atoi(v);
    else if (!strcmp(a, "--rows-per-expert")) R = atoi(v);
    else if (!strcmp(a, "--iters")) b->iters = atoi(v);
    else if (!strcmp(a, "--seed")) {
      char *end = NULL;
      seed_given = strcmp(v, "clock") != 0;
      if (seed_given) seed_arg = strtoull(v, &end, 0);
      if (seed_given && (!*v || *end || *v == '-')) { fprintf(stderr, "bench gemm: --seed N|clock\n"); return 2; }
    }
    else if (!strcmp(a, "--limit")) b->limit = (float)atof(v);
    else if (!strcmp(a, "--sched")) { /* diagnostics: how tiles reach CTAs */
      sched = !strcmp(v, "static") ? 1 : !strcmp(v, "tickets") ? 2 : !strcmp(v, "auto") ? 0 : -1;
      if (sched < 0) { fprintf(stderr, "bench gemm: --sched auto|static|tickets\n"); return 2; }
    } else if (!strcmp(a, "--tail")) {
      split = !strcmp(v, "split") ? 1 : !strcmp(v, "one") ? 0 : -1;
      if (split < 0) { fprintf(stderr, "bench gemm: --tail split|one\n"); return 2; }
    }
    else if (!strcmp(a, "--counts")) {
      counts = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -1;
      if (counts < 0) { fprintf(stderr, "bench gemm: --counts on|off\n"); return 2; }
    } else if (!strcmp(a, "--raster")) {
      raster = atoi(v);
      if (raster < 1) { fprintf(stderr, "bench gemm: --raster N, N >= 1\n"); return 2; }
    } else if (!strcmp(a, "--epi-debug")) {
      epi_debug = atoi(v);
      if (epi_debug < 0 || epi_debug > 2) { fprintf(stderr, "bench gemm: --epi-debug 0|1|2\n"); return 2; }
    } else if (!strcmp(a, "--mix")) {
      mix = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 2 : -1;
      if (mix < 0) { fprintf(stderr, "bench gemm: --mix on|off\n"); return 2; }
    } else if (!strcmp(a, "--pairs")) {
      pairs = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 2 : !strcmp(v, "solo") ? 3 : -1;
      if (pairs < 0) { fprintf(stderr, "bench gemm: --pairs on|off|solo\n"); return 2; }
    } else if (!strcmp(a, "--stagger")) {
      stagger = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 2 : -1;
      if (stagger < 0) { fprintf(stderr, "bench gemm: --stagger on|off\n"); return 2; }
    } else if (!strcmp(a, "--tok-ring")) {
      tok_ring = !strcmp(v, "128") ? 1 : !strcmp(v, "176") ? 2 : !strcmp(v, "auto") ? 0 : -1;
      if (tok_ring < 0) { fprintf(stderr, "bench gemm: --tok-ring auto|176|128\n"); return 2; }
    } else if (!strcmp(a, "--row-box")) {
      row_box = atoi(v) == 128 ? 1 : atoi(v) == 32 ? 2 : -1;
      if (row_box < 0) { fprintf(stderr, "bench gemm: --row-box 32|128\n"); return 2; }
    } else if (!strcmp(a, "--l2-promo")) {
      if (sscanf(v, "%d,%d", &promo_w, &promo_r) != 2 || mok_gemm_debug_l2_promotion(promo_w, promo_r) != mokSuccess) {
        fprintf(stderr, "bench gemm: --l2-promo W,R: bytes of weights and rows, each 0, 64, 128 or 256\n");
        return 2;
      }
    } else if (!strcmp(a, "--expert-order")) {
      const int m = !strcmp(v, "load") ? 1 : !strcmp(v, "index") ? 2 : !strcmp(v, "auto") ? 0 : -1;
      if (m < 0 || mok_gemm_debug_expert_order(m) != mokSuccess) {
        fprintf(stderr, "bench gemm: --expert-order auto|load|index\n");
        return 2;
      }
    } else if (!strcmp(a, "--cold-evict")) {
      cold_evict = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 2 : -1;
      if (cold_evict < 0) { fprintf(stderr, "bench gemm: --cold-evict on|off\n"); return 2; }
    } else if (!strcmp(a, "--gu-order")) {
      b->up_first = !strcmp(v, "up-first") ? 1 : !strcmp(v, "gate-first") ? 0 : -1;
      if (b->up_first < 0) { fprintf(stderr, "bench gemm: --gu-order gate-first|up-first\n"); return 2; }
    } else if (!strcmp(a, "--mix-ctas")) {
      mix_ctas = atoi(v);
      if (mix_ctas < -1) { fprintf(stderr, "bench gemm: --mix-ctas P, P >= -1\n"); return 2; }
    } else if (!strcmp(a, "--ctas")) {
      ctas = atoi(v);
      if (ctas < 1) { fprintf(stderr, "bench gemm: --ctas N, N >= 1\n"); return 2; }
    } else if (!strcmp(a, "--ddown-tok")) {
      const int m = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 2 : -1;
      if (m < 0 || mok_gemm_debug_ddown_tok(m) != mokSuccess) { fprintf(stderr, "bench gemm: --ddown-tok on|off\n"); return 2; }
    } else if (!strcmp(a, "--gu-tiles")) {
      const int m = !strcmp(v, "grouped") ? 1 : !strcmp(v, "token-n") ? 2 : !strcmp(v, "token-m") ? 3 : -1;
      if (m < 0 || mok_gemm_debug_gu_rows(m) != mokSuccess) {
        fprintf(stderr, "bench gemm: --gu-tiles grouped|token-n|token-m\n");
        return 2;
      }
    } else if (!strcmp(a, "--dn-tiles")) { /* the down kind's 128-row token tiles: rows as N or M */
      const int m = !strcmp(v, "token-m") ? 2 : !strcmp(v, "token-n") ? 1 : -1;
      if (m < 0 || mok_gemm_debug_dn_rows(m) != mokSuccess) { fprintf(stderr, "bench gemm: --dn-tiles token-n|token-m\n"); return 2; }
    } else if (!strcmp(a, "--gu-box")) {
      gu_box = !strcmp(v, "one") ? 1 : !strcmp(v, "four") ? 2 : !strcmp(v, "two") ? 3 : -1;
      if (gu_box < 0) { fprintf(stderr, "bench gemm: --gu-box one|two|four\n"); return 2; }
    } else if (!strcmp(a, "--eager-rows")) {
      eager_rows = atoi(v);
      if (eager_rows < -1) { fprintf(stderr, "bench gemm: --eager-rows N, N >= -1\n"); return 2; }
    } else if (!strcmp(a, "--tok-units")) {
      tok_units = atoi(v);
      if (tok_units < 1 || tok_units > 11) { fprintf(stderr, "bench gemm: --tok-units U, 1 <= U <= 11\n"); return 2; }
    }
    else if (!strcmp(a, "--ffn")) {
      b->ffn = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -2;
      if (b->ffn < 0) { fprintf(stderr, "bench gemm: --ffn on|off\n"); return 2; }
    }
    else if (!strcmp(a, "--kinds")) {
      kinds = 0;
      for (const char *q = v; *q;) {
        const size_t len = strcspn(q, ",");
        int found = -1;
        for (int k = 0; k < K_N; ++k)
          if (strlen(kKindFlag[k]) == len && !strncmp(q, kKindFlag[k], len)) found = k;
        if (found < 0) { fprintf(stderr, "bench gemm: --kinds: unknown kind '%.*s'\n", (int)len, q); return 2; }
        kinds |= 1u << found;
        q += len + (q[len] == ',');
      }
    }
    else if (!strcmp(a, "--json")) json = v;
    else if (!strcmp(a, "--trace")) trace = v;
    else if (!strcmp(a, "--stage-clock")) {
      b->sclk = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -1;
      if (b->sclk < 0) { fprintf(stderr, "bench gemm: --stage-clock on|off\n"); return 2; }
    }
    else if (!strcmp(a, "--vs-balanced")) {
      vs_bal = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -2;
      if (vs_bal < -1) { fprintf(stderr, "bench gemm: --vs-balanced on|off\n"); return 2; }
    }
    else if (!strcmp(a, "--vs-cublas-zipf")) {
      vs_cz = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -2;
      if (vs_cz < -1) { fprintf(stderr, "bench gemm: --vs-cublas-zipf on|off\n"); return 2; }
    }
    else if (!strcmp(a, "--routing")) {
      char *end = NULL;
      if (!strcmp(v, "uniform")) zipf = 0, rnd = 0;
      else if (!strcmp(v, "random")) zipf = 0, rnd = 1;
      else if (!strncmp(v, "random:", 7) && (rnd = strtoull(v + 7, &end, 10)) > 0 && end && !*end) zipf = 0;
      else if (!strncmp(v, "zipf:", 5) && atof(v + 5) > 0) {
        zipf = atof(v + 5), rnd = 0;
        const char *o = strchr(v, ',');
        zipf_order = !o ? 0 : !strcmp(o, ",shuffled") ? 1 : !strcmp(o, ",reversed") ? 2 : -1;
        if (zipf_order < 0) { fprintf(stderr, "bench gemm: --routing zipf:S[,shuffled|,reversed]\n"); return 2; }
      } else {
        fprintf(stderr, "bench gemm: --routing uniform|zipf:S[,shuffled|,reversed]|random[:SEED] (S > 0, SEED >= 1)\n");
        return 2;
      }
    } else { fprintf(stderr, "bench gemm: unknown option %s\n", a); usage(); return 2; }
  }
  mok_gemm_debug_sched(sched, split);
  mok_gemm_debug_epilogue(epi_debug);
  mok_gemm_debug_pairs(pairs);
  mok_gemm_debug_stagger(stagger);
  mok_gemm_debug_tok_ring(tok_ring);
  mok_gemm_debug_row_box128(row_box);
  mok_gemm_debug_l2_promotion(promo_w, promo_r);
  mok_gemm_debug_cold_evict(cold_evict);
  mok_gemm_debug_mix_ctas(mix_ctas);
  mok_gemm_debug_grid(ctas);
  mok_gemm_debug_eager_rows(eager_rows);
  mok_gemm_debug_gu_box(gu_box);
  if (mok_gemm_debug_tiles(raster, tok_units, mix) != mokSuccess) { fprintf(stderr, "bench gemm: %s\n", mokGetLastError()); return 2; }
  b->H = H ? H : m->H;
  b->I = I ? I : m->I;
  b->E = E ? E : m->E / 8;
  if (R < 0) R = m->rows ? m->rows : 512;
  if (b->H < 64 || b->H % 64 || b->I < 64 || b->I % 64 || b->E < 1 || b->E > MOK_GEMM_MAX_EXPERTS || R < 1 ||
      b->iters < 1) {
    fprintf(stderr, "bench gemm: need hidden, inter multiples of 64, 1 <= experts <= %d, rows >= 1, iters >= 1\n",
            MOK_GEMM_MAX_EXPERTS);
    return 2;
  }
  E = b->E;
  /* row counts */
  b->cnt_h = (int32_t *)calloc(E, sizeof(int32_t));
  b->off_h = (int32_t *)calloc(E + 1, sizeof(int32_t));
  const int64_t total = (int64_t)R * E;
  if (zipf > 0) {
    double norm = 0;
    for (int e = 0; e < E; ++e) norm += pow(e + 1.0, -zipf);
    int64_t given = 0;
    for (int e = 0; e < E; ++e) given += b->cnt_h[e] = (int32_t)floor(total * pow(e + 1.0, -zipf) / norm);
    for (int e = 0; given < total; e = (e + 1) % E, ++given) b->cnt_h[e]++;
    if (zipf_order == 2)
      for (int e = 0; e < E / 2; ++e) {
        const int32_t t = b->cnt_h[e];
        b->cnt_h[e] = b->cnt_h[E - 1 - e], b->cnt_h[E - 1 - e] = t;
      }
    if (zipf_order == 1) { /* Fisher-Yates with a fixed 64-bit LCG: the same order every run */
      uint64_t st = 0x9e3779b97f4a7c15ull;
      for (int e = E - 1; e > 0; --e) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const int j = (int)((st >> 33) % (uint64_t)(e + 1));
        const int32_t t = b->cnt_h[e];
        b->cnt_h[e] = b->cnt_h[j], b->cnt_h[j] = t;
      }
    }
  } else if (rnd) { /* each row to a uniformly drawn expert (a fixed 64-bit LCG from the seed) */
    uint64_t st = rnd * 0x9e3779b97f4a7c15ull;
    for (int64_t q = 0; q < total; ++q) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      b->cnt_h[(st >> 33) % (uint64_t)E]++;
    }
  } else {
    for (int e = 0; e < E; ++e) b->cnt_h[e] = R;
  }
  const int uneven = zipf > 0 || rnd;
  b->uneven = rnd ? "random" : "zipf";
  for (int e = 0; e < E; ++e) b->off_h[e + 1] = b->off_h[e] + (b->cnt_h[e] + 63) / 64 * 64;
  b->rows_real = total;
  b->rows_used = b->off_h[E];
  b->rows_bal = R;
  b->seg_bal = (R + 63) / 64 * 64;
  b->cap = b->rows_used > b->seg_bal * E ? b->rows_used : b->seg_bal * E;
  b->vs_bal = uneven && vs_bal != 0;
  if (vs_bal == 1 && !uneven) {
    fprintf(stderr, "bench gemm: --vs-balanced on needs --routing zipf:S or random\n");
    return 2;
  }
  b->vs_cub_zipf = uneven && vs_cz != 0;
  if (vs_cz == 1 && !uneven) {
    fprintf(stderr, "bench gemm: --vs-cublas-zipf on needs --routing zipf:S or random\n");
    return 2;
  }
  snprintf(b->shape, sizeof b->shape, "E%d H%d I%d R%d%s", E, b->H, b->I, R,
           rnd ? " random" : zipf <= 0 ? "" : zipf_order == 1 ? " zipf-shuf" : zipf_order == 2 ? " zipf-rev" : " zipf");

  BCUDA(cudaMalloc(&b->off, sizeof(int32_t) * (E + 1)));
  BCUDA(cudaMalloc(&b->cnt, sizeof(int32_t) * E));
  BCUDA(cudaMemcpy(b->off, b->off_h, sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice));
  BCUDA(cudaMemcpy(b->cnt, b->cnt_h, sizeof(int32_t) * E, cudaMemcpyHostToDevice));
  if (b->vs_bal) {
    b->off_bal_h = (int32_t *)calloc(E + 1, sizeof(int32_t));
    b->cnt_bal_h = (int32_t *)calloc(E, sizeof(int32_t));
    for (int e = 0; e < E; ++e) b->cnt_bal_h[e] = R, b->off_bal_h[e + 1] = (int32_t)((e + 1) * b->seg_bal);
    BCUDA(cudaMalloc(&b->off_bal, sizeof(int32_t) * (E + 1)));
    BCUDA(cudaMalloc(&b->cnt_bal, sizeof(int32_t) * E));
    BCUDA(cudaMemcpy(b->off_bal, b->off_bal_h, sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice));
    BCUDA(cudaMemcpy(b->cnt_bal, b->cnt_bal_h, sizeof(int32_t) * E, cudaMemcpyHostToDevice));
  }
  const size_t cap = (size_t)b->cap, Hs = b->H, Is = b->I, wsz = (size_t)E * Is * Hs;
  BCUDA(cudaMalloc(&b->x, cap * Hs * 2));
  BCUDA(cudaMalloc(&b->dy, cap * Hs * 2));
  BCUDA(cudaMalloc(&b->y, cap * Hs * 2));
  BCUDA(cudaMalloc(&b->dx, cap * Hs * 2));
  BCUDA(cudaMalloc(&b->act, cap * Is * 2));
  BCUDA(cudaMalloc(&b->gu, cap * Is * 4));
  BCUDA(cudaMalloc(&b->dgu, cap * Is * 4));
  BCUDA(cudaMalloc(&b->cub_out, cap * (Hs > 2 * Is ? Hs : 2 * Is) * 2));
  BCUDA(cudaMalloc(&b->wblk, wsz * 4)); /* W_gate, then W_up (as a layer holds them: --gu-box one) */
  b->wg = b->up_first ? b->wblk + wsz : b->wblk;
  b->wu = b->up_first ? b->wblk : b->wblk + wsz;
  BCUDA(cudaMalloc(&b->wd, wsz * 2));
  BCUDA(cudaMalloc(&b->wgu_cub, wsz * 4));
  BCUDA(cudaMalloc(&b->dw0, wsz * 4));
  BCUDA(cudaMalloc(&b->dw1, wsz * 4));
  BCUDA(cudaMalloc(&b->dw2, wsz * 4));
  BCUDA(cudaMalloc(&b->cub_dw, wsz * 8));
  BCUDA(cudaMalloc(&b->bad, sizeof(int)));
  if (b->vs_cub_zipf) {
    struct cub_groups *g = b->cg = (struct cub_groups *)calloc(1, sizeof *g);
    if (!g) return 1;
    const size_t n = (size_t)E;
    g->ta = (cublasOperation_t *)calloc(n, sizeof *g->ta), g->tb = (cublasOperation_t *)calloc(n, sizeof *g->tb);
    int **ia[] = {&g->m, &g->nn, &g->kk, &g->lda, &g->ldb, &g->ldc, &g->size};
    for (size_t i = 0; i < sizeof ia / sizeof ia[0]; ++i) *ia[i] = (int *)calloc(n, sizeof(int));
    g->alpha = (float *)calloc(n, sizeof(float)), g->beta = (float *)calloc(n, sizeof(float));
    g->hp = (const void **)calloc(3 * n, sizeof(void *));
    if (!g->ta || !g->tb || !g->m || !g->nn || !g->kk || !g->lda || !g->ldb || !g->ldc || !g->size || !g->alpha ||
        !g->beta || !g->hp) {
      fprintf(stderr, "bench gemm: out of host memory\n");
      return 1;
    }
    BCUDA(cudaMalloc(&g->dp, 3 * n * sizeof(void *)));
  }
  b->rows.num_experts = E;
  b->rows.capacity = b->cap;
  b->rows.expert_offset = b->off;
  b->rows.expert_count = counts ? b->cnt : NULL;
  b->rows.expert_count_host = counts ? b->cnt_h : NULL;
  b->bal_rows = b->rows;
  b->bal_rows.expert_offset = b->off_bal;
  b->bal_rows.expert_count = counts ? b->cnt_bal : NULL;
  b->bal_rows.expert_count_host = counts ? b->cnt_bal_h : NULL;
  /* --seed N repeats a run's data. (Not its speed: the same data in another process ran
   * cuBLAS 686-769 TFLOP/s; docs/PERF.md, session 17) */
  const uint64_t seed = seed_given ? (uint64_t)seed_arg : 0x5eed0000ull ^ (uint64_t)time(NULL);
  b->seed = seed;
  if (fill_buf(b, R_X, b->off, b->cnt) || fill_buf(b, R_DY, b->off, b->cnt)) return 1;
  BMOK(mok_gemm_fill_rows(b->wg, (int64_t)E * b->I, b->H, seed + 3, 1.f / sqrtf((float)b->H), 0, NULL, NULL, 0));
  BMOK(mok_gemm_fill_rows(b->wu, (int64_t)E * b->I, b->H, seed + 4, 1.f / sqrtf((float)b->H), 0, NULL, NULL, 0));
  BMOK(mok_gemm_fill_rows(b->wd, (int64_t)E * b->H, b->I, seed + 5, 1.f / sqrtf((float)b->I), 0, NULL, NULL, 0));
  BMOK(mok_gemm_fill_rows(b->wgu_cub, (int64_t)E * 2 * b->I, b->H, seed + 6, 1.f / sqrtf((float)b->H), 0, NULL,
                          NULL, 0));
  /* the inputs later kinds read from earlier ones (act, g|u, dg|du), random, so that a kind
   * run without the one that writes them (--kinds down) computes and is checked on real
   * data, not on zeros */
  for (int r = R_ACT; r <= R_DGU; ++r)
    if (fill_buf(b, r, b->off, b->cnt)) return 1;
  BCUBLAS(cublasCreate(&b->cub));
  BCUBLAS(cublasSetStream(b->cub, 0));
  BCUDA(cudaEventCreate(&b->ev0));
  BCUDA(cudaEventCreate(&b->ev1));
  BCUDA(cudaDeviceSynchronize());

  if (json) {
    b->json = fopen(json, "w");
    if (!b->json) { fprintf(stderr, "bench gemm: cannot write %s\n", json); return 2; }
    fprintf(b->json, "{\"bench\": \"gemm\", \"routing\": \"%s\", \"zipf\": %g, \"random_seed\": %llu, \"results\": [",
            zipf > 0 ? "zipf" : rnd ? "random" : "uniform", zipf, rnd);
    b->json_first = 1;
  }
  if (trace) {
    b->trace = fopen(trace, "w");
    if (!b->trace) { fprintf(stderr, "bench gemm: cannot write %s\n", trace); return 2; }
    fprintf(b->trace, "kind,cta,tile,expert,rows,block,start_ns,end_ns\n");
  }
  cudaDeviceProp prop;
  BCUDA(cudaGetDeviceProperties(&prop, 0));
  printf("# mok bench gemm: %s, %d SMs; E_l=%d H=%d I=%d, %lld routed rows (%s), %lld rows after padding to 64, "
         "limit %g, seed %llu, median of %d (ours and cuBLAS in turn, GPU time)\n",
         prop.name, prop.multiProcessorCount, E, b->H, b->I, (long long)total,
         zipf > 0 ? "zipf" : rnd ? "random" : "balanced", (long long)b->rows_used, (double)b->limit, (unsigned long long)seed, b->iters);
  printf("%-20s %-24s %8s %8s %8s %8s %6s %8s %9s\n", "kind", "shape", "ms", "TFLOP/s", "cuBLASms", "TFLOP/s", "ratio",
         "HBM GB/s", "rel.err");
  for (int k = 0; k < K_N; ++k)
    if ((kinds >> k & 1) && bench_kind(b, k)) return 1;
  if (b->ffn && bench_ffn(b)) return 1;
  if (b->json) {
    fprintf(b->json, "\n]}\n");
    fclose(b->json);
  }
  if (b->wrong) fprintf(stderr, "bench gemm: WRONG RESULT (relative error >= 1e-2 or unwritten output)\n");
  return b->wrong ? 1 : 0;
}

extern "C" int mok_bench_gemm_main(int argc, char **argv) {
  bench b;
  memset(&b, 0, sizeof b);
  const int rc = bench_main(argc, argv, &b);
  void *bufs[] = {b.off, b.cnt, b.off_bal, b.cnt_bal, b.x, b.wblk, b.wd, b.act, b.gu, b.y, b.dy, b.dgu, b.dx,
                  b.wgu_cub, b.cub_out,
                  b.dw0, b.dw1, b.dw2, b.cub_dw, b.bad};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i]) cudaFree(bufs[i]);
  if (b.cub) cublasDestroy(b.cub);
  if (b.cg) {
    struct cub_groups *g = b.cg;
    if (g->dp) cudaFree(g->dp);
    free(g->ta); free(g->tb); free(g->m); free(g->nn); free(g->kk); free(g->lda); free(g->ldb); free(g->ldc);
    free(g->size); free(g->alpha); free(g->beta); free(g->hp); free(g);
  }
  if (b.trace) fclose(b.trace);
  free(b.off_h);
  free(b.cnt_h);
  free(b.off_bal_h);
  free(b.cnt_bal_h);
  return rc;
}
