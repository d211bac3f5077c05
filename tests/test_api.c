/*
 * test_api.c — status strings, version, config validation, the layer handle and the
 * error channels. Every bad config gets mokInvalidArgument, a message naming the
 * field, and leaves the caller's output untouched.
 */
#include <pthread.h>
#include <string.h>

#include "mok.h"
#include "test.h"

MOK_TEST(api_version_and_status_strings) {
  int v = -1;
  CHECK_OK(mokGetVersion(&v));
  CHECK(v == MOK_VERSION_CODE);
  CHECK_STATUS(mokGetVersion(NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "version") != NULL);
  for (int r = 0; r < mokNumResults; r++) {
    const char *n = mokGetErrorName((mokResult_t)r), *s = mokGetErrorString((mokResult_t)r);
    CHECK(n && s && strncmp(n, "mok", 3) == 0 && strlen(s) > 3);
    for (int q = 0; q < r; q++) CHECK_MSG(strcmp(n, mokGetErrorName((mokResult_t)q)), "duplicate name %s", n);
  }
  CHECK(!strcmp(mokGetErrorName(mokInvalidArgument), "mokInvalidArgument"));
  CHECK(!strcmp(mokGetErrorName((mokResult_t)999), "mokUnknownResult"));
  CHECK(mokGetErrorString((mokResult_t)-5) != NULL);
}

static mokConfig_t good_config(void) {
  mokConfig_t c = MOK_CONFIG_INITIALIZER;
  c.num_experts = 8, c.hidden = 128, c.inter = 64, c.topk = 2, c.shared_inter = 64, c.num_ranks = 2;
  c.max_tokens = 16;
  return c;
}

MOK_TEST(api_config_init_and_defaults) {
  mokConfig_t a, b = MOK_CONFIG_INITIALIZER;
  memset(&a, 0x5a, sizeof a);
  CHECK_OK(mokConfigInit(&a));
  CHECK(!memcmp(&a, &b, sizeof a));
  CHECK(a.size == sizeof(mokConfig_t) && a.magic == MOK_CONFIG_MAGIC && a.num_ranks == 1);
  CHECK_STATUS(mokConfigInit(NULL), mokInvalidArgument);
  mokConfig_t c = good_config();
  mokLayer_t l = NULL;
  CHECK_OK(mokLayerCreate(&l, &c));
  mokConfig_t got;
  CHECK_OK(mokLayerGetConfig(l, &got));
  CHECK(got.row_pad == MOK_DEFAULT_ROW_PAD && got.hidden == 128 && got.num_ranks == 2);
  int64_t cap = 0;
  CHECK_OK(mokLayerScheduleCapacity(l, &cap));
  /* N*T_max*k + E_l*(P-1) rounded up to P */
  int64_t want = (2 * 16 * 2 + 4 * 63 + 63) / 64 * 64;
  CHECK_MSG(cap == want, "capacity %lld, want %lld", (long long)cap, (long long)want);
  CHECK_STATUS(mokLayerGetConfig(l, NULL), mokInvalidArgument);
  CHECK(strstr(mokLayerGetLastError(l), "config is NULL") != NULL);
  CHECK_OK(mokLayerDestroy(l));
  CHECK_OK(mokLayerDestroy(NULL));
  CHECK(!strcmp(mokLayerGetLastError(NULL), ""));
}

MOK_TEST(api_model_presets) {
  int count = 0;
  const char *name = NULL;
  CHECK_OK(mokModelName(0, &name, &count));
  CHECK(count >= 7 && name);
  for (int i = 0; i < count; i++) {
    CHECK_OK(mokModelName(i, &name, NULL));
    mokConfig_t c = MOK_CONFIG_INITIALIZER;
    CHECK_OK(mokConfigSetModel(&c, name));
    c.max_tokens = 2048;
    c.num_ranks = 8;
    mokLayer_t l;
    CHECK_OK(mokLayerCreate(&l, &c)); /* every published shape is valid at EP8 */
    mokLayerDestroy(l);
  }
  CHECK_OK(mokModelName(count, &name, NULL));
  CHECK(name == NULL);
  mokConfig_t c = MOK_CONFIG_INITIALIZER;
  CHECK_OK(mokConfigSetModel(&c, "deepseek-v3"));
  CHECK(c.num_experts == 256 && c.hidden == 7168 && c.inter == 2048 && c.topk == 8 && c.shared_inter == 2048);
  mokConfig_t before = c;
  CHECK_STATUS(mokConfigSetModel(&c, "gpt-5"), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "gpt-5") && strstr(mokGetLastError(), "glm-5.2"));
  CHECK(!memcmp(&before, &c, sizeof c));
}

