/*
 * test_cli.c — the command-line tool as a user meets it: exit codes (0 ok, 2 bad
 * usage), messages naming the bad argument, `mok run --impl cpu` printing every
 * checksum, the memory refusal, and `mok info` without a GPU. Runs build/mok (built by
 * `make test` before the tests); skipped if it is missing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "mok.h"
#include "test.h"

/* Runs build/mok with args; captures stdout+stderr into out; returns the exit code. */
static int run_cli(const char *args, char *out, size_t n) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "build/mok %s 2>&1", args);
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  size_t got = fread(out, 1, n - 1, f);
  out[got] = '\0';
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define NEED_CLI() \
  if (access("build/mok", X_OK) != 0) SKIP("build/mok not built (run from the repository root after make)")

MOK_TEST(cli_bad_arguments_exit_2) {
  NEED_CLI();
  static char out[1 << 16];
  struct { const char *args, *must; } cases[] = {
      {"", "usage"},
      {"frobnicate", "unknown command"},
      {"run --tokens abc", "--tokens"},
      {"run --model nope", "unknown model 'nope'"},
      {"run --impl gpu-magic", "--impl"},
      {"run --routing zipf:", "--routing"},
      {"run --routing sideways", "--routing"},
      {"run --hidden 100", "config.hidden"},
      {"run --topk 40", "--topk"},
      {"run --impl cpu --experts 6 --ranks 4", "num_experts"},
      {"run --routing hot:99 --tokens 4", "hot expert"},
      {"run --bogus 1", "unknown option '--bogus'"},
      {"run --tokens", "needs a value"},
      {"info --verbose", "unknown argument"},
      {"bench", "usage"},
      {"bench tea", "unknown benchmark"},
      {"bench layer --impl magic", "--impl 'magic' is not built (auto, nccl, baseline, mega)"},
      {"bench layer --impl nccl,cpu", "--impl 'cpu' is not built"},
      {"bench layer --routing sideways", "bad --routing"},
      {"memory --gpus 0", "--gpus takes 1..1024"},
      {"memory --impl magic", "--impl takes auto"},
      {"memory --model nope", "unknown model 'nope'"},
      {"memory --layers", "needs a value"},
      {"memory --layers 4 --budget 0", "--budget takes GiB > 0"},
      {"memory --budget 80", "--budget needs --layers"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run_cli(cases[i].args, out, sizeof out);
    CHECK_MSG(rc == 2, "'mok %s' exited %d, want 2; output: %s", cases[i].args, rc, out);
    CHECK_MSG(strstr(out, cases[i].must) != NULL, "'mok %s': output lacks '%s': %s", cases[i].args, cases[i].must, out);
  }
  /* bench gemm parses its options before it looks for a GPU (it may not be built) */
  static const struct { const char *args, *must; } gemm_cases[] = {
      {"bench gemm --kinds gateup,foo", "unknown kind 'foo'"},
      {"bench gemm --counts maybe", "--counts on|off"},
      {"bench gemm --raster 0", "--raster N"},
      {"bench gemm --mix sometimes", "--mix on|off"},
      {"bench gemm --pairs 2", "--pairs on|off"},
      {"bench gemm --stagger yes", "--stagger on|off"},
      {"bench gemm --row-box 64", "--row-box 32|128"},
      {"bench gemm --l2-promo 256", "--l2-promo W,R"},
      {"bench gemm --l2-promo 32,256", "--l2-promo W,R"},
      {"bench gemm --gu-order down", "--gu-order gate-first|up-first"},
      {"bench gemm --cold-evict 1", "--cold-evict on|off"},
      {"bench gemm --epi-debug 3", "--epi-debug 0|1|2"},
      {"bench gemm --eager-rows -2", "--eager-rows N, N >= -1"},
      {"bench gemm --gu-box 2", "--gu-box one|two|four"},
      {"bench gemm --ctas 0", "--ctas N, N >= 1"},
      {"bench gemm --routing zipf:1.2,sideways", "--routing zipf:S[,shuffled|,reversed]"},
      {"bench gemm --routing zipf:0", "--routing uniform|zipf:S"},
      {"bench gemm --routing random:0", "random[:SEED] (S > 0, SEED >= 1)"},
      {"bench gemm --routing random:3x", "random[:SEED] (S > 0, SEED >= 1)"},
      {"bench gemm --dn-tiles cols", "--dn-tiles token-n|token-m"},
      {"bench gemm --ddown-tok maybe", "--ddown-tok on|off"},
      {"bench gemm --gu-tiles cols", "--gu-tiles grouped|token-n|token-m"},
      {"bench gemm --seed x1", "--seed N|clock"},
      {"bench gemm --seed -3", "--seed N|clock"},
      {"bench gemm --vs-balanced maybe", "--vs-balanced on|off"},
      {"bench gemm --expert-order heavy", "--expert-order auto|load|index"},
      {"bench gemm --vs-balanced on --model glm-5.2", "--vs-balanced on needs --routing zipf:S"},
      {"bench gemm --vs-cublas-zipf yes", "--vs-cublas-zipf on|off"},
      {"bench gemm --vs-cublas-zipf on --model glm-5.2", "--vs-cublas-zipf on needs --routing zipf:S"},
      {"bench stream --k 100", "--k a multiple of 64"},
      {"bench stream --warp 9", "unknown option --warp"},
      {"bench stream --mixed --k 100", "--k a multiple of 64"}, /* --mixed takes no value */
      {"bench stream --k 128 --mixed --warp", "usage: mok bench stream"},
  };
  for (size_t i = 0; i < sizeof gemm_cases / sizeof gemm_cases[0]; i++) {
    int rc = run_cli(gemm_cases[i].args, out, sizeof out);
    if (strstr(out, "not in this build")) break;
    CHECK_MSG(rc == 2, "'mok %s' exited %d, want 2; output: %s", gemm_cases[i].args, rc, out);
    CHECK_MSG(strstr(out, gemm_cases[i].must) != NULL, "'mok %s': output lacks '%s': %s", gemm_cases[i].args,
              gemm_cases[i].must, out);
  }
}

MOK_TEST(cli_help_exit_0) {
  NEED_CLI();
  static char out[1 << 16];
  const char *cmds[] = {"--help", "run --help", "info --help", "bench --help", "memory --help"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    CHECK_MSG(run_cli(cmds[i], out, sizeof out) == 0, "'mok %s' failed: %s", cmds[i], out);
    CHECK(strstr(out, "usage") != NULL);
  }
  CHECK(run_cli("run --help", out, sizeof out) == 0 && strstr(out, "deepseek-v3") && strstr(out, "zipf") &&
        strstr(out, "--impl nccl") && strstr(out, "--impl mega"));
  CHECK(run_cli("bench layer --help", out, sizeof out) == 0 && strstr(out, "nccl") && strstr(out, "baseline"));
  CHECK(run_cli("--help", out, sizeof out) == 0 && strstr(out, "memory"));
}

MOK_TEST(cli_run_cpu_prints_every_checksum) {
  NEED_CLI();
  static char out[1 << 16], again[1 << 16];
  const char *args = "run --impl cpu --hidden 128 --inter 64 --experts 8 --topk 2 --shared-inter 64 --ranks 2 "
                     "--tokens 16 --seed 7 --routing zipf:1.2 --grad-dtype fp32 --swiglu-limit 1.5";
  CHECK_MSG(run_cli(args, out, sizeof out) == 0, "%s", out);
  const char *tensors[] = {"out ", "d_x ", "d_topk_w", "d_w_gate", "d_w_up", "d_w_down", "d_s_gate", "d_s_up", "d_s_down"};
  for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) CHECK_MSG(strstr(out, tensors[i]), "no %s: %s", tensors[i], out);
  CHECK(strstr(out, "nan") == NULL && strstr(out, "inf") == NULL);
  /* same seed, same checksums; another seed, others */
  CHECK(run_cli(args, again, sizeof again) == 0);
  const char *a = strstr(out, "tensor"), *b = strstr(again, "tensor");
  CHECK(a && b && !strcmp(a, b));
  CHECK(run_cli("run --impl cpu --hidden 128 --inter 64 --experts 8 --topk 2 --shared-inter 64 --ranks 2 "
                "--tokens 16 --seed 8 --routing zipf:1.2 --grad-dtype fp32 --swiglu-limit 1.5", again, sizeof again) == 0);
  b = strstr(again, "tensor");
  CHECK(b && strcmp(a, b));
  /* a rank count of one and zero tokens still run */
  CHECK_MSG(run_cli("run --impl cpu --hidden 64 --inter 64 --experts 4 --topk 2 --ranks 1 --tokens 0", out, sizeof out) == 0,
            "%s", out);
  /* a model preset with explicit overrides */
  CHECK(run_cli("run --impl cpu --model qwen3-30b-a3b --hidden 128 --inter 64 --experts 8 --ranks 2 --tokens 4", out, sizeof out) == 0);
  CHECK_MSG(strstr(out, "E 8 (E_l 4 per rank), H 128, I 64, k 8, I_s 0"), "%s", out);
}

