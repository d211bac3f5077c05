/*
 * api.c — status strings, last-error messages, version, config validation and the
 * layer handle. Host only.
 */
#include "internal.h"
#include "workspace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- status ------------------------------------------------------------------- */
#define NAME_CASE_(name, value, text) case name: return #name;
#define TEXT_CASE_(name, value, text) case name: return text;

const char *mokGetErrorName(mokResult_t r) {
  switch (r) {
    MOK_RESULT_LIST(NAME_CASE_)
    default: return "mokUnknownResult";
  }
}

const char *mokGetErrorString(mokResult_t r) {
  switch (r) {
    MOK_RESULT_LIST(TEXT_CASE_)
    default: return "unknown mok status";
  }
}

/* ---- last error ---------------------------------------------------------------- */
static _Thread_local char g_thread_error[MOK_ERRMSG_LEN];

const char *mokGetLastError(void) { return g_thread_error; }

void mok_clear_error(void) { g_thread_error[0] = '\0'; }

mokResult_t mok_error(struct mokLayer *layer, mokResult_t status, const char *fmt, ...) {
  /* Format into a local buffer first: callers may pass mokGetLastError() as an argument
   * to wrap an inner message. */
  char buf[MOK_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(g_thread_error, buf, sizeof buf);
  if (layer) memcpy(layer->last_error, g_thread_error, sizeof layer->last_error);
  return status;
}

mokResult_t mokGetVersion(int *version) {
  mok_clear_error();
  if (!version) return mok_error(NULL, mokInvalidArgument, "mokGetVersion: version is NULL");
  *version = MOK_VERSION_CODE;
  return mokSuccess;
}

/* ---- config -------------------------------------------------------------------- */
mokResult_t mokConfigInit(mokConfig_t *config) {
  mok_clear_error();
  if (!config) return mok_error(NULL, mokInvalidArgument, "mokConfigInit: config is NULL");
  mokConfig_t init = MOK_CONFIG_INITIALIZER;
  *config = init;
  return mokSuccess;
}

#define BAD_FIELD(...) return mok_error(NULL, mokInvalidArgument, __VA_ARGS__)

mokResult_t mok_config_validate(const mokConfig_t *in, mokConfig_t *out) {
  if (!in) BAD_FIELD("config is NULL");
  if (in->magic != MOK_CONFIG_MAGIC)
    BAD_FIELD("config.magic is 0x%08x, expected MOK_CONFIG_MAGIC: initialise the config with "
              "MOK_CONFIG_INITIALIZER or mokConfigInit", in->magic);
  if (in->size < sizeof(mokConfig_t))
    BAD_FIELD("config.size is %zu, this library needs %zu: rebuild against this mok.h",
              in->size, sizeof(mokConfig_t));
  if (in->version / 10000 != MOK_VERSION_MAJOR)
    BAD_FIELD("config.version %u is from mok major version %u; this library is %d",
              in->version, in->version / 10000, MOK_VERSION_MAJOR);
  mokConfig_t c = *in;
  c.size = sizeof(mokConfig_t);
  if (c.row_pad == 0) c.row_pad = MOK_DEFAULT_ROW_PAD;
  if (c.num_experts < 1) BAD_FIELD("config.num_experts is %d: it must be >= 1", c.num_experts);
  if (c.num_ranks < 1) BAD_FIELD("config.num_ranks is %d: it must be >= 1", c.num_ranks);
  if (c.num_experts % c.num_ranks)
    BAD_FIELD("config.num_experts (%d) is not divisible by config.num_ranks (%d)",
              c.num_experts, c.num_ranks);
  if (c.hidden < 64 || c.hidden % 64)
    BAD_FIELD("config.hidden is %d: it must be a positive multiple of 64", c.hidden);
  if (c.inter < 64 || c.inter % 64)
    BAD_FIELD("config.inter is %d: it must be a positive multiple of 64", c.inter);
  if (c.shared_inter < 0 || c.shared_inter % 64)
    BAD_FIELD("config.shared_inter is %d: it must be 0 (no shared expert) or a multiple of 64",
              c.shared_inter);
  if (c.topk < 1 || c.topk > 32) BAD_FIELD("config.topk is %d: it must be in [1, 32]", c.topk);
  if (c.topk > c.num_experts)
    BAD_FIELD("config.topk (%d) is larger than config.num_experts (%d)", c.topk, c.num_experts);
  if (c.max_tokens < 1) BAD_FIELD("config.max_tokens is %d: it must be >= 1", c.max_tokens);
  if (c.grad_dtype != mokDtypeBF16 && c.grad_dtype != mokDtypeFP32)
    BAD_FIELD("config.grad_dtype is %d: it must be mokDtypeBF16 or mokDtypeFP32", (int)c.grad_dtype);
  if (!(c.swiglu_limit >= 0.0f) || isinf(c.swiglu_limit))
    BAD_FIELD("config.swiglu_limit is %g: it must be finite and >= 0 (0 = off)", (double)c.swiglu_limit);
  if (c.row_pad < 0 || c.row_pad % 64)
    BAD_FIELD("config.row_pad is %d: it must be 0 (default) or a positive multiple of 64", c.row_pad);
  int64_t el = c.num_experts / c.num_ranks;
  int64_t rows = (int64_t)c.num_ranks * c.max_tokens * c.topk + el * c.row_pad;
  if (rows >= ((int64_t)1 << 31))
    BAD_FIELD("config: num_ranks * max_tokens * topk + local experts * row_pad = %lld rows does "
              "not fit int32 (< 2^31); lower max_tokens", (long long)rows);
  *out = c;
  return mokSuccess;
}

/* ---- layer --------------------------------------------------------------------- */
mokResult_t mok_check_accumulate(struct mokLayer *l, const char *fn, int s, int accumulate) {
  if (accumulate != 0 && accumulate != 1)
    return mok_error(l, mokInvalidArgument, "%s: grads[%d].accumulate = %d, must be 0 or 1", fn, s < 0 ? 0 : s,
                     accumulate);
  if (accumulate && l->cfg.grad_dtype != mokDtypeFP32)
    return mok_error(l, mokInvalidArgument, "%s: grads[%d].accumulate needs grad_dtype mokDtypeFP32 (bf16 gradients "
                     "are overwritten, never summed in bf16)", fn, s < 0 ? 0 : s);
  return mokSuccess;
}

mokResult_t mokLayerCreate(mokLayer_t *layer, const mokConfig_t *config) {
  mok_clear_error();
  if (!layer) return mok_error(NULL, mokInvalidArgument, "mokLayerCreate: layer is NULL");
  mokConfig_t c;
  MOK_CHECK(mok_config_validate(config, &c));
  struct mokLayer *l = calloc(1, sizeof *l);
  if (!l) return mok_error(NULL, mokOutOfMemory, "mokLayerCreate: out of host memory");
  mok_layer_init_host(l, &c);
  *layer = l;
  return mokSuccess;
}

void mok_layer_init_host(struct mokLayer *l, const mokConfig_t *c) {
  l->cfg = *c;
  l->local_experts = c->num_experts / c->num_ranks;
  int64_t worst = (int64_t)c->num_ranks * c->max_tokens * c->topk + (int64_t)l->local_experts * (c->row_pad - 1);
  l->sched_capacity = mok_round_up(worst, c->row_pad);
}

mokResult_t mokLayerDestroy(mokLayer_t layer) {
  mok_clear_error();
  if (!layer) return mokSuccess;
  mok_gpu_layer_free(layer);
  free(layer);
  return mokSuccess;
}

mokResult_t mokLayerGetConfig(mokLayer_t layer, mokConfig_t *config) {
  mok_clear_error();
  if (!layer) return mok_error(NULL, mokInvalidArgument, "mokLayerGetConfig: layer is NULL");
  if (!config) return mok_error(layer, mokInvalidArgument, "mokLayerGetConfig: config is NULL");
  *config = layer->cfg;
  return mokSuccess;
}

const char *mokLayerGetLastError(mokLayer_t layer) { return layer ? layer->last_error : ""; }

mokResult_t mokLayerScheduleCapacity(mokLayer_t layer, int64_t *rows) {
  mok_clear_error();
  if (!layer) return mok_error(NULL, mokInvalidArgument, "mokLayerScheduleCapacity: layer is NULL");
  if (!rows) return mok_error(layer, mokInvalidArgument, "mokLayerScheduleCapacity: rows is NULL");
  *rows = layer->sched_capacity;
  return mokSuccess;
}

mokResult_t mokLayerMemoryEstimate(const mokConfig_t *config, mokImpl_t impl, int num_tokens, int worst,
                                   size_t *layer_bytes, size_t *comm_scratch_bytes) {
  static const char fn[] = "mokLayerMemoryEstimate";
  mok_clear_error();
  mokConfig_t c;
  MOK_CHECK(mok_config_validate(config, &c));
  if (num_tokens < 0 || num_tokens > c.max_tokens)
    return mok_error(NULL, mokInvalidArgument, "%s: num_tokens %d is outside [0, max_tokens %d]", fn, num_tokens,
                     c.max_tokens);
  if (impl == mokImplAuto) impl = mokImplNccl;
  if (impl != mokImplNccl && impl != mokImplBaseline && impl != mokImplMega)
    return mok_error(NULL, mokInvalidArgument, "%s: impl %d is not built", fn, (int)impl);
  const int64_t recv = (worst ? c.num_ranks : 1) * (int64_t)num_tokens * c.topk;
  /* mokImplMega: the scratch of a shared expert on cuBLAS is the larger; on one GPU its rows
   * are the bound, at N > 1 the rows received (as the NCCL paths') and the comm's window */
  const mok_pass_shape p = impl == mokImplMega && c.num_ranks == 1 ? mok_shape_mega(&c, num_tokens, 0)
                                                                   : mok_shape_spread(&c, impl, num_tokens, recv, worst);
  if (layer_bytes) *layer_bytes = mok_layer_fixed_bytes(&c) + mok_layout_saved(&c, &p, NULL);
  if (comm_scratch_bytes)
    *comm_scratch_bytes = mok_scratch_need(&c, &p) +
                          (impl == mokImplMega && c.num_ranks > 1 ? mok_layout_ep_window(&c, NULL) : 0);
  return mokSuccess;
}

/* ---- bf16 ---------------------------------------------------------------------- */
#include "bf16.h"
mokBf16 mokFloatToBf16(float f) { return mok_f32_to_bf16(f); }
float mokBf16ToFloat(mokBf16 b) { return mok_bf16_to_f32(b); }

/* ---- model presets (DESIGN.md section 6) -------------------------------------------- */
static const struct {
  const char *name;
  int e, h, i, k, is;
} g_models[] = {
    {"kimi-k2.7-code", 384, 7168, 2048, 8, 2048},
    {"glm-5.2", 256, 6144, 2048, 8, 2048},
    {"qwen3.5-397b-a17b", 512, 4096, 1024, 10, 1024},
    {"deepseek-v4-pro", 384, 7168, 3072, 6, 3072},
    {"deepseek-v3", 256, 7168, 2048, 8, 2048},
    {"qwen3-30b-a3b", 128, 2048, 768, 8, 0},
    {"gpt-oss-120b", 128, 2880, 2880, 4, 0},
    {"qwen3-235b-a22b", 128, 4096, 1536, 8, 0},
};
#define NUM_MODELS ((int)(sizeof g_models / sizeof g_models[0]))

mokResult_t mokModelName(int i, const char **name, int *count) {
  mok_clear_error();
  if (!name) return mok_error(NULL, mokInvalidArgument, "mokModelName: name is NULL");
  *name = (i >= 0 && i < NUM_MODELS) ? g_models[i].name : NULL;
  if (count) *count = NUM_MODELS;
  return mokSuccess;
}

mokResult_t mokConfigSetModel(mokConfig_t *config, const char *name) {
  mok_clear_error();
  if (!config) return mok_error(NULL, mokInvalidArgument, "mokConfigSetModel: config is NULL");
  if (!name) return mok_error(NULL, mokInvalidArgument, "mokConfigSetModel: name is NULL");
  for (int m = 0; m < NUM_MODELS; m++)
    if (!strcmp(name, g_models[m].name)) {
      config->num_experts = g_models[m].e;
      config->hidden = g_models[m].h;
      config->inter = g_models[m].i;
      config->topk = g_models[m].k;
      config->shared_inter = g_models[m].is;
      return mokSuccess;
    }
  char list[512] = "";
  for (int m = 0; m < NUM_MODELS; m++) {
    strncat(list, m ? ", " : "", sizeof list - strlen(list) - 1);
    strncat(list, g_models[m].name, sizeof list - strlen(list) - 1);
  }
  return mok_error(NULL, mokInvalidArgument, "mokConfigSetModel: unknown model '%s' (known: %s)", name, list);
}