typedef struct {
  const char *what;
  void (*mutate)(mokConfig_t *);
  const char *field; /* must appear in the message */
} bad_case;

static void m_k_gt_e(mokConfig_t *c) { c->num_experts = 2, c->num_ranks = 1, c->topk = 3; }
static void m_e_div(mokConfig_t *c) { c->num_experts = 9; }
static void m_h64(mokConfig_t *c) { c->hidden = 100; }
static void m_i64(mokConfig_t *c) { c->inter = 96; }
static void m_is64(mokConfig_t *c) { c->shared_inter = 32; }
static void m_neg_h(mokConfig_t *c) { c->hidden = -64; }
static void m_neg_e(mokConfig_t *c) { c->num_experts = -8; }
static void m_neg_is(mokConfig_t *c) { c->shared_inter = -64; }
static void m_k0(mokConfig_t *c) { c->topk = 0; }
static void m_k33(mokConfig_t *c) { c->num_experts = 64, c->topk = 33; }
static void m_ranks0(mokConfig_t *c) { c->num_ranks = 0; }
static void m_tmax(mokConfig_t *c) { c->max_tokens = 0; }
static void m_dtype(mokConfig_t *c) { c->grad_dtype = (mokDtype_t)7; }
static void m_limit(mokConfig_t *c) { c->swiglu_limit = -1.0f; }
static void m_limit_nan(mokConfig_t *c) { c->swiglu_limit = 0.0f / 0.0f; }
static void m_pad(mokConfig_t *c) { c->row_pad = 96; }
static void m_magic(mokConfig_t *c) { c->magic = 0; }
static void m_size(mokConfig_t *c) { c->size = 8; }
static void m_version(mokConfig_t *c) { c->version = 990000; }
static void m_overflow(mokConfig_t *c) { c->max_tokens = 1 << 28, c->topk = 8; }