MOK_TEST(cli_refuses_shapes_too_large_for_the_reference) {
  NEED_CLI();
  static char out[1 << 16];
  int rc = run_cli("run --impl cpu --model kimi-k2.7-code --ranks 8 --tokens 16384", out, sizeof out);
  CHECK_MSG(rc == 2 && strstr(out, "GiB"), "rc %d: %s", rc, out);
}

/* The l2 checksum `mok run` printed for tensor `name` (the last field of its line); -1 if none. */
static double run_l2(const char *out, const char *name) {
  char pat[32];
  snprintf(pat, sizeof pat, "\n%s ", name);
  const char *p = strstr(out, pat);
  if (!p) return -1;
  const char *end = strchr(p + 1, '\n');
  const char *last = NULL;
  for (const char *q = p + 1; q < (end ? end : p + strlen(p)); q++)
    if (*q == ' ' && q[1] != ' ') last = q + 1;
  return last ? atof(last) : -1;
}

/* `mok run` on one GPU, every GPU implementation, against `mok run --impl cpu` on the same
 * seed and shape: the l2 checksum of the output and of every gradient within 1e-2. */
MOK_GPU_TEST(cli_run_gpu_impls_match_cpu, 1) {
  NEED_CLI();
  static char ref[1 << 14], out[1 << 14];
  const char *shape = "--hidden 256 --inter 128 --experts 8 --topk 2 --shared-inter 128 --ranks 1 --tokens 300 "
                      "--seed 21 --routing zipf:1.2";
  char args[512];
  snprintf(args, sizeof args, "run --impl cpu %s", shape);
  CHECK_MSG(run_cli(args, ref, sizeof ref) == 0, "%s", ref);
  static const char *impls[] = {"nccl", "baseline", "mega"};
  static const char *names[] = {"out", "d_x", "d_topk_w", "d_w_gate", "d_w_up", "d_w_down", "d_s_gate", "d_s_up",
                                "d_s_down"};
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "run --impl %s %s", impls[i], shape);
    const int rc = run_cli(args, out, sizeof out);
    CHECK_MSG(rc == 0, "mok %s: rc %d: %s", args, rc, out);
    for (int q = 0; q < 9; q++) {
      const double a = run_l2(out, names[q]), b = run_l2(ref, names[q]);
      CHECK_MSG(a > 0 && b > 0 && fabs(a - b) <= 1e-2 * b, "--impl %s: %s l2 %g, cpu %g", impls[i], names[q], a, b);
    }
  }
}

