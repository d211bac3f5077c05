/*
 * mok.c — the command-line tool.
 *
 *   mok info                     version, CUDA devices, NCCL version, peer access
 *   mok run [options]            forward + backward of one layer on all ranks
 *   mok memory [options]         device memory a layer needs (computed; no GPU)
 *   mok bench gemm|comm [...]    benchmarks (tools/bench_*.cu)
 *
 * Exit codes: 0 ok; 1 a run failed or a result was wrong; 2 bad usage.
 * Outside the benchmarks it uses only the public API (include/mok.h) plus CUDA and
 * NCCL queries for `mok info`.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "mok.h"

/* Benchmarks live in their own files; weak so the CLI links while one is absent. */
#pragma weak mok_bench_gemm_main
#pragma weak mok_bench_comm_main
#pragma weak mok_bench_stream_main

static int usage_error(const char *cmd, const char *fmt, const char *arg) {
  fprintf(stderr, "mok %s: ", cmd);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(try 'mok %s --help')\n", cmd);
  return 2;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int gpu_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

/* ---- mok info ------------------------------------------------------------------ */
static int cmd_info(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: mok info\n  Prints the mok version, the CUDA devices (SMs, memory), the NCCL version,\n"
             "  which GPUs can access each other's memory, and the CUDA environment variables that\n"
             "  change how mok's kernels run (hardware queues, module loading).\n");
      return 0;
    }
    return usage_error("info", "unknown argument '%s'", argv[i]);
  }
  int v = 0;
  mokGetVersion(&v);
  printf("mok %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess)
    printf("NCCL %d.%d.%d (library loaded)\n", nv / 10000, nv / 100 % 100, nv % 100);
  else
    printf("NCCL: version query failed\n");
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  printf("CUDA runtime %d.%d, driver %s\n", rt / 1000, rt % 1000 / 10,
         drv ? "present" : "not found");
  /* The two CUDA settings that decide whether kernels waiting for each other can run
   * (comm.h: loopback ranks; kernels_load.h): as this process sees them. */
  const char *q = getenv("CUDA_DEVICE_MAX_CONNECTIONS"), *ml = getenv("CUDA_MODULE_LOADING");
  printf("CUDA_DEVICE_MAX_CONNECTIONS=%s%s\n", q ? q : "(unset: 8 hardware queues)",
         q && atoi(q) == 1 ? " (one queue: fine for mok's layer, several ranks on one GPU refused)" : "");
  printf("CUDA_MODULE_LOADING=%s\n", ml ? ml : "(unset: lazy; mok loads its kernels when a comm is made)");
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("GPUs: none (%s). mok's kernels need an NVIDIA Hopper GPU (sm_90a); the CPU reference\n"
           "      ('mok run --impl cpu') works without one.\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
    cudaGetLastError();
    return 0;
  }
  printf("GPUs: %d\n", n);
  for (int d = 0; d < n; d++) {
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    printf("  [%d] %s  sm_%d%d  %d SMs  %.1f GiB  L2 %.0f MiB\n", d, p.name, p.major, p.minor,
           p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30), (double)p.l2CacheSize / (1 << 20));
  }
  if (n > 1) {
    printf("peer access (row can access column):\n      ");
    for (int b = 0; b < n; b++) printf("%4d", b);
    printf("\n");
    for (int a = 0; a < n; a++) {
      printf("  %2d  ", a);
      for (int b = 0; b < n; b++) {
        int ok = 0;
        if (a != b) cudaDeviceCanAccessPeer(&ok, a, b);
        printf("%4s", a == b ? "-" : ok ? "yes" : "no");
      }
      printf("\n");
    }
  }
  return 0;
}