MOK_TEST(api_config_validation) {
  bad_case cases[] = {
      {"k > E", m_k_gt_e, "topk"},
      {"E not divisible by ranks", m_e_div, "num_experts"},
      {"H not a multiple of 64", m_h64, "hidden"},
      {"I not a multiple of 64", m_i64, "inter"},
      {"I_s not a multiple of 64", m_is64, "shared_inter"},
      {"negative H", m_neg_h, "hidden"},
      {"negative E", m_neg_e, "num_experts"},
      {"negative I_s", m_neg_is, "shared_inter"},
      {"k = 0", m_k0, "topk"},
      {"k = 33", m_k33, "topk"},
      {"0 ranks", m_ranks0, "num_ranks"},
      {"T_max = 0", m_tmax, "max_tokens"},
      {"bad dtype", m_dtype, "grad_dtype"},
      {"negative clamp", m_limit, "swiglu_limit"},
      {"NaN clamp", m_limit_nan, "swiglu_limit"},
      {"row_pad 96", m_pad, "row_pad"},
      {"no magic", m_magic, "magic"},
      {"short size", m_size, "size"},
      {"other major version", m_version, "version"},
      {"int32 overflow", m_overflow, "int32"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mokConfig_t c = good_config();
    cases[i].mutate(&c);
    mokLayer_t l = (mokLayer_t)(uintptr_t)0x1234;
    mokResult_t r = mokLayerCreate(&l, &c);
    CHECK_MSG(r == mokInvalidArgument, "%s: got %s", cases[i].what, mokGetErrorName(r));
    CHECK_MSG(l == (mokLayer_t)(uintptr_t)0x1234, "%s: the handle output was written", cases[i].what);
    CHECK_MSG(strstr(mokGetLastError(), cases[i].field) != NULL, "%s: message '%s' does not name %s",
              cases[i].what, mokGetLastError(), cases[i].field);
  }
  mokConfig_t c = good_config();
  CHECK_STATUS(mokLayerCreate(NULL, &c), mokInvalidArgument);
  mokLayer_t l = NULL;
  CHECK_STATUS(mokLayerCreate(&l, NULL), mokInvalidArgument);
  CHECK(l == NULL);
  /* a success clears the thread's message */
  CHECK_OK(mokLayerCreate(&l, &c));
  CHECK(!strcmp(mokGetLastError(), ""));
  mokLayerDestroy(l);
}

static void *other_thread(void *arg) {
  (void)arg;
  mokConfig_t c = MOK_CONFIG_INITIALIZER; /* missing required fields */
  mokLayer_t l;
  mokLayerCreate(&l, &c);
  return (void *)(uintptr_t)(strstr(mokGetLastError(), "num_experts") != NULL);
}

MOK_TEST(api_last_error_is_per_thread) {
  CHECK_STATUS(mokGetVersion(NULL), mokInvalidArgument);
  char mine[512];
  snprintf(mine, sizeof mine, "%s", mokGetLastError());
  pthread_t th;
  void *res = NULL;
  CHECK(pthread_create(&th, NULL, other_thread, NULL) == 0);
  pthread_join(th, &res);
  CHECK(res == (void *)1);
  CHECK(!strcmp(mine, mokGetLastError())); /* the other thread's failure did not touch ours */
}

MOK_TEST(api_bf16_conversion) {
  CHECK(mokFloatToBf16(1.0f) == 0x3f80);
  CHECK(mokFloatToBf16(-2.0f) == 0xc000);
  CHECK(mokBf16ToFloat(0x3f80) == 1.0f);
  /* round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1.0) */
  CHECK(mokFloatToBf16(1.0f + 1.0f / 256) == 0x3f80);
  CHECK(mokFloatToBf16(1.0f + 3.0f / 256) == 0x3f82);
  float nan = 0.0f / 0.0f;
  float back = mokBf16ToFloat(mokFloatToBf16(nan));
  CHECK(back != back);
  CHECK(mokBf16ToFloat(mokFloatToBf16(3.0e38f * 10)) > 1e38f); /* inf stays inf */
}

/* The GPU entry points validate on the host first: these run without a GPU. */
MOK_TEST(api_gpu_entry_points_validate_on_host) {
  mokConfig_t c = good_config();
  mokLayer_t host = NULL, l = (mokLayer_t)(uintptr_t)0x77;
  CHECK_STATUS(mokLayerCreateOnComm(&l, &c, NULL), mokInvalidArgument);
  CHECK(l == (mokLayer_t)(uintptr_t)0x77 && strstr(mokGetLastError(), "comm"));
  CHECK_STATUS(mokLayerCreateOnComm(NULL, &c, NULL), mokInvalidArgument);
  CHECK_OK(mokLayerCreate(&host, &c));
  mokRankInput_t in = {0, NULL, NULL, NULL};
  mokRankWeights_t w = {0};
  CHECK_STATUS(mokLayerForward(NULL, mokImplAuto, &in, &w, NULL, NULL), mokInvalidArgument);
  CHECK_STATUS(mokLayerForward(host, mokImplAuto, &in, &w, NULL, NULL), mokInvalidUsage);
  CHECK(strstr(mokLayerGetLastError(host), "mokLayerCreateOnComm") != NULL);
  mokRankGrads_t g = {0};
  CHECK_STATUS(mokLayerBackward(host, mokImplBaseline, &in, &w, NULL, &g, NULL), mokInvalidUsage);
  size_t own = 7, scratch = 7;
  CHECK_STATUS(mokLayerReserve(NULL, 16, NULL), mokInvalidArgument);
  CHECK_STATUS(mokLayerReserve(host, 16, NULL), mokInvalidUsage);
  CHECK_STATUS(mokLayerMemoryInfo(NULL, &own, &scratch), mokInvalidArgument);
  CHECK_STATUS(mokLayerMemoryInfo(host, &own, &scratch), mokInvalidUsage);
  CHECK(own == 7 && scratch == 7 && strstr(mokGetLastError(), "mokLayerMemoryInfo") != NULL);
  CHECK_STATUS(mokLayerTrim(NULL, MOK_TRIM_SAVED, NULL), mokInvalidArgument);
  CHECK_STATUS(mokLayerTrim(host, MOK_TRIM_SAVED | MOK_TRIM_SCRATCH, NULL), mokInvalidUsage);
  CHECK(strstr(mokGetLastError(), "mokLayerTrim") != NULL);
  CHECK_STATUS(mokLayerSetRecvCapacity(NULL, 16), mokInvalidArgument);
  CHECK_STATUS(mokLayerSetRecvCapacity(host, 16), mokInvalidUsage);
  mokResult_t async = mokInternalError;
  CHECK_STATUS(mokLayerGetAsyncError(NULL, &async), mokInvalidArgument);
  CHECK_STATUS(mokLayerGetAsyncError(host, NULL), mokInvalidArgument);
  CHECK_OK(mokLayerGetAsyncError(host, &async)); /* (a host-only layer: nothing can be recorded) */
  CHECK(async == mokSuccess);
  mokLayerDestroy(host);
  CHECK_STATUS(mokGenerateBf16Device(1, mokTensorX, 0, 0, 16, 1.0f, NULL, NULL), mokInvalidArgument);
  CHECK_STATUS(mokGenerateBf16Device(1, (mokTensorKind_t)0, 0, 0, 16, 1.0f, NULL, NULL), mokInvalidArgument);
  CHECK_OK(mokGenerateBf16Device(1, mokTensorX, 0, 0, 0, 1.0f, NULL, NULL)); /* nothing to do */
  mokComm_t comms[2] = {0};
  CHECK_STATUS(mokLocalCommsCreate(0, NULL, NULL, comms), mokInvalidArgument);
}

/* mokLayerMemoryEstimate: host only. The layer's rows follow the routes: under the worst
 * routing at EP8 a layer needs N times the rows of an even spread (and its memory grows about
 * so), every size grows with the tokens, one GPU's even and worst are the same (every route is
 * local), and mokImplMega's rows are its bound T k + E_l (P - 1) on one GPU, the rows
 * received at N > 1 (its window in the scratch). Bad arguments are refused. */
MOK_TEST(api_memory_estimate) {
  mokConfig_t c = MOK_CONFIG_INITIALIZER;
  CHECK_OK(mokConfigSetModel(&c, "glm-5.2"));
  c.num_ranks = 8, c.max_tokens = 8192;
  size_t own[2], scr[2], own_half, scr_half;
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplNccl, 8192, 0, &own[0], &scr[0]));
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplNccl, 8192, 1, &own[1], &scr[1]));
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplNccl, 4096, 0, &own_half, &scr_half));
  const double G = 1073741824.0;
  /* even: X, [g|u], a of T k = 65536 rows (+ padding) and y in send order: ~2.3 GiB */
  CHECK_MSG(own[0] > 2.0 * G && own[0] < 2.8 * G, "%g GiB", own[0] / G);
  CHECK_MSG(own[1] > 3.5 * own[0] && scr[1] > 3.5 * scr[0], "worst %g / %g, even %g / %g", own[1] / G, scr[1] / G,
            own[0] / G, scr[0] / G);
  CHECK(own_half < own[0] && scr_half < scr[0] && own_half > own[0] / 3);
  size_t b0 = 0, b1 = 0;
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplBaseline, 8192, 0, &b0, &b1));
  CHECK_MSG(b1 > scr[0], "cuBLAS's fp32 dA / dX rows make its scratch larger: %zu vs %zu", b1, scr[0]);
  c.num_ranks = 1;
  size_t m[4];
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplMega, 1000, 0, &m[0], &m[1]));
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplMega, 1000, 1, &m[2], &m[3]));
  CHECK(m[0] == m[2] && m[1] == m[3]);
  const double rows = 1000.0 * c.topk + 256 * 63 + 64, per_row = 2.0 * (2 * c.hidden + 3 * c.inter);
  CHECK_MSG(m[0] > (rows - 128) * per_row && m[0] < rows * per_row + 64e6, "mega: %zu bytes", m[0]);
  CHECK_STATUS(mokLayerMemoryEstimate(NULL, mokImplNccl, 16, 0, &m[0], &m[1]), mokInvalidArgument);
  CHECK_STATUS(mokLayerMemoryEstimate(&c, mokImplNccl, -1, 0, &m[0], &m[1]), mokInvalidArgument);
  CHECK_STATUS(mokLayerMemoryEstimate(&c, mokImplNccl, 8193, 0, &m[0], &m[1]), mokInvalidArgument);
  CHECK_STATUS(mokLayerMemoryEstimate(&c, (mokImpl_t)77, 16, 0, &m[0], &m[1]), mokInvalidArgument);
  /* mokImplMega at N > 1: the NCCL paths' rows, and the window (COMB: T_max k rows of H bf16
   * and X: T_max rows) in the scratch */
  c.num_ranks = 8, c.max_tokens = 8192;
  size_t e[4];
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplMega, 8192, 0, &e[0], &e[1]));
  CHECK_OK(mokLayerMemoryEstimate(&c, mokImplMega, 8192, 1, &e[2], &e[3]));
  const double window = 2.0 * 8192 * c.hidden * (c.topk + 1);
  CHECK_MSG(e[1] > window && e[3] > e[1] && e[2] > 3.5 * e[0], "mega EP8: layer %g / %g GiB, scratch %g / %g GiB",
            e[0] / G, e[2] / G, e[1] / G, e[3] / G);
  CHECK_MSG(e[0] > 1.5 * G && e[0] < 1.05 * own[0], "mega EP8 even: %g GiB (nccl %g)", e[0] / G,
            own[0] / G);
}