/* `mok bench layer` where a token count's buffers do not fit the GPU: a message that names
 * the buffer, its size and the free memory, exit 1; the buffers it did get are freed, so
 * the next token count of the same run still runs (T: x and out take ~40% of the memory
 * each, so d_out is the one that fails, after x, the weights and out were allocated). */
MOK_GPU_TEST(cli_bench_layer_out_of_memory, 1) {
  NEED_CLI();
  size_t fr = 0, tot = 0;
  CHECK(cudaMemGetInfo(&fr, &tot) == cudaSuccess);
  const long long T = (long long)(0.4 * (double)tot / (2.0 * 4096)); /* qwen3.5: H = 4096 */
  static char out[1 << 16];
  char args[512];
  snprintf(args, sizeof args, "bench layer --impl nccl --gpus 1 --model qwen3.5-397b-a17b --tokens %lld,256 "
                              "--iters 1 --warmup 0 --check-tokens 1", T);
  const int rc = run_cli(args, out, sizeof out);
  CHECK_MSG(rc == 1, "rc %d (want 1: one token count failed): %s", rc, out);
  CHECK_MSG(strstr(out, "cudaMalloc of d_out") && strstr(out, "GiB free") && strstr(out, "--gpus"),
            "no message naming the buffer that did not fit: %s", out);
  CHECK_MSG(strstr(out, "T=256 EP1 nccl] forward "), "the next token count did not run: %s", out);
}