/* ---- mok run ------------------------------------------------------------------- */
static void run_help(void) {
  int count = 0;
  const char *name = NULL;
  mokModelName(0, &name, &count);
  printf("usage: mok run [--impl auto|cpu|nccl|baseline|mega] [--model NAME | --hidden H --inter I --experts E --topk K\n"
         "               [--shared-inter IS]] [--ranks N] [--tokens T] [--seed S]\n"
         "               [--routing uniform|zipf:S|hot:E] [--grad-dtype bf16|fp32]\n"
         "               [--swiglu-limit L] [--row-pad P]\n"
         "  Runs the layer's forward and backward over N ranks (T tokens each) on generated\n"
         "  data and prints the time and a checksum of every output and gradient tensor:\n"
         "  sum = the float64 sum of the elements, l2 = sqrt of the sum of squares. Runs with\n"
         "  the same seed and shape agree to about 1e-2 (relative) on every implementation.\n"
         "  --impl cpu    the float64 CPU reference (DESIGN.md section 2a), N simulated ranks\n"
         "  --impl nccl   the GPU layer: NCCL all-to-all + mok's grouped Hopper GEMMs, one rank per GPU\n"
         "  --impl baseline  the conventional GPU layer: NCCL all-to-all + cuBLAS expert GEMMs\n"
         "  --impl mega   the forward megakernel (at N > 1: stage A, one host read a forward)\n"
         "  --impl auto   (default) the fastest implementation built for this machine: the GPU\n"
         "                layer on all local GPUs (N = GPU count), else the CPU reference\n"
         "  --model       one of:");
  for (int i = 0; i < count; i++) {
    mokModelName(i, &name, NULL);
    printf("%s %s", i ? "," : "", name);
  }
  printf("\n                explicit --hidden/--inter/... override the model's values\n"
         "  Defaults (no model): H 512, I 256, E 32, k 4, I_s 256; N 4 (CPU) or the GPU count,\n"
         "  T 128, seed 1, uniform.\n");
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

typedef struct {
  double sum, l2;
} checksum_t;

static checksum_t sum_bf16(const mokBf16 *p, size_t n) {
  checksum_t c = {0, 0};
  for (size_t i = 0; i < n; i++) {
    double v = mokBf16ToFloat(p[i]);
    c.sum += v;
    c.l2 += v * v;
  }
  c.l2 = sqrt(c.l2);
  return c;
}
static checksum_t sum_f32(const float *p, size_t n) {
  checksum_t c = {0, 0};
  for (size_t i = 0; i < n; i++) {
    c.sum += p[i];
    c.l2 += (double)p[i] * p[i];
  }
  c.l2 = sqrt(c.l2);
  return c;
}
static checksum_t sum_grad(const void *p, size_t n, mokDtype_t dt) {
  return dt == mokDtypeBF16 ? sum_bf16((const mokBf16 *)p, n) : sum_f32((const float *)p, n);
}

/* Host bytes the CPU reference needs for this problem (upper estimate). */
static double reference_bytes(const mokConfig_t *c, int tokens) {
  double N = c->num_ranks, T = tokens, H = c->hidden, I = c->inter, Is = c->shared_inter, k = c->topk;
  double E = c->num_experts;
  double wts = E * 3 * H * I + N * 3 * H * Is; /* elements, all ranks */
  double routes = N * T * k;
  double acts = N * T * H * 6 + N * T * k * 2;
  return wts * (2 + 8 + 8 + 4)              /* bf16 weights, float64 copy, float64 dW, dW out */
         + routes * (3 * I + 2 * H) * 8     /* per-route g, u, a, y and d_x partial */
         + acts * 8;                        /* token tensors */
}

static int cmd_run(int argc, char **argv) {
  const char *impl = "auto", *model = NULL, *routing_s = "uniform";
  long hidden = -1, inter = -1, experts = -1, topk = -1, shared = -1, ranks = -1, tokens = 128, rowpad = 0;
  long long seed = 1;
  double limit = 0.0;
  mokDtype_t gdt = mokDtypeBF16;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      run_help();
      return 0;
    }
    if (strncmp(a, "--", 2)) return usage_error("run", "unexpected argument '%s'", a);
    if (i + 1 >= argc) return usage_error("run", "option %s needs a value", a);
    const char *v = argv[++i];
    long x;
    if (!strcmp(a, "--impl")) impl = v;
    else if (!strcmp(a, "--model")) model = v;
    else if (!strcmp(a, "--routing")) routing_s = v;
    else if (!strcmp(a, "--seed")) {
      char *end;
      seed = strtoll(v, &end, 0);
      if (end == v || *end) return usage_error("run", "--seed takes an integer, not '%s'", v);
    } else if (!strcmp(a, "--grad-dtype")) {
      if (!strcmp(v, "bf16")) gdt = mokDtypeBF16;
      else if (!strcmp(v, "fp32")) gdt = mokDtypeFP32;
      else return usage_error("run", "--grad-dtype takes bf16 or fp32, not '%s'", v);
    } else if (!strcmp(a, "--swiglu-limit")) {
      char *end;
      limit = strtod(v, &end);
      if (end == v || *end || !(limit >= 0)) return usage_error("run", "--swiglu-limit takes a number >= 0, not '%s'", v);
    } else {
      struct { const char *name; long *dst; long lo, hi; } ints[] = {
          {"--hidden", &hidden, 1, 1 << 20}, {"--inter", &inter, 1, 1 << 20},
          {"--experts", &experts, 1, 1 << 16}, {"--topk", &topk, 1, 32},
          {"--shared-inter", &shared, 0, 1 << 20}, {"--ranks", &ranks, 1, 4096},
          {"--tokens", &tokens, 0, 1 << 24}, {"--row-pad", &rowpad, 0, 1 << 16}};
      int found = 0;
      for (size_t n = 0; n < sizeof ints / sizeof ints[0]; n++)
        if (!strcmp(a, ints[n].name)) {
          found = 1;
          if (!parse_int(v, ints[n].lo, ints[n].hi, &x)) {
            fprintf(stderr, "mok run: %s takes an integer in [%ld, %ld], not '%s'\n", a, ints[n].lo, ints[n].hi, v);
            return 2;
          }
          *ints[n].dst = x;
        }
      if (!found) return usage_error("run", "unknown option '%s'", a);
    }
  }
  if (strcmp(impl, "auto") && strcmp(impl, "cpu") && strcmp(impl, "baseline") && strcmp(impl, "nccl") &&
      strcmp(impl, "mega"))
    return usage_error("run", "--impl '%s' is not built: this build has auto, cpu, nccl, baseline and mega", impl);
  const int gpus = gpu_count();
  /* auto: the GPUs when there are any (one rank per GPU), else the CPU reference */
  const int on_gpu = !strcmp(impl, "baseline") || !strcmp(impl, "nccl") || !strcmp(impl, "mega") ||
                     (!strcmp(impl, "auto") && gpus > 0);
  if (on_gpu && gpus == 0)
    return fprintf(stderr, "mok run: --impl %s needs CUDA GPUs and none was found ('mok info')\n", impl), 2;
  const mokImpl_t gpu_impl = !strcmp(impl, "baseline") ? mokImplBaseline
                             : !strcmp(impl, "nccl")   ? mokImplNccl
                             : !strcmp(impl, "mega")   ? mokImplMega
                                                       : mokImplAuto;
  if (ranks < 0) ranks = on_gpu ? gpus : 4;
  if (on_gpu && ranks > gpus) {
    fprintf(stderr, "mok run: --ranks %ld but %d GPU(s): the GPU layer runs one rank per GPU\n", ranks, gpus);
    return 2;
  }

  mokConfig_t cfg = MOK_CONFIG_INITIALIZER;
  if (model) {
    if (mokConfigSetModel(&cfg, model) != mokSuccess) {
      fprintf(stderr, "mok run: %s\n", mokGetLastError());
      return 2;
    }
  } else {
    cfg.hidden = 512, cfg.inter = 256, cfg.num_experts = 32, cfg.topk = 4, cfg.shared_inter = 256;
  }
  if (hidden >= 0) cfg.hidden = (int)hidden;
  if (inter >= 0) cfg.inter = (int)inter;
  if (experts >= 0) cfg.num_experts = (int)experts;
  if (topk >= 0) cfg.topk = (int)topk;
  if (shared >= 0) cfg.shared_inter = (int)shared;
  cfg.num_ranks = (int)ranks;
  cfg.max_tokens = tokens > 0 ? (int)tokens : 1;
  cfg.grad_dtype = gdt;
  cfg.swiglu_limit = (float)limit;
  cfg.row_pad = (int)rowpad;

  mokRouting_t routing = {mokRoutingUniform, 0.0};
  if (!strcmp(routing_s, "uniform")) {
  } else if (!strncmp(routing_s, "zipf:", 5) || !strncmp(routing_s, "hot:", 4)) {
    const char *num = strchr(routing_s, ':') + 1;
    char *end;
    routing.kind = routing_s[0] == 'z' ? mokRoutingZipf : mokRoutingHot;
    routing.param = strtod(num, &end);
    if (end == num || *end) return usage_error("run", "--routing '%s': expected uniform, zipf:S or hot:E", routing_s);
  } else {
    return usage_error("run", "--routing '%s': expected uniform, zipf:S or hot:E", routing_s);
  }

  mokLayer_t layer = NULL;
  if (mokLayerCreate(&layer, &cfg) != mokSuccess) {
    fprintf(stderr, "mok run: %s\n", mokGetLastError());
    return 2;
  }
  mokLayerGetConfig(layer, &cfg);
  const int N = cfg.num_ranks, T = (int)tokens, H = cfg.hidden, I = cfg.inter, Is = cfg.shared_inter;
  const int k = cfg.topk, El = cfg.num_experts / N;
  if (!strcmp(impl, "auto")) {
    if (gpus == 0)
      printf("no CUDA GPU found: running the CPU reference (float64) on %d simulated ranks.\n"
             "A GPU run needs NVIDIA Hopper GPUs (sm_90a) with NCCL 2.28+; 'mok info' shows what is here.\n", N);
    else
      printf("%d GPU(s) found: running the GPU layer (NCCL all-to-all + mok's grouped GEMMs on Hopper), one rank per "
             "GPU.\n", N);
  }
  double need = reference_bytes(&cfg, T);
  if (on_gpu) need = need / 22 * 6; /* host copies only: no float64 widening */
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
  double have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
  if (have > 0 && need > 0.8 * have) {
    fprintf(stderr, "mok run: the CPU reference of this shape needs about %.1f GiB of host memory; this machine has "
            "%.1f GiB. Use fewer tokens, ranks or experts (or a GPU implementation).\n",
            need / (1 << 30), have / (1 << 30));
    mokLayerDestroy(layer);
    return 2;
  }
  double fwd_flops = 6.0 * T * ((double)k * H * I + (double)H * Is) * N;
  printf("layer: E %d (E_l %d per rank), H %d, I %d, k %d, I_s %d, N %d ranks, T %d tokens/rank, P %d, "
         "routing %s, seed %lld, grads %s%s\n",
         cfg.num_experts, El, H, I, k, Is, N, T, cfg.row_pad, routing_s, seed, gdt == mokDtypeBF16 ? "bf16" : "fp32",
         limit > 0 ? ", swiglu clamp" : "");
  printf("work: %.3g GFLOP forward, %.3g GFLOP backward (all ranks); reference memory ~%.2f GiB\n", fwd_flops / 1e9,
         2 * fwd_flops / 1e9, need / (1 << 30));
  fflush(stdout);

  int rc = 1;
  size_t gsz = gdt == mokDtypeBF16 ? 2 : 4;
  mokRankInput_t *in = calloc((size_t)N, sizeof *in);
  mokRankWeights_t *w = calloc((size_t)N, sizeof *w);
  mokRankGrads_t *g = calloc((size_t)N, sizeof *g);
  mokBf16 **out = calloc((size_t)N, sizeof *out), **dout = calloc((size_t)N, sizeof *dout);
  if (!in || !w || !g || !out || !dout) goto oom;
  for (int r = 0; r < N; r++) {
    size_t th = (size_t)T * H, tk = (size_t)T * k, wgu = (size_t)El * I * H, sgu = (size_t)Is * H;
    mokBf16 *x = malloc(2 * th + 2), *d = malloc(2 * th + 2), *o = malloc(2 * th + 2);
    int32_t *idx = malloc(4 * tk + 4);
    float *tw = malloc(4 * tk + 4);
    mokBf16 *wg = malloc(2 * wgu), *wu = malloc(2 * wgu), *wd = malloc(2 * wgu);
    mokBf16 *sg = Is ? malloc(2 * sgu) : NULL, *su = Is ? malloc(2 * sgu) : NULL, *sd = Is ? malloc(2 * sgu) : NULL;
    in[r] = (mokRankInput_t){T, x, idx, tw};
    w[r] = (mokRankWeights_t){wg, wu, wd, sg, su, sd};
    out[r] = o;
    dout[r] = d;
    g[r] = (mokRankGrads_t){malloc(2 * th + 2), malloc(4 * tk + 4), malloc(gsz * wgu), malloc(gsz * wgu),
                            malloc(gsz * wgu), Is ? malloc(gsz * sgu) : NULL, Is ? malloc(gsz * sgu) : NULL,
                            Is ? malloc(gsz * sgu) : NULL, 0};
    if (!x || !d || !o || !idx || !tw || !wg || !wu || !wd || (Is && (!sg || !su || !sd)) || !g[r].d_x ||
        !g[r].d_topk_w || !g[r].d_w_gate || !g[r].d_w_up || !g[r].d_w_down ||
        (Is && (!g[r].d_s_gate || !g[r].d_s_up || !g[r].d_s_down)))
      goto oom;
    if (mokGenerateRankData(layer, (uint64_t)seed, &routing, r, T, x, idx, tw, d, wg, wu, wd, sg, su, sd) != mokSuccess) {
      fprintf(stderr, "mok run: %s\n", mokGetLastError());
      rc = 2;
      goto done;
    }
  }
  if (on_gpu) {
    double fms = 0, bms = 0;
    printf("forward + backward on %d GPU(s) ...\n", N);
    fflush(stdout);
    if (mok_run_on_gpus(&cfg, gpu_impl, in, w, dout, out, g, &fms, &bms)) goto done;
    printf("impl %s: forward %.3f ms, backward %.3f ms (second call, slowest rank; 'mok bench layer' times properly)\n",
           impl, fms, bms);
  } else {
    printf("forward ...\n");
    fflush(stdout);
    double t0 = now_s();
    if (mokReferenceForward(layer, in, w, out, NULL) != mokSuccess) {
      fprintf(stderr, "mok run: forward failed: %s\n", mokGetLastError());
      goto done;
    }
    double t1 = now_s();
    printf("backward ...\n");
    fflush(stdout);
    if (mokReferenceBackward(layer, in, w, (const mokBf16 *const *)dout, g) != mokSuccess) {
      fprintf(stderr, "mok run: backward failed: %s\n", mokGetLastError());
      goto done;
    }
    double t2 = now_s();
    printf("impl cpu-reference: forward %.3f s, backward %.3f s (backward recomputes the forward)\n", t1 - t0, t2 - t1);
  }
  printf("%-10s %-22s %24s %24s\n", "tensor", "shape (all ranks)", "sum", "l2");
  struct { const char *name; int kind; size_t n; } rows[] = {
      {"out", 0, (size_t)T * H}, {"d_x", 1, (size_t)T * H}, {"d_topk_w", 2, (size_t)T * k},
      {"d_w_gate", 3, (size_t)El * I * H}, {"d_w_up", 4, (size_t)El * I * H}, {"d_w_down", 5, (size_t)El * H * I},
      {"d_s_gate", 6, (size_t)Is * H}, {"d_s_up", 7, (size_t)Is * H}, {"d_s_down", 8, (size_t)Is * H}};
  for (size_t q = 0; q < sizeof rows / sizeof rows[0]; q++) {
    if (rows[q].kind >= 6 && !Is) continue;
    checksum_t tot = {0, 0};
    for (int r = 0; r < N; r++) {
      checksum_t c;
      switch (rows[q].kind) {
        case 0: c = sum_bf16(out[r], rows[q].n); break;
        case 1: c = sum_bf16(g[r].d_x, rows[q].n); break;
        case 2: c = sum_f32(g[r].d_topk_w, rows[q].n); break;
        case 3: c = sum_grad(g[r].d_w_gate, rows[q].n, gdt); break;
        case 4: c = sum_grad(g[r].d_w_up, rows[q].n, gdt); break;
        case 5: c = sum_grad(g[r].d_w_down, rows[q].n, gdt); break;
        case 6: c = sum_grad(g[r].d_s_gate, rows[q].n, gdt); break;
        case 7: c = sum_grad(g[r].d_s_up, rows[q].n, gdt); break;
        default: c = sum_grad(g[r].d_s_down, rows[q].n, gdt); break;
      }
      tot.sum += c.sum;
      tot.l2 += c.l2 * c.l2;
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%d x %zu", N, rows[q].n);
    printf("%-10s %-22s %24.12e %24.12e\n", rows[q].name, shape, tot.sum, sqrt(tot.l2));
  }
  rc = 0;
  goto done;
oom:
  fprintf(stderr, "mok run: out of host memory for the test problem (~%.1f GiB)\n", need / (1 << 30));
done:
  for (int r = 0; in && w && g && out && dout && r < N; r++) {
    free((void *)in[r].x); free((void *)in[r].topk_idx); free((void *)in[r].topk_w);
    free((void *)w[r].w_gate); free((void *)w[r].w_up); free((void *)w[r].w_down);
    free((void *)w[r].s_gate); free((void *)w[r].s_up); free((void *)w[r].s_down);
    free(out[r]); free(dout[r]);
    free(g[r].d_x); free(g[r].d_topk_w); free(g[r].d_w_gate); free(g[r].d_w_up); free(g[r].d_w_down);
    free(g[r].d_s_gate); free(g[r].d_s_up); free(g[r].d_s_down);
  }
  free(in); free(w); free(g); free(out); free(dout);
  mokLayerDestroy(layer);
  return rc;
}