/* `mok bench stream --two-streams` (whether two launches on two streams are resident at
 * once): exits 0 with its five cases; where launch A holds every SM, B cannot start
 * before A's CTAs give up, so that case must say "no" whatever the machine. */
MOK_GPU_TEST(cli_bench_stream_two_streams, 1) {
  NEED_CLI();
  static char out[1 << 14];
  const int rc = run_cli("bench stream --two-streams", out, sizeof out);
  CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
  CHECK_MSG(strstr(out, "CUDA_DEVICE_MAX_CONNECTIONS="), "%s", out);
  const char *every = strstr(out, "| A on every SM");
  CHECK_MSG(every && strstr(every, "| no (100 ms) |"), "the impossible case did not say no: %s", out);
  int rows = 0;
  for (const char *p = out; (p = strstr(p, "\n| ")); ++p) ++rows;
  CHECK_MSG(rows == 6, "%d table rows (want a header and 5 cases): %s", rows, out);
}

/* How often s occurs in out. */
static int count_str(const char *out, const char *s) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, s)); ++p) ++n;
  return n;
}
/* How many `"key": value` fields js holds; -1 if a value lies outside [lo, hi) (*bad: it). */
static int json_fields(const char *js, const char *key, double lo, double hi, double *bad) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  int n = 0;
  for (const char *p = js; (p = strstr(p, pat)); ++p, ++n) {
    const double v = atof(p + strlen(pat));
    if (!(v >= lo && v < hi)) {
      *bad = v;
      return -1;
    }
  }
  return n;
}

/* `mok bench gemm` end to end on a small shape: every kind checked against float64 (exit 0
 * only if all are right), and under Zipf routing each kind also timed on balanced rows in
 * the same process (--vs-balanced, on by default there), its ratio printed and in the JSON;
 * and cuBLAS on the Zipf rows (--vs-cublas-zipf, likewise), its grouped call and its GEMM an
 * expert agreeing (exit 1 otherwise), ours over the faster printed and in the JSON. */