/* ---- mok bench ------------------------------------------------------------------- */
static int cmd_bench(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    printf("usage: mok bench layer [options]  the whole MoE layer on all local GPUs, checked in float64\n"
           "       mok bench gemm [options]   expert GEMMs beside cuBLAS (one GPU)\n"
           "       mok bench comm [options]   NVLink push/pull bandwidth over the symmetric workspace\n"
           "       mok bench stream [options] TMA streams into one SM's shared memory (diagnostics)\n"
           "  'mok bench KIND --help' lists each one's options.\n");
    return argc < 2 ? 2 : 0;
  }
  /* the CUDA benchmarks are weak symbols: absent from a build without them */
  static const struct {
    const char *name;
    int (*run)(int, char **);
  } kBenches[] = {{"layer", mok_bench_layer_main},
                  {"gemm", mok_bench_gemm_main},
                  {"comm", mok_bench_comm_main},
                  {"stream", mok_bench_stream_main}};
  for (size_t i = 0; i < sizeof kBenches / sizeof kBenches[0]; ++i) {
    if (strcmp(argv[1], kBenches[i].name)) continue;
    if (!kBenches[i].run) return fprintf(stderr, "mok bench %s: not in this build\n", kBenches[i].name), 2;
    return kBenches[i].run(argc - 1, argv + 1);
  }
  return usage_error("bench", "unknown benchmark '%s' (layer, gemm, comm or stream)", argv[1]);
}