MOK_GPU_TEST(cli_bench_gemm_zipf_vs_balanced, 1) {
  NEED_CLI();
  static char out[1 << 16];
  const char *json = "/tmp/mok_test_bench_gemm.json";
  char args[512];
  snprintf(args, sizeof args, "bench gemm --hidden 256 --inter 128 --experts 6 --rows-per-expert 150 "
                              "--routing zipf:1.2 --iters 3 --seed 11 --json %s", json);
  const int rc = run_cli(args, out, sizeof out);
  if (strstr(out, "not in this build")) SKIP("mok built without the GEMMs");
  CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
  int lines = count_str(out, "zipf / balanced rows, ours in turn:");
  CHECK_MSG(lines == 8, "%d vs-balanced lines (want one a kind, 8): %s", lines, out);
  lines = count_str(out, "cuBLAS on the zipf rows (");
  CHECK_MSG(lines == 8, "%d vs-cublas-zipf lines (want one a kind, 8): %s", lines, out);
  FILE *f = fopen(json, "r");
  CHECK(f != NULL);
  if (f) {
    static char js[1 << 16];
    const size_t n = fread(js, 1, sizeof js - 1, f);
    js[n] = 0;
    fclose(f);
    remove(json);
    static const struct { const char *key; double lo, hi; } f8[] = {
        {"zipf_over_balanced", 0.05, 20}, {"ours_over_cublas_zipf", 0.01, 100}, {"cublas_zipf_forms_diff", 0, 1e-2}};
    for (int i = 0; i < 3; ++i) {
      double bad = 0;
      const int fields = json_fields(js, f8[i].key, f8[i].lo, f8[i].hi, &bad);
      CHECK_MSG(fields == 8, "%d %s fields (want 8, each in [%g, %g); out of it: %g): %s", fields, f8[i].key, f8[i].lo,
                f8[i].hi, bad, js);
    }
  }
  /* off: no such line; balanced routing: none either */
  CHECK(run_cli("bench gemm --hidden 256 --inter 128 --experts 6 --rows-per-expert 150 --routing zipf:1.2 "
                "--iters 2 --kinds down --vs-balanced off --vs-cublas-zipf off", out, sizeof out) == 0 &&
        !strstr(out, "zipf / balanced") && !strstr(out, "cuBLAS on the zipf rows"));
  CHECK(run_cli("bench gemm --hidden 256 --inter 128 --experts 6 --rows-per-expert 150 --iters 2 --kinds down",
                out, sizeof out) == 0 &&
        !strstr(out, "zipf / balanced") && !strstr(out, "cuBLAS on the zipf rows"));
  /* experts with no rows (80 rows over 40 experts, Zipf 1.5): cuBLAS skips them, ours too */
  CHECK_MSG(run_cli("bench gemm --hidden 128 --inter 64 --experts 40 --rows-per-expert 2 --routing zipf:1.5 "
                    "--iters 2 --kinds gateup,wdown", out, sizeof out) == 0,
            "%s", out);
  lines = count_str(out, "cuBLAS on the zipf rows (");
  CHECK_MSG(lines == 2, "%d vs-cublas-zipf lines with empty experts (want 2): %s", lines, out);
}

MOK_TEST(cli_info) {
  NEED_CLI();
  static char out[1 << 16];
  CHECK_MSG(run_cli("info", out, sizeof out) == 0, "%s", out);
  CHECK(strstr(out, "mok 0.") && strstr(out, "NCCL") && strstr(out, "GPUs"));
  CHECK_MSG(strstr(out, "CUDA_DEVICE_MAX_CONNECTIONS=") && strstr(out, "CUDA_MODULE_LOADING="), "%s", out);
  /* the settings as the process has them (the child inherits this one's environment) */
  test_env_saved saved;
  test_env_set("CUDA_DEVICE_MAX_CONNECTIONS", "1", &saved);
  const int rc = run_cli("info", out, sizeof out);
  test_env_restore("CUDA_DEVICE_MAX_CONNECTIONS", &saved);
  CHECK_MSG(rc == 0 && strstr(out, "CUDA_DEVICE_MAX_CONNECTIONS=1 (one queue"), "%s", out);
}

/* `mok memory` prints, for each model, the layer's and the scratch's GiB (even and worst
 * routing) computed from the layouts; --layers adds the total. The numbers must be what
 * mokLayerMemoryEstimate says. */
MOK_TEST(cli_memory) {
  NEED_CLI();
  static char out[1 << 16];
  CHECK_MSG(run_cli("memory --model kimi-k2.7-code,qwen3.5-397b-a17b --gpus 8 --tokens 4096 --layers 60", out,
                    sizeof out) == 0, "%s", out);
  const char *line = strstr(out, "\nkimi-k2.7-code");
  CHECK_MSG(line && strstr(out, "\nqwen3.5-397b-a17b") && strstr(out, "total of the layers"), "%s", out);
  double own = 0, scr = 0, own_w = 0, scr_w = 0, tot = 0, tot_w = 0;
  CHECK_MSG(sscanf(line + 1, "kimi-k2.7-code %lf %lf %lf %lf %lf / %lf", &own, &scr, &own_w, &scr_w, &tot, &tot_w) == 6,
            "%s", out);
  mokConfig_t c = MOK_CONFIG_INITIALIZER;
  CHECK_OK(mokConfigSetModel(&c, "kimi-k2.7-code"));
  c.num_ranks = 8, c.max_tokens = 4096;
  size_t b[4];
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplAuto, 4096, 0, &b[0], &b[1]));
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplAuto, 4096, 1, &b[2], &b[3]));
  const double G = 1073741824.0, got[4] = {own, scr, own_w, scr_w};
  for (int q = 0; q < 4; q++) CHECK_MSG(fabs(got[q] - b[q] / G) < 0.006, "column %d: %g vs %g GiB", q, got[q], b[q] / G);
  CHECK_MSG(fabs(tot - (60 * b[0] + b[1]) / G) < 0.06, "total %g", tot);
  /* --contexts 4: each layer's own counted once a context in the totals */
  CHECK_MSG(run_cli("memory --model kimi-k2.7-code --gpus 8 --tokens 4096 --layers 60 --contexts 4", out,
                    sizeof out) == 0, "%s", out);
  line = strstr(out, "\nkimi-k2.7-code");
  CHECK_MSG(line && sscanf(line + 1, "kimi-k2.7-code %lf %lf %lf %lf %lf / %lf", &own, &scr, &own_w, &scr_w, &tot,
                           &tot_w) == 6 && strstr(out, "once a context"), "%s", out);
  CHECK_MSG(fabs(own - b[0] / G) < 0.006 && fabs(tot - (240 * b[0] + b[1]) / G) < 0.1 &&
            fabs(tot_w - (240 * b[2] + b[3]) / G) < 0.3, "contexts 4: total %g / %g", tot, tot_w);
  CHECK(run_cli("memory --contexts 0", out, sizeof out) != 0 && strstr(out, "--contexts takes 1..64"));
  CHECK(run_cli("memory --help", out, sizeof out) == 0 && strstr(out, "mokLayerReserve"));
  /* --impl mega at EP8: the same columns as the estimate, the window in the scratch */
  CHECK_MSG(run_cli("memory --model qwen3.5-397b-a17b --gpus 8 --tokens 8192 --impl mega", out, sizeof out) == 0, "%s",
            out);
  line = strstr(out, "\nqwen3.5-397b-a17b");
  CHECK_MSG(line && sscanf(line + 1, "qwen3.5-397b-a17b %lf %lf %lf %lf", &own, &scr, &own_w, &scr_w) == 4, "%s", out);
  CHECK_OK(mokConfigSetModel(&c, "qwen3.5-397b-a17b"));
  c.num_ranks = 8, c.max_tokens = 8192;
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplMega, 8192, 0, &b[0], &b[1]));
  CHECK_MSG(fabs(own - b[0] / G) < 0.006 && fabs(scr - b[1] / G) < 0.006 && scr > 0.6, "mega: %g / %g GiB vs %g / %g",
            own, scr, b[0] / G, b[1] / G);
  /* --budget: the most tokens a rank whose 61 layers fit in 80 GiB (even routing) */
  CHECK_MSG(run_cli("memory --model glm-5.2 --gpus 8 --layers 61 --budget 80", out, sizeof out) == 0, "%s", out);
  line = strstr(out, "\nglm-5.2");
  int fit = -1;
  CHECK_MSG(line && sscanf(line + 1, "glm-5.2 %*f %*f %*f %*f %*f / %*f %d", &fit) == 1 && fit > 0, "%s", out);
  CHECK_OK(mokConfigSetModel(&c, "glm-5.2"));
  c.num_ranks = 8;
  for (int q = 0; q < 2; q++) { /* fit tokens fit, one more does not */
    c.max_tokens = fit + q;
    CHECK_OK(mokLayerMemoryEstimate(&c, mokImplAuto, fit + q, 0, &b[0], &b[1]));
    const double need = 61.0 * b[0] + b[1];
    CHECK_MSG(q ? need > 80 * G : need <= 80 * G, "%d tokens need %g GiB", fit + q, need / G);
  }
}