/* ---- mok memory ---------------------------------------------------------------- */
static int cmd_memory(int argc, char **argv) {
  const char *models_s = "kimi-k2.7-code,glm-5.2,qwen3.5-397b-a17b,deepseek-v4-pro", *impl_s = "auto";
  int gpus = 8, tokens = 8192, layers = 0, contexts = 1;
  double budget = 0; /* GiB; with --layers: the most tokens a rank whose layers fit in it */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf("usage: mok memory [--model A,B,..] [--gpus N] [--tokens T] [--layers L [--budget GiB]]\n"
             "                  [--contexts C] [--impl auto|nccl|baseline|mega]\n"
             "  The device memory one GPU of an EP group of N GPUs needs for a layer whose passes have T\n"
             "  tokens a rank (computed from the layer's layouts, mokLayerMemoryEstimate; no GPU needed):\n"
             "  the layer's own (the rows its backward reads, index arrays) and the scratch one pass\n"
             "  uses, which the layers of one communicator share; with routes spread evenly over the\n"
             "  experts and under the worst routing (every route on this rank: mokLayerReserve's size).\n"
             "  --layers L adds the total of L such layers on one communicator; --budget B (GiB) with it\n"
             "  adds the most tokens a rank whose L layers fit in B GiB (even routing; the weights,\n"
             "  their gradients and the optimizer state are not counted: leave room for them).\n"
             "  --contexts C: forwards in flight a layer keeps for their backwards (a pipeline schedule's\n"
             "  depth; the Python binding's contexts=C): each holds a layer's own, so the totals count it\n"
             "  C times.\n"
             "  Defaults: the four published models, --gpus 8, --tokens 8192, --impl auto.\n");
      return 0;
    }
    if (i + 1 >= argc) return usage_error("memory", "option %s needs a value", a);
    const char *v = argv[++i];
    char *end = NULL;
    long n = strtol(v, &end, 10);
    int is_num = end != v && !*end;
    if (!strcmp(a, "--model")) models_s = v;
    else if (!strcmp(a, "--impl")) impl_s = v;
    else if (!strcmp(a, "--gpus")) { if (!is_num || n < 1 || n > 1024) return usage_error("memory", "--gpus takes 1..1024, not '%s'", v); gpus = (int)n; }
    else if (!strcmp(a, "--tokens")) { if (!is_num || n < 0 || n > (1L << 24)) return usage_error("memory", "--tokens takes 0..16777216, not '%s'", v); tokens = (int)n; }
    else if (!strcmp(a, "--budget")) {
      budget = strtod(v, &end);
      if (end == v || *end || !(budget > 0) || budget > 1e6) return usage_error("memory", "--budget takes GiB > 0, not '%s'", v);
    } else if (!strcmp(a, "--contexts")) { if (!is_num || n < 1 || n > 64) return usage_error("memory", "--contexts takes 1..64, not '%s'", v); contexts = (int)n; }
    else if (!strcmp(a, "--layers")) { if (!is_num || n < 0 || n > 100000) return usage_error("memory", "--layers takes 0..100000, not '%s'", v); layers = (int)n; }
    else return usage_error("memory", "unknown option '%s'", a);
  }
  mokImpl_t impl;
  if (!strcmp(impl_s, "auto")) impl = mokImplAuto;
  else if (!strcmp(impl_s, "nccl")) impl = mokImplNccl;
  else if (!strcmp(impl_s, "baseline")) impl = mokImplBaseline;
  else if (!strcmp(impl_s, "mega")) impl = mokImplMega;
  else return usage_error("memory", "--impl takes auto, nccl, baseline or mega, not '%s'", impl_s);
  if (budget > 0 && !layers) return usage_error("memory", "--budget needs --layers%s", "");
  const double G = 1073741824.0;
  printf("device memory a GPU needs per MoE layer: EP over %d GPU(s), %d tokens a rank, impl %s (GiB)%s\n", gpus, tokens,
         impl_s, contexts > 1 ? "; the totals count each layer's own once a context" : "");
  printf("%-20s %12s %12s %12s %12s%s\n", "model", "layer", "scratch", "layer worst", "scratch worst",
         layers ? (budget > 0 ? "  total of the layers (even / worst)  tokens a rank in the budget" :
                   "  total of the layers (even / worst)") : "");
  char buf[512];
  snprintf(buf, sizeof buf, "%s", models_s);
  int bad = 0;
  for (char *save = NULL, *m = strtok_r(buf, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
    mokConfig_t c = MOK_CONFIG_INITIALIZER;
    size_t own = 0, scr = 0, own_w = 0, scr_w = 0;
    mokResult_t rc = mokConfigSetModel(&c, m);
    if (rc == mokSuccess) {
      c.num_ranks = gpus, c.max_tokens = tokens > 0 ? tokens : 1;
      rc = mokLayerMemoryEstimate(&c, impl, tokens, 0, &own, &scr);
      if (rc == mokSuccess) rc = mokLayerMemoryEstimate(&c, impl, tokens, 1, &own_w, &scr_w);
    }
    if (rc != mokSuccess) {
      fprintf(stderr, "mok memory: %s: %s\n", m, mokGetLastError());
      bad = 2;
      continue;
    }
    printf("%-20s %12.2f %12.2f %12.2f %12.2f", m, own / G, scr / G, own_w / G, scr_w / G);
    const double per = (double)layers * contexts; /* layers' own blocks: one a context */
    if (layers) printf("  %.1f / %.1f", (per * own + scr) / G, (per * own_w + scr_w) / G);
    if (budget > 0) { /* the need grows with the tokens: bisect the largest T that fits */
      int lo = 0, hi = 1 << 24;
      while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        mokConfig_t cm = c;
        cm.max_tokens = mid;
        size_t o = 0, x = 0;
        if (mokLayerMemoryEstimate(&cm, impl, mid, 0, &o, &x) == mokSuccess && per * o + x <= budget * G)
          lo = mid;
        else
          hi = mid - 1;
      }
      printf("  %d", lo);
    }
    printf("\n");
  }
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    printf("usage: mok <command> [options]\n"
           "  info    version, GPUs, NCCL, peer access\n"
           "  run     forward + backward of one MoE layer on generated data (default: the CPU\n"
           "          reference where no GPU implementation applies)\n"
           "  memory  device memory a layer needs per GPU (computed, no GPU needed)\n"
           "  bench   benchmarks: layer, gemm, comm, stream\n"
           "'mok <command> --help' describes each.\n");
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "info")) return cmd_info(argc - 1, argv + 1);
  if (!strcmp(argv[1], "run")) return cmd_run(argc - 1, argv + 1);
  if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
  if (!strcmp(argv[1], "memory")) return cmd_memory(argc - 1, argv + 1);
  fprintf(stderr, "mok: unknown command '%s' (info, run, memory, bench; see 'mok --help')\n", argv[1]);
  return 2;
}
