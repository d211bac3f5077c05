/*
 * gemm.cu — host launchers of the grouped expert GEMMs (declared in gemm.h) over the
 * Hopper tiles of src/gemm/grouped_gemm.cuh, plus fill / NaN-count helpers for tests
 * and benchmarks.
 *
 * Each launcher: validate (mokInvalidArgument, nothing launched) -> pick the tile shape
 * by the one rule (mok_gemm_tile_shape) -> build the TMA descriptors with
 * cuTensorMapEncodeTiled (reached through the runtime's driver entry point, so libcuda
 * is not linked) -> size a persistent grid from the SM count -> raise the dynamic shared
 * memory limit -> cudaLaunchKernelEx on the caller's stream -> check the launch.
 */
#include "gemm.h"

#include <cuda.h>         /* defines: CUtensorMap, CU_TENSOR_MAP_* */
#include <cudaTypedefs.h> /* defines: PFN_cuTensorMapEncodeTiled_v12000 */
#include <cuda_runtime.h>

#include "gemm/grouped_gemm.cuh" /* defines: mok_sm90::grouped_gemm_kernel, GemmTileArgs */
#include "internal.h"            /* defines: mok_error, CUDA_CHECK */
#include "kernels_load.h"

using namespace mok_sm90;

/* ---- the tile rule ----------------------------------------------------------------- */
/* The widest candidate (candidates widest first) whose padded width ceil(n / c) * c is
 * within 3% of the smallest padded width: wide tiles reuse each operand byte more, so a
 * little padding is worth it, a lot is not. */
static int pick_width(int n, const int *cands, int count) {
  int64_t best_pad = mok_round_up(n, cands[0]);
  for (int i = 1; i < count; ++i)
    if (mok_round_up(n, cands[i]) < best_pad) best_pad = mok_round_up(n, cands[i]);
  for (int i = 0; i < count; ++i)
    if (mok_round_up(n, cands[i]) * 100 <= best_pad * 103) return cands[i];
  return cands[count - 1];
}

template <int KIND>
static void plan_for(int bn, int *stages, int *smem) {
  if constexpr (KIND == kDownDgrad) {
    *stages = TileConfig<KIND, 128>::kStages, *smem = TileConfig<KIND, 128>::kSmemBytes;
  } else if constexpr (KIND == kGateUpFwd) {
    if (bn == 256) *stages = TileConfig<KIND, 256>::kStages, *smem = TileConfig<KIND, 256>::kSmemBytes;
    else *stages = TileConfig<KIND, 128>::kStages, *smem = TileConfig<KIND, 128>::kSmemBytes;
  } else {
    if (bn == 256) *stages = TileConfig<KIND, 256>::kStages, *smem = TileConfig<KIND, 256>::kSmemBytes;
    else if (bn == 192) *stages = TileConfig<KIND, 192>::kStages, *smem = TileConfig<KIND, 192>::kSmemBytes;
    else *stages = TileConfig<KIND, 128>::kStages, *smem = TileConfig<KIND, 128>::kSmemBytes;
  }
}

extern "C" mokResult_t mok_gemm_tile_shape(mokGemmKind_t kind, int hidden, int inter, mokGemmTileShape_t *shape) {
  if (!shape) return mok_error(NULL, mokInvalidArgument, "mok_gemm_tile_shape: shape is NULL");
  if (hidden < 64 || hidden % 64 || inter < 64 || inter % 64)
    return mok_error(NULL, mokInvalidArgument,
                     "mok_gemm_tile_shape: hidden (%d) and inter (%d) must be multiples of 64, >= 64", hidden,
                     inter);
  static const int full[3] = {256, 192, 128};
  static const int half[2] = {128, 64};
  int n;
  switch (kind) {
    case mokGemmGateUpFwd: n = inter; break;
    case mokGemmDownFwd: n = hidden; break;
    case mokGemmDownDgrad: n = inter; break;
    case mokGemmGateUpDgrad: n = hidden; break;
    case mokGemmWgradGateUp: n = hidden; break; /* [I, H] weights: N = H */
    case mokGemmWgradDown: n = inter; break;    /* [H, I] weights: N = I */
    default: return mok_error(NULL, mokInvalidArgument, "mok_gemm_tile_shape: unknown kind %d", (int)kind);
  }
  shape->bm = kBM;
  shape->bk = kBK;
  shape->token = 0;
  if ((kind == mokGemmGateUpFwd && inter % 128 == 0) || (kind == mokGemmDownFwd && hidden % 256 == 0)) {
    /* token tiles: 256 weight rows x up to 176 rows (see grouped_gemm.cuh) */
    shape->token = 1;
    shape->bm = 256;
    shape->bn = kTokMax;
    shape->out_cols = kind == mokGemmGateUpFwd ? 128 : 256;
    shape->stages = kind == mokGemmGateUpFwd ? TokConfig<kGateUpFwd>::kStages : TokConfig<kDownFwd>::kStages;
    shape->smem_bytes = kind == mokGemmGateUpFwd ? TokConfig<kGateUpFwd>::kSmemBytes : TokConfig<kDownFwd>::kSmemBytes;
    return mokSuccess;
  }
  if (kind == mokGemmGateUpFwd) { /* whole 64-column chunks of act, g and u */
    shape->out_cols = pick_width(n, half, 2);
    shape->bn = 2 * shape->out_cols;
  } else if (kind == mokGemmDownDgrad) { /* the tile's g and u are staged: 128 columns */
    shape->bn = shape->out_cols = 128;
  } else {
    shape->bn = pick_width(n, full, 3);
    shape->out_cols = shape->bn;
  }
  switch (kind) {
    case mokGemmGateUpFwd: plan_for<kGateUpFwd>(shape->bn, &shape->stages, &shape->smem_bytes); break;
    case mokGemmDownFwd: plan_for<kDownFwd>(shape->bn, &shape->stages, &shape->smem_bytes); break;
    case mokGemmDownDgrad: plan_for<kDownDgrad>(shape->bn, &shape->stages, &shape->smem_bytes); break;
    case mokGemmGateUpDgrad: plan_for<kGateUpDgrad>(shape->bn, &shape->stages, &shape->smem_bytes); break;
    default: plan_for<kWgradGateUp>(shape->bn, &shape->stages, &shape->smem_bytes); break;
  }
  return mokSuccess;
}

/* ---- validation -------------------------------------------------------------------- */
static mokResult_t check_rows(const char *fn, const mokGemmRows_t *rows, int hidden, int inter) {
  if (!rows) return mok_error(NULL, mokInvalidArgument, "%s: rows is NULL", fn);
  if (rows->num_experts < 1 || rows->num_experts > MOK_GEMM_MAX_EXPERTS)
    return mok_error(NULL, mokInvalidArgument, "%s: rows->num_experts = %d, must be in [1, %d]", fn,
                     rows->num_experts, MOK_GEMM_MAX_EXPERTS);
  if (rows->capacity < 64 || rows->capacity % 64 || rows->capacity >= ((int64_t)1 << 31))
    return mok_error(NULL, mokInvalidArgument,
                     "%s: rows->capacity = %lld, must be a multiple of 64 in [64, 2^31)", fn,
                     (long long)rows->capacity);
  if (!rows->expert_offset) return mok_error(NULL, mokInvalidArgument, "%s: rows->expert_offset is NULL", fn);
  if (rows->input_rows < 0 || rows->input_rows > rows->capacity)
    return mok_error(NULL, mokInvalidArgument, "%s: rows->input_rows = %lld, must be in [0, capacity %lld]", fn,
                     (long long)rows->input_rows, (long long)rows->capacity);
  if (hidden < 64 || hidden % 64)
    return mok_error(NULL, mokInvalidArgument, "%s: hidden = %d, must be a multiple of 64, >= 64", fn, hidden);
  if (inter < 64 || inter % 64)
    return mok_error(NULL, mokInvalidArgument, "%s: inter = %d, must be a multiple of 64, >= 64", fn, inter);
  if ((int64_t)rows->num_experts * (hidden > inter ? hidden : inter) >= ((int64_t)1 << 31))
    return mok_error(NULL, mokInvalidArgument, "%s: num_experts * max(hidden, inter) must be < 2^31", fn);
  return mokSuccess;
}

/* The rows of the inputs x and dy (rows->input_rows, else capacity). */
static uint64_t input_rows(const mokGemmRows_t *rows) {
  return (uint64_t)(rows->input_rows ? rows->input_rows : rows->capacity);
}

static mokResult_t check_ptr(const char *fn, const char *name, const void *p) {
  if (!p) return mok_error(NULL, mokInvalidArgument, "%s: %s is NULL", fn, name);
  if ((uintptr_t)p % 16)
    return mok_error(NULL, mokInvalidArgument, "%s: %s is not 16-byte aligned (TMA needs it)", fn, name);
  return mokSuccess;
}

static mokResult_t check_limit(const char *fn, float limit) {
  if (!(limit >= 0.0f) || limit > 3.0e38f)
    return mok_error(NULL, mokInvalidArgument, "%s: swiglu_limit = %g, must be >= 0 and finite", fn, (double)limit);
  return mokSuccess;
}

/* ---- TMA descriptors ----------------------------------------------------------------- */
static mokResult_t get_encode(PFN_cuTensorMapEncodeTiled_v12000 *out) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  if (!fn) {
    cudaGetLastError();
    return mok_error(NULL, mokNotSupported, "cuTensorMapEncodeTiled is not available from the CUDA driver");
  }
  *out = fn;
  return mokSuccess;
}

/* The L2 promotion of a map's loads, in bytes (0, 64, 128, else 256). */
static CUtensorMapL2promotion promotion(int bytes) {
  return bytes == 0     ? CU_TENSOR_MAP_L2_PROMOTION_NONE
         : bytes == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
         : bytes == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                        : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
}

/* 2-D tensor [outer, inner] row-major, bf16 or fp32; box = 128 bytes of inner x box_outer,
 * 128-byte swizzle, L2 promotion `promo` bytes; loads read out-of-bounds elements as zero,
 * stores skip them. */
static mokResult_t make_map_t(CUtensorMap *map, const void *ptr, int fp32, uint64_t inner, uint64_t outer,
                              uint32_t box_outer, const char *what, int promo = 256) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  MOK_CHECK(get_encode(&encode));
  const uint64_t es = fp32 ? 4 : 2;
  cuuint64_t dims[2] = {inner, outer};
  cuuint64_t strides[1] = {inner * es};
  cuuint32_t box[2] = {(cuuint32_t)(128 / es), box_outer};
  cuuint32_t estr[2] = {1, 1};
  CUresult r = encode(map, fp32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                      const_cast<void *>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, promotion(promo), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return mok_error(NULL, mokCudaError, "cuTensorMapEncodeTiled(%s: %llu x %llu, box %u) failed: CUresult %d",
                     what, (unsigned long long)outer, (unsigned long long)inner, box_outer, (int)r);
  return mokSuccess;
}
static mokResult_t make_map(CUtensorMap *map, const void *ptr, uint64_t inner, uint64_t outer, uint32_t box_outer,
                            const char *what, int promo = 256) {
  return make_map_t(map, ptr, 0, inner, outer, box_outer, what, promo);
}

/* Gate+up weights as one tensor over both: boxes = 1: 4-D, dims {K = hidden, 64 rows, 2
 * (W_gate, then W_up at its distance from W_gate), E * inter / 64 row groups}, box {64, 64,
 * 2, 2}: one load gives a token tile's stage [64 gate | 64 up | next 64 gate | 64 up] rows;
 * boxes = 2: 3-D, dims {K, rows, 2}, box {64, 64, 2}: [64 gate | 64 up] a load. Only where
 * W_up lies after W_gate at a multiple of 16 bytes (a stride is unsigned): then *used =
 * boxes, else 0 (the four 2-D boxes of tm_b0 / tm_b1). (W_up before W_gate would need the
 * consumers to swap the two halves: measured, session 11, that runtime offset in their
 * loop cost glm-5.2 R512 gate+up 2.5%, so such layouts take the four boxes.) */
static mokResult_t make_map_gu(CUtensorMap *map, const mokBf16 *w_gate, const mokBf16 *w_up, uint64_t hidden,
                               uint64_t rows, int boxes, int promo, int *used) {
  *used = 0;
  const uintptr_t g = (uintptr_t)w_gate, u = (uintptr_t)w_up, d = u - g;
  if (u <= g || d % 16 || rows % 64 || d >= (1ull << 40)) return mokSuccess;
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  MOK_CHECK(get_encode(&encode));
  const int rank = boxes == 1 ? 4 : 3;
  cuuint64_t dims[4] = {hidden, boxes == 1 ? 64 : rows, 2, rows / 64};
  cuuint64_t strides[3] = {hidden * 2, (cuuint64_t)d, 64 * hidden * 2};
  cuuint32_t box[4] = {64, 64, 2, 2};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<mokBf16 *>(w_gate), dims, strides,
                      box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion(promo),
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return mokSuccess; /* (the four-box path then) */
  *used = boxes;
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_tma_map(void *map, const void *ptr, uint64_t inner, uint64_t outer,
                                        uint32_t box_outer) {
  if (!map || !ptr || inner % 64 || !outer || !box_outer || box_outer > 256)
    return mok_error(NULL, mokInvalidArgument,
                     "mok_gemm_tma_map: map %p, ptr %p, inner %llu (a multiple of 64), outer %llu, box %u (1 .. 256)",
                     map, ptr, (unsigned long long)inner, (unsigned long long)outer, box_outer);
  return make_map(static_cast<CUtensorMap *>(map), ptr, inner, outer, box_outer, "mok_gemm_tma_map");
}

/* ---- run-time state of the standalone kernels ------------------------------------------
 * Tile-scheduler counters: a ring of slots, one per launch in turn, each zero between
 * launches (the kernel's last CTA zeroes its slot). Two launches share a slot only if
 * kSchedRing launches lie between them, and a launch fills every SM, so slots are never
 * used by two running kernels at once. The default error word of the launches (when the
 * caller names none) and the debug knobs for tests. */
constexpr int kSchedRing = 256;
__device__ int g_gemm_sched[kSchedRing][4];
__device__ unsigned long long g_gemm_error;
static unsigned g_sched_next;                              /* __atomic_* */
static unsigned long long g_timeout_ns = 10000000000ull;   /* 10 s */
static int g_stall_tile = -1;
static int g_epi_debug = 0;
static int g_sched_mode = 0; /* 0: the kernel's rule; 1: static; 2: run-time tickets */
static int g_split_tail = 1;
static int g_raster = 8; /* row tiles of an expert per raster group (grouped_gemm.cuh) */
static int g_tok_units = kTokMaxUnits; /* most 16-row units of a token tile */
static int g_mix = 0; /* token tiles under tickets: mix order (0 = mix_rule, 1 = on, 2 = off) */
static int g_pairs = 0; /* token tiles in 2-CTA clusters (0 = pair_rule, 1 = on, 2 = off, 3 = solo) */
static int g_gu_box = 0; /* gate+up token tiles' weights: 0 = gu_boxes_rule, 1 = one 4-D box, 2 = four boxes,
                            3 = two 3-D boxes (mok_gemm_debug_gu_box) */
static int g_stagger = 0; /* token tiles: expert 0's tiles half as large (0 = stagger_rule, 1 = on, 2 = off) */
static int g_row_box128 = 0; /* token tiles' rows in 128-row boxes: 0 = row_box_rule, 1 = on, 2 = off */
static int g_l2_promo[2] = {-1, -1}; /* forward token tiles' L2 promotion, bytes: weights, rows; -1 = 256 */
static int g_expert_order = 0; /* token tiles under tickets: 0 = rule, 1 most rows first, 2 index order */
static int g_cold_evict = 0;   /* one-tile experts' weights evict-first (split mix order): 0 = rule, 1 on, 2 off */
static int g_eager_rows = -1; /* token tiles freeing each stage after its MMAs: -1 = eager_rule, 0 = none,
                                 N: <= N rows */
static int g_tok_ring = 0; /* forward down token tiles alone: 0 = tok_ring_rule, 1 = 128-row stages with an
                             epilogue area (tiles of <= 128 rows), 2 = 176-row stages (mok_gemm_debug_tok_ring) */
static int g_ddown_tok = 0; /* experiment: down dgrad on token tiles: 0 = rule (off), 1 = on, 2 = off */
static int g_gu_rows = 0;   /* forward gate+up where token tiles run: 0 = the rules, 1 = row-grouped tiles
                               (diagnostics), 2 = token tiles, 128-row ones with the rows as N, 3 = token
                               tiles, 128-row ones with the rows as M (mok_gemm_debug_gu_rows) */
static int g_mix_ctas = 0; /* mix order: CTAs split by class (GemmTileArgs::mix_ctas): 0 = the rule, -1 = no split */
static int g_grid_ctas = 0; /* diagnostics: at most this many CTAs a launch (0 = one an SM; mok_gemm_debug_grid) */
static unsigned long long *g_trace = NULL; /* token-tile trace buffer (mok_gemm_debug_trace) */
static int g_trace_cap = 0;
static unsigned long long *g_sclk = NULL; /* stage-clock counters (mok_gemm_debug_stage_clock) */
static unsigned long long g_lean_launches = 0, g_diag_launches = 0; /* mok_gemm_debug_lean_launches */

/* Mix order for both forward kinds, in its split form (grouped_gemm.cuh: the first P CTAs
 * run the one-tile experts' tiles, the others the rest; P by mix_counts' rule). Zipf
 * 1.2 routing, 1x H200, split vs expert order (mix off), same run (docs/PERF.md, session
 * 8): gate+up qwen3.5 +4%, kimi +0..3%, glm +5%, deepseek-v4-pro +4%; down +5%, +5%, +1.5%,
 * +8%. The unsplit form (the one-tile experts' tiles spread evenly over the order) loses
 * gate+up 4-8% against expert order: its weight streams evict the rows a raster group
 * still rereads; split, those streams run on their own CTAs from the start. Also both
 * data-gradient kinds on their 128-row tiles (mix_counts' rule; session 20, Zipf 1.2
 * over balanced in one process, off / on: dgrad gate+up deepseek-v4-pro 0.753 / 0.818,
 * qwen3.5 0.909 / 0.948, kimi 0.923 / 0.965, glm 0.905-0.970 / 0.923; dgrad down 0.776 /
 * 0.821, 0.947 / 0.989, 0.915 / 0.949, 0.864 / 0.893). Weight gradients never mix. */
static int mix_rule(int kind) {
  const int knob = __atomic_load_n(&g_mix, __ATOMIC_RELAXED);
  return knob ? knob == 1
              : kind == mokGemmDownFwd || kind == mokGemmGateUpFwd || kind == mokGemmDownDgrad ||
                    kind == mokGemmGateUpDgrad;
}

/* A process-wide debug knob of modes 0 (the default) .. hi: refuses others, else stores it. */
static mokResult_t set_mode_knob(int *knob, int mode, int hi, const char *fn) {
  if (mode < 0 || mode > hi) return mok_error(NULL, mokInvalidArgument, "%s: mode %d", fn, mode);
  __atomic_store_n(knob, mode, __ATOMIC_RELAXED);
  return mokSuccess;
}

/* Token tiles in CTA pairs (grouped_gemm.cuh, TOK 2), where the output blocks come in
 * pairs (an even count): off unless asked for. Measured (docs/PERF.md, 1x H200, pairs vs
 * alone): down kimi R341 +3%, every other shape and kind -1..-6% (qwen3.5 R320 down -3%,
 * glm R512 down -3%, qwen3.5 R512 down -4%), Zipf 1.2 -1..-3% (kimi gate+up +1%). */
static int pair_rule(int n_tiles) {
  const int knob = __atomic_load_n(&g_pairs, __ATOMIC_RELAXED);
  return n_tiles % 2 == 0 && (knob == 1 || knob == 3);
}

extern "C" mokResult_t mok_gemm_debug_pairs(int mode) {
  return set_mode_knob(&g_pairs, mode, 3, "mok_gemm_debug_pairs");
}

/* Stagger (grouped_gemm.cuh tok_units_of) for both forward kinds; the kernel drops it
 * under tickets. Measured (docs/PERF.md, 1x H200, static schedule, on vs off): gate+up
 * +1.4% qwen3.5 R320, +1.7% R512, deepseek-v4-pro +1%, glm level; down kimi R341 +2%,
 * deepseek-v4-pro +1.5%, glm +0.6%, qwen3.5 level. */
static int stagger_rule(void) {
  const int knob = __atomic_load_n(&g_stagger, __ATOMIC_RELAXED);
  return knob ? knob == 1 : 1;
}

extern "C" mokResult_t mok_gemm_debug_stagger(int mode) {
  return set_mode_knob(&g_stagger, mode, 2, "mok_gemm_debug_stagger");
}

/* Token tiles load their rows in 128-row TMA boxes, then 32s and a 16, for gate+up (measured
 * on one H200 in two runs: qwen3.5 R512 +4%, glm R512 +5-6%, deepseek-v4-pro +8% (noisy),
 * level at 320 and 341 rows), 32-row boxes for down (level; docs/PERF.md). */
static int row_box_rule(int kind) {
  const int knob = __atomic_load_n(&g_row_box128, __ATOMIC_RELAXED);
  return knob ? knob == 1 : kind == mokGemmGateUpFwd;
}

extern "C" mokResult_t mok_gemm_debug_row_box128(int mode) {
  return set_mode_knob(&g_row_box128, mode, 2, "mok_gemm_debug_row_box128");
}

/* The forward token tiles' maps of the weights (which = 0) and of the rows (1) promote L2
 * fills to 256 bytes unless told otherwise. */
static int l2_promo_rule(int which) {
  const int knob = __atomic_load_n(&g_l2_promo[which], __ATOMIC_RELAXED);
  return knob >= 0 ? knob : 256;
}

extern "C" mokResult_t mok_gemm_debug_l2_promotion(int weights, int rows) {
  const int v[2] = {weights, rows};
  for (int i = 0; i < 2; ++i)
    if (v[i] != -1 && v[i] != 0 && v[i] != 64 && v[i] != 128 && v[i] != 256)
      return mok_error(NULL, mokInvalidArgument,
                       "mok_gemm_debug_l2_promotion: %s = %d, must be -1, 0, 64, 128 or 256", i ? "rows" : "weights",
                       v[i]);
  for (int i = 0; i < 2; ++i) __atomic_store_n(&g_l2_promo[i], v[i], __ATOMIC_RELAXED);
  return mokSuccess;
}

/* The split mix order's one-tile experts' weights loaded evict-first in L2, so their
 * streams do not push out the weight blocks the other tiles reread: gate+up only. Measured
 * (docs/PERF.md, session 11, 1x H200, Zipf 1.2): on vs off in one build, gate+up
 * deepseek-v4-pro +3..+4% (three runs), kimi, qwen3.5 and glm within +-2%; trees with and
 * without the code, deepseek-v4-pro +3.4%, balanced shapes level; down deepseek-v4-pro
 * -2.5% with it, so the down kernels have none (the code is compiled out of them). */
static int cold_evict_rule(bool gateup) {
  const int knob = __atomic_load_n(&g_cold_evict, __ATOMIC_RELAXED);
  return knob ? knob == 1 : gateup;
}

extern "C" mokResult_t mok_gemm_debug_cold_evict(int mode) {
  return set_mode_knob(&g_cold_evict, mode, 2, "mok_gemm_debug_cold_evict");
}

/* Token tiles under tickets walk the experts with most rows first (GemmTileArgs::
 * expert_order), not in index order: routing numbers experts arbitrarily, and the tile
 * order changes the speed. Measured (docs/PERF.md, session 19, 1x H200, Zipf 1.2 counts in
 * a shuffled order of experts, ours on Zipf rows over ours on balanced rows in one process,
 * two processes each, this order vs index order in one build): down qwen3.5 0.921 vs 0.890,
 * kimi 0.963 vs 0.950, glm 0.959 vs 0.954, deepseek-v4-pro 0.896 vs 0.894; gate+up 0.866
 * vs 0.870, 0.933 vs 0.939, 0.973 vs 0.956, 0.847 vs 0.848; balanced launches (static
 * schedule, no order) level against the tree without the code. Both kinds: a launch's speed
 * then depends on its counts, not on the experts' numbering. */
static int expert_order_rule(void) {
  const int knob = __atomic_load_n(&g_expert_order, __ATOMIC_RELAXED);
  return knob ? knob == 1 : 1;
}

extern "C" mokResult_t mok_gemm_debug_expert_order(int mode) {
  return set_mode_knob(&g_expert_order, mode, 2, "mok_gemm_debug_expert_order");
}

/* Token tiles of at most this many rows give each stage back once its own MMAs are done
 * (GemmTileArgs::eager_rows): their MMAs are short, their weight stream bound by the loads
 * in flight. Measured (docs/PERF.md, session 9, 1x H200, 96 vs never): tile traces of
 * qwen3.5 Zipf 1.2 gate+up, one-tile tiles of 48 rows 45.0 -> 40.5 us, 64 rows 45.0 ->
 * 43.9 us; deepseek-v4-pro Zipf down +1.8% (both runs); the other shapes within +-1%
 * (balanced ones have no tile that small). The branch is compiled only into tiles of <= 96
 * rows (kTokEagerMaxRows): a larger knob acts as 96. */
static int eager_rule(void) {
  const int knob = __atomic_load_n(&g_eager_rows, __ATOMIC_RELAXED);
  return knob >= 0 ? knob : 96;
}

extern "C" mokResult_t mok_gemm_debug_eager_rows(int rows) {
  if (rows < -1)
    return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_eager_rows: rows = %d, must be >= -1", rows);
  __atomic_store_n(&g_eager_rows, rows, __ATOMIC_RELAXED);
  return mokSuccess;
}

/* Gate+up token tiles load a stage's weights as one 4-D box where W_up lies after W_gate
 * (make_map_gu), else as four 64-row boxes. Measured (docs/PERF.md, session 10, 1x H200,
 * one build, two device runs, ratio to cuBLAS): Zipf 1.2 kimi +3..+4%, glm +2.4%,
 * deepseek-v4-pro +2%, qwen3.5 +0.5%; balanced deepseek-v4-pro +2.5%, qwen3.5 R512 +0.8%,
 * R320 +0.5%, kimi and glm level. (A DRAM stream is faster in fewer, larger TMA boxes: the
 * down weights as 2 x 128 rows instead of one 256-row box lost 5-8%.) */
static int gu_boxes_rule(void) { /* boxes a stage */
  static const int boxes[4] = {kLeanGuBoxes, 1, 4, 2};
  return boxes[__atomic_load_n(&g_gu_box, __ATOMIC_RELAXED)];
}

extern "C" mokResult_t mok_gemm_debug_gu_box(int mode) {
  return set_mode_knob(&g_gu_box, mode, 3, "mok_gemm_debug_gu_box");
}

/* The down GEMM's stage ring (TokConfig): 128-row stages with an epilogue area of their
 * own where the host knows the counts and every expert's token tiles are at most 128 rows
 * anyway (so no tile is cut smaller), else the 176-row stages. Measured (docs/PERF.md,
 * session 14, 1x H200, two runs, 176 -> 128): qwen3.5 R512 down 644 / 643 -> 657 / 657
 * TFLOP/s (0.893 -> 0.913 of cuBLAS), glm-5.2 R512 727 -> 738, deepseek-v4-pro R256 level;
 * where it would cut tiles smaller it loses (kimi R341 -6%, qwen3.5 R320 -22%). */
static int tok_ring_rule(const mokGemmRows_t *rows) {
  const int knob = __atomic_load_n(&g_tok_ring, __ATOMIC_RELAXED);
  if (knob) return knob == 1;
  return rows->expert_count_host && tok_tiles_fit_ring128(rows->expert_count_host, rows->num_experts);
}

extern "C" mokResult_t mok_gemm_debug_tok_ring(int mode) {
  return set_mode_knob(&g_tok_ring, mode, 2, "mok_gemm_debug_tok_ring");
}

extern "C" mokResult_t mok_gemm_debug_ddown_tok(int mode) {
  return set_mode_knob(&g_ddown_tok, mode, 2, "mok_gemm_debug_ddown_tok");
}

extern "C" mokResult_t mok_gemm_debug_gu_rows(int mode) {
  return set_mode_knob(&g_gu_rows, mode, 3, "mok_gemm_debug_gu_rows");
}

/* Gate+up token tiles of exactly 128 rows with the rows as wgmma M (tok_consume_rows_m):
 * on. One H100, three processes each in turns against the rows as N (docs/PERF.md, session
 * 41): ours / cuBLAS deepseek-v4-pro R256 (2 x 128 rows) 0.988-0.993 against 0.972-0.974,
 * qwen3.5 R512 0.928-0.929 against 0.917-0.918, glm-5.2 R512 +0.7 points, kimi R512 and
 * deepseek-v4-pro R512 level; shapes without 128-row tiles (qwen3.5 R320) and Zipf level,
 * against the parent tree's binary too (the code costs the other tiles nothing). */
static int rows_m_rule(void) {
  const int knob = __atomic_load_n(&g_gu_rows, __ATOMIC_RELAXED);
  if (knob >= 2) return knob == 3;
  return 1;
}

/* The down GEMM's token tiles of exactly 128 rows with the rows as wgmma M too (each
 * warpgroup 64 rows x all 256 weight rows), in the 128-row ring's kernel instance (the one
 * the ring rule picks where every expert's tiles are <= 128 rows: R512, R256): on. One H100
 * (docs/PERF.md, session 42), ours / cuBLAS against the rows as N in turns: qwen3.5 R512
 * 0.932 -> 0.955, glm-5.2 R512 0.986 -> 0.995, deepseek-v4-pro R256 1.018 -> 1.032, R512
 * 0.97 -> 0.99, kimi R512 0.970 -> 0.978. Compiled into the 176-row ring's instance too it
 * slowed qwen3.5 R320 (2 x 160-row tiles) by 2%, so that instance does not have it. */
static int g_dn_rows = 0; /* 0 the rule (on), 1 the rows as N, 2 the rows as M */
extern "C" mokResult_t mok_gemm_debug_dn_rows(int mode) {
  return set_mode_knob(&g_dn_rows, mode, 2, "mok_gemm_debug_dn_rows");
}

static int dn_rows_m_rule(void) { return __atomic_load_n(&g_dn_rows, __ATOMIC_RELAXED) != 1; }

extern "C" mokResult_t mok_gemm_debug_mix_ctas(int ctas) {
  if (ctas < -1) return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_mix_ctas: ctas = %d, must be >= -1", ctas);
  __atomic_store_n(&g_mix_ctas, ctas, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_grid(int ctas) {
  if (ctas < 0) return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_grid: ctas = %d, must be >= 0", ctas);
  __atomic_store_n(&g_grid_ctas, ctas, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_stage_clock(unsigned long long *buf) {
  __atomic_store_n(&g_sclk, buf, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_trace(unsigned long long *buf, int cap) {
  if (buf && cap < 1) return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_trace: cap = %d, must be >= 1", cap);
  __atomic_store_n(&g_trace, buf, __ATOMIC_RELAXED);
  __atomic_store_n(&g_trace_cap, buf ? cap : 0, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_lean_launches(unsigned long long *lean, unsigned long long *diag) {
  if (!lean || !diag) return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_lean_launches: NULL argument");
  *lean = __atomic_load_n(&g_lean_launches, __ATOMIC_RELAXED);
  *diag = __atomic_load_n(&g_diag_launches, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_set(unsigned long long timeout_ns, int stall_tile) {
  __atomic_store_n(&g_timeout_ns, timeout_ns ? timeout_ns : 10000000000ull, __ATOMIC_RELAXED);
  __atomic_store_n(&g_stall_tile, stall_tile, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_epilogue(int mode) {
  return set_mode_knob(&g_epi_debug, mode, 2, "mok_gemm_debug_epilogue");
}

extern "C" mokResult_t mok_gemm_debug_sched(int mode, int split_tail) {
  if (mode < 0 || mode > 2) return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_sched: mode %d", mode);
  __atomic_store_n(&g_sched_mode, mode, __ATOMIC_RELAXED);
  __atomic_store_n(&g_split_tail, split_tail != 0, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_tiles(int raster, int tok_units, int mix) {
  if (mix < 0 || mix > 2) return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_tiles: mix = %d", mix);
  if (raster < 0 || raster > (1 << 20))
    return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_tiles: raster = %d, must be in [0, 2^20]", raster);
  if (tok_units < 0 || tok_units > kTokMaxUnits)
    return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_tiles: tok_units = %d, must be in [0, %d]", tok_units,
                     kTokMaxUnits);
  __atomic_store_n(&g_raster, raster ? raster : 8, __ATOMIC_RELAXED);
  __atomic_store_n(&g_tok_units, tok_units ? tok_units : kTokMaxUnits, __ATOMIC_RELAXED);
  __atomic_store_n(&g_mix, mix, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_error_word(unsigned long long *word, int clear) {
  if (!word) return mok_error(NULL, mokInvalidArgument, "mok_gemm_error_word: word is NULL");
  CUDA_CHECK(NULL, cudaMemcpyFromSymbol(word, g_gemm_error, sizeof *word));
  if (clear && *word) {
    const unsigned long long zero = 0;
    CUDA_CHECK(NULL, cudaMemcpyToSymbol(g_gemm_error, &zero, sizeof zero));
  }
  return mokSuccess;
}

/* ---- launch -------------------------------------------------------------------------- */
template <int KIND, int BN, int TOK>
static int smem_plan() {
  if constexpr (TOK != 0) return TokConfig<KIND, BN == 128 ? kTokRing128 : kTokMaxUnits>::kSmemBytes;
  else return TileConfig<KIND, BN>::kSmemBytes;
}

/* The arguments every launch takes from the knobs and rules (kind, tok: the launch's). */
static void finish_args(GemmTileArgs &args, const mokGemmRows_t *rows, int kind, int tok) {
  args.epi_debug = __atomic_load_n(&g_epi_debug, __ATOMIC_RELAXED);
  args.mix_ctas = __atomic_load_n(&g_mix_ctas, __ATOMIC_RELAXED);
  args.eager_rows = eager_rule();
  args.cold_evict = cold_evict_rule(kind == kGateUpFwd);
  args.trace = tok ? __atomic_load_n(&g_trace, __ATOMIC_RELAXED) : NULL;
  args.sclk = tok ? __atomic_load_n(&g_sclk, __ATOMIC_RELAXED) : NULL;
  args.rank = rows->rank;
  args.timeout_ns = __atomic_load_n(&g_timeout_ns, __ATOMIC_RELAXED);
  args.stall_tile = __atomic_load_n(&g_stall_tile, __ATOMIC_RELAXED);
  args.sched_mode = __atomic_load_n(&g_sched_mode, __ATOMIC_RELAXED);
  args.expert_order = tok == 1 && expert_order_rule();
  args.split_tail = __atomic_load_n(&g_split_tail, __ATOMIC_RELAXED);
  args.pair_solo = __atomic_load_n(&g_pairs, __ATOMIC_RELAXED) == 3;
  args.trace_cap = __atomic_load_n(&g_trace_cap, __ATOMIC_RELAXED);
}

/* A launch's scheduler slot (the ring above) and its error word (the caller's, or the
 * module's). */
static mokResult_t take_sched_slot(GemmTileArgs &args, const mokGemmRows_t *rows) {
  void *sched = nullptr, *err = nullptr;
  CUDA_CHECK(NULL, cudaGetSymbolAddress(&sched, g_gemm_sched));
  args.sched = static_cast<int *>(sched) + 4 * (__atomic_fetch_add(&g_sched_next, 1u, __ATOMIC_RELAXED) % kSchedRing);
  if (rows->error_word) {
    args.error_word = rows->error_word;
  } else {
    CUDA_CHECK(NULL, cudaGetSymbolAddress(&err, g_gemm_error));
    args.error_word = static_cast<unsigned long long *>(err);
  }
  return mokSuccess;
}

/* Whether a launch of the forward token tiles alone can take the lean kernel instance
 * (grouped_gemm.cuh: TokKnobs): no diagnostic on and every knob the lean instance compiles in
 * at its rule's value. */
template <int KIND>
static bool tok_lean(const GemmTileArgs &a) {
  return !a.trace && !a.sclk && !a.epi_debug && a.row_box128 == (KIND == kGateUpFwd) &&
         (KIND != kGateUpFwd || a.gu_boxes == kLeanGuBoxes);
}

template <int KIND, int BN, int TOK = 0>
static mokResult_t launch(GemmTileArgs args, const mokGemmRows_t *rows, int64_t max_tiles, cudaStream_t stream) {
  int dev = 0, sms = 0, major = 0, optin = 0;
  CUDA_CHECK(NULL, cudaGetDevice(&dev));
  CUDA_CHECK(NULL, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9)
    return mok_error(NULL, mokNotSupported, "grouped GEMM: needs a Hopper GPU (sm_90a), device %d is sm_%d", dev,
                     major * 10);
  CUDA_CHECK(NULL, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(NULL, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const int smem = smem_plan<KIND, BN, TOK>();
  if (smem > optin)
    return mok_error(NULL, mokNotSupported, "grouped GEMM: needs %d bytes of shared memory per block, device has %d",
                     smem, optin);
  void (*kernel)(GemmTileArgs) = grouped_gemm_kernel<KIND, BN, TOK>;
  finish_args(args, rows, KIND, TOK);
  bool lean = false;
  if constexpr (TOK == 1 && KIND != kDownDgrad) {
    lean = tok_lean<KIND>(args);
    if (lean) kernel = grouped_gemm_kernel<KIND, BN, TOK, false>;
  }
  CUDA_CHECK(NULL, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int64_t grid = max_tiles < sms ? max_tiles : sms;
  const int grid_cap = __atomic_load_n(&g_grid_ctas, __ATOMIC_RELAXED); /* diagnostics: fewer CTAs */
  if (grid_cap > 0 && grid > grid_cap) grid = grid_cap;
  if (grid < 1) grid = 1;
  cudaLaunchAttribute attr[1];
  if (TOK == 2) { /* clusters of two CTAs: an even grid, at most the clusters that fit at once */
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t q = {};
    q.gridDim = dim3((unsigned)(sms & ~1));
    q.blockDim = dim3(kThreads);
    q.dynamicSmemBytes = (size_t)smem;
    q.attrs = attr;
    q.numAttrs = 1;
    int clusters = 0;
    CUDA_CHECK(NULL, cudaOccupancyMaxActiveClusters(&clusters, kernel, &q));
    if (clusters < 1)
      return mok_error(NULL, mokNotSupported, "grouped GEMM: no 2-CTA cluster of %d bytes of shared memory fits", smem);
    grid = 2 * ((grid + 1) / 2);
    if (grid > 2 * (int64_t)clusters) grid = 2 * (int64_t)clusters;
  }
  MOK_CHECK(take_sched_slot(args, rows));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = stream;
  if (TOK == 2) {
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  CUDA_CHECK(NULL, cudaLaunchKernelEx(&cfg, kernel, args));
  CUDA_CHECK(NULL, cudaGetLastError());
  if (TOK == 1 && KIND != kDownDgrad)
    __atomic_fetch_add(lean ? &g_lean_launches : &g_diag_launches, 1ull, __ATOMIC_RELAXED);
  return mokSuccess;
}

template <int KIND>
static mokResult_t launch_bn(int bn, const GemmTileArgs &args, const mokGemmRows_t *rows, int64_t max_tiles,
                             cudaStream_t stream) {
  if constexpr (KIND == kDownDgrad) {
    return launch<KIND, 128>(args, rows, max_tiles, stream);
  } else if constexpr (KIND == kGateUpFwd) {
    return bn == 256 ? launch<KIND, 256>(args, rows, max_tiles, stream)
                     : launch<KIND, 128>(args, rows, max_tiles, stream);
  } else {
    switch (bn) {
      case 256: return launch<KIND, 256>(args, rows, max_tiles, stream);
      case 192: return launch<KIND, 192>(args, rows, max_tiles, stream);
      default: return launch<KIND, 128>(args, rows, max_tiles, stream);
    }
  }
}

static GemmTileArgs base_args(const mokGemmRows_t *rows) {
  GemmTileArgs a;
  memset(&a, 0, sizeof a);
  a.expert_offset = rows->expert_offset;
  a.expert_count = rows->expert_count;
  a.skip = rows->skip;
  a.num_experts = rows->num_experts;
  a.raster = __atomic_load_n(&g_raster, __ATOMIC_RELAXED);
  a.tok_units = __atomic_load_n(&g_tok_units, __ATOMIC_RELAXED);
  return a;
}

/* Upper bound on row-grouped tiles: every tile holds >= 64 rows of one segment. */
static int64_t row_tiles_bound(const mokGemmRows_t *rows, int n, int out_cols) {
  return rows->capacity / 64 * ((n + out_cols - 1) / out_cols);
}

static mokResult_t gateup_fwd_launch(const GemmTileArgs &a, const mokGemmTileShape_t &ts, const mokGemmRows_t *rows,
                                     int inter, cudaStream_t stream) {
  if (ts.token && pair_rule(inter / 128))
    return launch<kGateUpFwd, 256, 2>(a, rows, row_tiles_bound(rows, inter, ts.out_cols), stream);
  if (ts.token) return launch<kGateUpFwd, 256, 1>(a, rows, row_tiles_bound(rows, inter, ts.out_cols), stream);
  return launch_bn<kGateUpFwd>(ts.bn, a, rows, row_tiles_bound(rows, inter, ts.out_cols), stream);
}

static mokResult_t down_fwd_launch(GemmTileArgs a, const mokGemmTileShape_t &ts, int pairs, const mokGemmRows_t *rows,
                                   int hidden, cudaStream_t stream) {
  if (pairs) return launch<kDownFwd, 256, 2>(a, rows, row_tiles_bound(rows, hidden, ts.out_cols), stream);
  if (ts.token && tok_ring_rule(rows)) { /* 128-row stages, an epilogue area of their own */
    a.tok_units = a.tok_units < kTokRing128 ? a.tok_units : kTokRing128;
    return launch<kDownFwd, 128, 1>(a, rows, row_tiles_bound(rows, hidden, ts.out_cols), stream);
  }
  if (ts.token) return launch<kDownFwd, 256, 1>(a, rows, row_tiles_bound(rows, hidden, ts.out_cols), stream);
  return launch_bn<kDownFwd>(ts.bn, a, rows, row_tiles_bound(rows, hidden, ts.out_cols), stream);
}

/* The forward gate+up launch's arguments (checked), its tile shape in ts. */
static mokResult_t gateup_fwd_args(const char *fn, const mokGemmRows_t *rows, int hidden, int inter,
                                   float swiglu_limit, const mokBf16 *x, const mokBf16 *w_gate, const mokBf16 *w_up,
                                   mokBf16 *act, mokBf16 *gu, GemmTileArgs &a, mokGemmTileShape_t &ts) {
  MOK_CHECK(check_rows(fn, rows, hidden, inter));
  MOK_CHECK(check_limit(fn, swiglu_limit));
  MOK_CHECK(check_ptr(fn, "x", x));
  MOK_CHECK(check_ptr(fn, "w_gate", w_gate));
  MOK_CHECK(check_ptr(fn, "w_up", w_up));
  MOK_CHECK(check_ptr(fn, "act", act));
  if (gu) MOK_CHECK(check_ptr(fn, "gu", gu));
  MOK_CHECK(mok_gemm_tile_shape(mokGemmGateUpFwd, hidden, inter, &ts));
  if (ts.token && __atomic_load_n(&g_gu_rows, __ATOMIC_RELAXED) == 1) { /* the shape of I % 128 != 0 */
    static const int half[2] = {128, 64};
    ts.token = 0;
    ts.bm = kBM;
    ts.out_cols = pick_width(inter, half, 2);
    ts.bn = 2 * ts.out_cols;
    plan_for<kGateUpFwd>(ts.bn, &ts.stages, &ts.smem_bytes);
  }
  a = base_args(rows);
  const uint64_t E = (uint64_t)rows->num_experts;
  const uint32_t out_box = ts.token ? 32 : 64; /* token tiles: 32-row boxes (and 16 below) */
  const uint64_t xr = input_rows(rows);
  MOK_CHECK(make_map(&a.tm_a, x, hidden, xr, kBM, "x"));
  MOK_CHECK(make_map(&a.tm_a64, x, hidden, xr, 64, "x"));
  const int pw = ts.token ? l2_promo_rule(0) : 256, pr = ts.token ? l2_promo_rule(1) : 256;
  MOK_CHECK(make_map(&a.tm_tok, x, hidden, xr, 32, "x", pr));
  MOK_CHECK(make_map(&a.tm_tok16, x, hidden, xr, 16, "x", pr));
  a.row_box128 = row_box_rule(mokGemmGateUpFwd);
  if (a.row_box128) MOK_CHECK(make_map(&a.tm_tok128, x, hidden, xr, 128, "x", pr));
  MOK_CHECK(make_map(&a.tm_b0, w_gate, hidden, E * inter, 64, "w_gate", pw)); /* 64-row boxes, interleaved */
  MOK_CHECK(make_map(&a.tm_b1, w_up, hidden, E * inter, 64, "w_up", pw));
  const int gu_boxes = gu_boxes_rule();
  if (ts.token && gu_boxes < 4)
    MOK_CHECK(make_map_gu(&a.tm_aux, w_gate, w_up, hidden, E * inter, gu_boxes, pw, &a.gu_boxes));
  a.n_out = inter;
  a.k_len = hidden;
  a.b_rows = inter;
  MOK_CHECK(make_map(&a.tm_out0, act, inter, rows->capacity, out_box, "act"));
  if (gu) MOK_CHECK(make_map(&a.tm_out1, gu, 2 * (uint64_t)inter, rows->capacity, out_box, "gu"));
  else a.tm_out1 = a.tm_out0;
  if (ts.token) {
    MOK_CHECK(make_map(&a.tm_out0h, act, inter, rows->capacity, 16, "act"));
    if (gu) MOK_CHECK(make_map(&a.tm_out1h, gu, 2 * (uint64_t)inter, rows->capacity, 16, "gu"));
    else a.tm_out1h = a.tm_out0h;
  }
  if (!a.gu_boxes) a.tm_aux = a.tm_out0; /* (else the 4-D or 3-D weight map) */
  a.save_gu = gu != NULL;
  a.limit = swiglu_limit;
  a.rows_m = ts.token ? rows_m_rule() : 0;
  a.mix = mix_rule(mokGemmGateUpFwd);
  a.stagger = stagger_rule();
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_gateup_fwd(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                           const mokBf16 *x, const mokBf16 *w_gate, const mokBf16 *w_up,
                                           mokBf16 *act, mokBf16 *gu, cudaStream_t stream) {
  GemmTileArgs a;
  mokGemmTileShape_t ts;
  MOK_CHECK(gateup_fwd_args("mok_gemm_gateup_fwd", rows, hidden, inter, swiglu_limit, x, w_gate, w_up, act, gu, a, ts));
  return gateup_fwd_launch(a, ts, rows, inter, stream);
}

/* The forward down launch's arguments (checked), its tile shape in ts; pairs: whether it
 * runs in CTA pairs (then tm_b1 holds a CTA's half of the weight block). */
static mokResult_t down_fwd_args(const char *fn, const mokGemmRows_t *rows, int hidden, int inter,
                                 const mokBf16 *act, const mokBf16 *w_down, mokBf16 *y, GemmTileArgs &a,
                                 mokGemmTileShape_t &ts, int &pairs) {
  MOK_CHECK(check_rows(fn, rows, hidden, inter));
  MOK_CHECK(check_ptr(fn, "act", act));
  MOK_CHECK(check_ptr(fn, "w_down", w_down));
  MOK_CHECK(check_ptr(fn, "y", y));
  MOK_CHECK(mok_gemm_tile_shape(mokGemmDownFwd, hidden, inter, &ts));
  a = base_args(rows);
  const uint64_t E = (uint64_t)rows->num_experts;
  MOK_CHECK(make_map(&a.tm_a, act, inter, rows->capacity, kBM, "act"));
  MOK_CHECK(make_map(&a.tm_a64, act, inter, rows->capacity, 64, "act"));
  const int pw = ts.token ? l2_promo_rule(0) : 256, pr = ts.token ? l2_promo_rule(1) : 256;
  MOK_CHECK(make_map(&a.tm_tok, act, inter, rows->capacity, 32, "act", pr));
  MOK_CHECK(make_map(&a.tm_tok16, act, inter, rows->capacity, 16, "act", pr));
  a.row_box128 = row_box_rule(mokGemmDownFwd);
  if (a.row_box128) MOK_CHECK(make_map(&a.tm_tok128, act, inter, rows->capacity, 128, "act", pr));
  MOK_CHECK(make_map(&a.tm_b0, w_down, inter, E * hidden, ts.token ? 256 : ts.bn, "w_down", pw));
  a.tm_b1 = a.tm_b0;
  pairs = ts.token && pair_rule(hidden / 256);
  if (pairs) MOK_CHECK(make_map(&a.tm_b1, w_down, inter, E * hidden, 128, "w_down", pw)); /* a CTA's half */
  a.n_out = hidden;
  a.k_len = inter;
  a.b_rows = hidden;
  MOK_CHECK(make_map(&a.tm_out0, y, hidden, rows->capacity, ts.token ? 32 : 64, "y"));
  if (ts.token) MOK_CHECK(make_map(&a.tm_out0h, y, hidden, rows->capacity, 16, "y"));
  a.tm_out1h = a.tm_out0h;
  a.tm_out1 = a.tm_aux = a.tm_out0;
  a.mix = mix_rule(mokGemmDownFwd);
  a.stagger = stagger_rule();
  a.rows_m = ts.token ? dn_rows_m_rule() : 0;
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_down_fwd(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *act,
                                         const mokBf16 *w_down, mokBf16 *y, cudaStream_t stream) {
  GemmTileArgs a;
  mokGemmTileShape_t ts;
  int pairs = 0;
  MOK_CHECK(down_fwd_args("mok_gemm_down_fwd", rows, hidden, inter, act, w_down, y, a, ts, pairs));
  return down_fwd_launch(a, ts, pairs, rows, hidden, stream);
}

/* ---- the routed experts' forward in one launch (gemm/ffn_fwd.cuh, gemm_ffn.cu) ---------
 * Where both kinds run lean token tiles alone (not in pairs), on the down launch's ring.
 * The rule (knob 0): fused where the down launch takes the 176-row ring (some tile of more
 * than 128 rows, or counts not on the host), else the two launches. Measured (docs/PERF.md,
 * session 25, 1x H200, fused over the two launches in turn, one process each): 176-row
 * ring qwen3.5 R320 +1.3..+1.7%, kimi R341 +2.5%, Zipf 1.2 +1.6..+2.6% on all five shapes;
 * the 128-row ring glm R512 -1.4%, deepseek-v4-pro R256 level (two runs: 0 / +0.2%).
 * 1: fused wherever it can run; 2: the two launches. */
static int g_ffn = 0;
/* gemm_ffn.cu: the fused launch of these two launches' arguments (finished, error word set) */
mokResult_t mok_gemm_ffn_launch(const GemmTileArgs &gu, const GemmTileArgs &dn, int ring128, int64_t max_tiles,
                                cudaStream_t stream);
static int ffn_rule(const mokGemmRows_t *rows) {
  const int knob = __atomic_load_n(&g_ffn, __ATOMIC_RELAXED);
  return knob ? knob == 1 : !tok_ring_rule(rows);
}
static unsigned long long g_ffn_launches = 0; /* fused launches made (mok_gemm_debug_ffn_launches) */

extern "C" mokResult_t mok_gemm_debug_ffn_launches(unsigned long long *n) {
  if (!n) return mok_error(NULL, mokInvalidArgument, "mok_gemm_debug_ffn_launches: n is NULL");
  *n = __atomic_load_n(&g_ffn_launches, __ATOMIC_RELAXED);
  return mokSuccess;
}

extern "C" mokResult_t mok_gemm_debug_ffn(int mode) { return set_mode_knob(&g_ffn, mode, 2, "mok_gemm_debug_ffn"); }

extern "C" mokResult_t mok_gemm_ffn_fwd(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                        const mokBf16 *x, const mokBf16 *w_gate, const mokBf16 *w_up,
                                        const mokBf16 *w_down, mokBf16 *act, mokBf16 *gu, mokBf16 *y,
                                        cudaStream_t stream) {
  static const char fn[] = "mok_gemm_ffn_fwd";
  GemmTileArgs ga, da;
  mokGemmTileShape_t tg, td;
  int pairs = 0;
  MOK_CHECK(check_ptr(fn, "w_down", w_down)); /* (down's own before gate+up's maps: nothing built on a refusal) */
  MOK_CHECK(check_ptr(fn, "y", y));
  MOK_CHECK(gateup_fwd_args(fn, rows, hidden, inter, swiglu_limit, x, w_gate, w_up, act, gu, ga, tg));
  MOK_CHECK(down_fwd_args(fn, rows, hidden, inter, act, w_down, y, da, td, pairs));
  finish_args(ga, rows, kGateUpFwd, 1);
  finish_args(da, rows, kDownFwd, 1);
  const bool fused = ffn_rule(rows) && tg.token && td.token && !pairs && !pair_rule(inter / 128) &&
                     tok_lean<kGateUpFwd>(ga) && tok_lean<kDownFwd>(da);
  if (!fused) {
    MOK_CHECK(gateup_fwd_launch(ga, tg, rows, inter, stream));
    return down_fwd_launch(da, td, pairs, rows, hidden, stream);
  }
  MOK_CHECK(take_sched_slot(ga, rows)); /* (for the error word: the fused kernel counts tickets apart) */
  da.sched = ga.sched;
  da.error_word = ga.error_word;
  const int ring128 = tok_ring_rule(rows); /* both kinds on the down launch's ring */
  if (ring128) {
    ga.tok_units = ga.tok_units < kTokRing128 ? ga.tok_units : kTokRing128;
    da.tok_units = ga.tok_units;
  }
  const int64_t tiles = row_tiles_bound(rows, inter, tg.out_cols) + row_tiles_bound(rows, hidden, td.out_cols);
  MOK_CHECK(mok_gemm_ffn_launch(ga, da, ring128, tiles, stream));
  __atomic_fetch_add(&g_ffn_launches, 1ull, __ATOMIC_RELAXED);
  return mokSuccess;
}

/* gemm_ffn.cu: the megakernel's launch of these arguments (finished, error word set) */
mokResult_t mok_gemm_ffn_mega_launch(const GemmTileArgs &gu, const GemmTileArgs &dn, const GemmTileArgs *sgu,
                                     const GemmTileArgs *sdn, const mokFfnMega_t *mega,
                                     mokBf16 *xg, const mokBf16 *y, int hidden, cudaStream_t stream);

extern "C" mokResult_t mok_gemm_ffn_mega(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                         mokBf16 *xg, const mokBf16 *w_gate, const mokBf16 *w_up,
                                         const mokBf16 *w_down, mokBf16 *act, mokBf16 *gu, mokBf16 *y,
                                         const mokFfnMega_t *mega, cudaStream_t stream) {
  static const char fn[] = "mok_gemm_ffn_mega";
  if (!mega) return mok_error(NULL, mokInvalidArgument, "%s: mega is NULL", fn);
  if (mega->comm_ctas < 1)
    return mok_error(NULL, mokInvalidArgument, "%s: comm_ctas %d (need >= 1)", fn, mega->comm_ctas);
  if (mega->row_route) {
    MOK_CHECK(check_ptr(fn, "row_route", mega->row_route));
    MOK_CHECK(check_ptr(fn, "x_src", mega->x_src));
    if (mega->num_src < 1 || mega->num_src > MOK_GEMM_MAX_SOURCES || mega->topk < 1 || mega->t_max < 1 ||
        (int64_t)mega->num_src * mega->t_max * mega->topk > INT32_MAX)
      return mok_error(NULL, mokInvalidArgument, "%s: num_src %d, t_max %d, topk %d: need 1 .. %d sources, t_max and "
                       "topk >= 1 and route ids below 2^31", fn, mega->num_src, mega->t_max, mega->topk,
                       MOK_GEMM_MAX_SOURCES);
  } else {
    MOK_CHECK(check_ptr(fn, "row_tok", mega->row_tok));
  }
  if (mega->ctas < 0) return mok_error(NULL, mokInvalidArgument, "%s: ctas %d is negative", fn, mega->ctas);
  MOK_CHECK(check_ptr(fn, "bad", mega->bad));
  if (mega->push && !mega->row_route)
    return mok_error(NULL, mokInvalidArgument, "%s: push needs row_route (expert parallel)", fn);
  if (mega->push && mega->out)
    return mok_error(NULL, mokInvalidArgument, "%s: push and the combine in the launch exclude each other", fn);
  if (mega->out && mega->tokens > 0) { /* the combine in the launch: one GPU only */
    if (mega->row_route)
      return mok_error(NULL, mokNotSupported, "%s: the combine in the launch is for one GPU (row_tok), not row_route",
                       fn);
    MOK_CHECK(check_ptr(fn, "out", mega->out));
    MOK_CHECK(check_ptr(fn, "route_row", mega->route_row));
    MOK_CHECK(check_ptr(fn, "topk_w", mega->topk_w));
    if (mega->base) MOK_CHECK(check_ptr(fn, "base", mega->base));
    if (mega->topk < 1 || mega->topk > 32)
      return mok_error(NULL, mokInvalidArgument, "%s: topk %d (the combine needs 1 .. 32)", fn, mega->topk);
  }
  if (mega->x) MOK_CHECK(check_ptr(fn, "mega->x", mega->x)); /* (NULL: no tokens, every row padding) */
  GemmTileArgs ga, da;
  mokGemmTileShape_t tg, td;
  int pairs = 0;
  MOK_CHECK(check_ptr(fn, "w_down", w_down));
  MOK_CHECK(check_ptr(fn, "y", y));
  MOK_CHECK(gateup_fwd_args(fn, rows, hidden, inter, swiglu_limit, xg, w_gate, w_up, act, gu, ga, tg));
  MOK_CHECK(down_fwd_args(fn, rows, hidden, inter, act, w_down, y, da, td, pairs));
  finish_args(ga, rows, kGateUpFwd, 1);
  finish_args(da, rows, kDownFwd, 1);
  if (!tg.token || !td.token)
    return mok_error(NULL, mokNotSupported, "%s: needs token tiles for both GEMMs (inter %% 128 == 0 and hidden %% 256 "
                     "== 0; here inter %d, hidden %d)", fn, inter, hidden);
  if (!tok_lean<kGateUpFwd>(ga) || !tok_lean<kDownFwd>(da))
    return mok_error(NULL, mokNotSupported, "%s: needs W_up to lie right after W_gate (one allocation [W_gate | "
                     "W_up], mok.h) and no GEMM diagnostic or knob that the lean kernel lacks", fn);
  if (pairs) da.tm_b1 = da.tm_b0; /* (the megakernel runs no CTA pairs) */
  MOK_CHECK(take_sched_slot(ga, rows));
  da.sched = ga.sched;
  da.error_word = ga.error_word;
  GemmTileArgs sga, sda;
  const bool sh = mega->s_gate && mega->tokens > 0;
  if (sh) { /* the shared expert: one expert of `tokens` rows, straight from x */
    MOK_CHECK(check_ptr(fn, "s_seg", mega->s_seg));
    MOK_CHECK(check_ptr(fn, "mega->x", mega->x));
    mokGemmRows_t sr = *rows;
    sr.num_experts = 1;
    sr.capacity = ((int64_t)mega->tokens + 63) / 64 * 64;
    sr.expert_count = mega->s_seg;
    sr.expert_offset = mega->s_seg + 1;
    sr.expert_count_host = NULL;
    sr.input_rows = mega->tokens; /* x has `tokens` rows: its maps end there (TMA reads zeros past them) */
    mokGemmTileShape_t ts;
    int sp = 0;
    MOK_CHECK(gateup_fwd_args(fn, &sr, hidden, inter, swiglu_limit, mega->x, mega->s_gate, mega->s_up, mega->s_act,
                              mega->s_gu, sga, ts));
    MOK_CHECK(down_fwd_args(fn, &sr, hidden, inter, mega->s_act, mega->s_down, mega->s_y, sda, ts, sp));
    finish_args(sga, &sr, kGateUpFwd, 1);
    finish_args(sda, &sr, kDownFwd, 1);
    if (!tok_lean<kGateUpFwd>(sga) || !tok_lean<kDownFwd>(sda))
      return mok_error(NULL, mokNotSupported, "%s: the shared expert in the launch needs s_up right after s_gate", fn);
    if (sp) sda.tm_b1 = sda.tm_b0;
    sga.sched = sda.sched = ga.sched;
    sga.error_word = sda.error_word = ga.error_word;
    sga.expert_order = sda.expert_order = 0;
  }
  return mok_gemm_ffn_mega_launch(ga, da, sh ? &sga : NULL, sh ? &sda : NULL, mega, xg, y, hidden, stream);
}

extern "C" mokResult_t mok_gemm_down_dgrad(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                           const mokBf16 *dy, const mokBf16 *w_down, const mokBf16 *gu,
                                           mokBf16 *dgu, cudaStream_t stream) {
  static const char fn[] = "mok_gemm_down_dgrad";
  MOK_CHECK(check_rows(fn, rows, hidden, inter));
  MOK_CHECK(check_limit(fn, swiglu_limit));
  MOK_CHECK(check_ptr(fn, "dy", dy));
  MOK_CHECK(check_ptr(fn, "w_down", w_down));
  MOK_CHECK(check_ptr(fn, "gu", gu));
  MOK_CHECK(check_ptr(fn, "dgu", dgu));
  mokGemmTileShape_t ts;
  MOK_CHECK(mok_gemm_tile_shape(mokGemmDownDgrad, hidden, inter, &ts));
  GemmTileArgs a = base_args(rows);
  const uint64_t E = (uint64_t)rows->num_experts;
  const uint64_t dyr = input_rows(rows);
  MOK_CHECK(make_map(&a.tm_a, dy, hidden, dyr, kBM, "dy"));
  MOK_CHECK(make_map(&a.tm_a64, dy, hidden, dyr, 64, "dy"));
  MOK_CHECK(make_map(&a.tm_b0, w_down, inter, E * hidden, 64, "w_down"));
  a.tm_b1 = a.tm_b0;
  a.n_out = inter;
  a.k_len = hidden;
  a.b_rows = hidden;
  a.limit = swiglu_limit;
  if (__atomic_load_n(&g_ddown_tok, __ATOMIC_RELAXED) == 1 && inter % 256 == 0) {
    /* experiment: token tiles (M = 256 columns of I, N = the expert's rows, K = H; the
     * weights MN-major in tm_b0's 64 x 64 boxes), g and u in 32-row pieces */
    MOK_CHECK(make_map(&a.tm_tok, dy, hidden, dyr, 32, "dy"));
    MOK_CHECK(make_map(&a.tm_tok16, dy, hidden, dyr, 16, "dy"));
    MOK_CHECK(make_map(&a.tm_aux, gu, 2 * (uint64_t)inter, rows->capacity, 32, "gu"));
    MOK_CHECK(make_map(&a.tm_out0, dgu, 2 * (uint64_t)inter, rows->capacity, 32, "dgu"));
    MOK_CHECK(make_map(&a.tm_out0h, dgu, 2 * (uint64_t)inter, rows->capacity, 16, "dgu"));
    a.tm_out1 = a.tm_out0;
    a.tm_out1h = a.tm_out0h;
    a.mix = mix_rule(mokGemmDownFwd);
    a.stagger = stagger_rule();
    return launch<kDownDgrad, 256, 1>(a, rows, row_tiles_bound(rows, inter, 256), stream);
  }
  MOK_CHECK(make_map(&a.tm_aux, gu, 2 * (uint64_t)inter, rows->capacity, 64, "gu"));
  MOK_CHECK(make_map(&a.tm_out0, dgu, 2 * (uint64_t)inter, rows->capacity, 64, "dgu"));
  a.tm_out1 = a.tm_out0;
  a.mix = mix_rule(mokGemmDownDgrad);
  return launch_bn<kDownDgrad>(ts.bn, a, rows, row_tiles_bound(rows, inter, ts.out_cols), stream);
}

extern "C" mokResult_t mok_gemm_gateup_dgrad(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *dgu,
                                             const mokBf16 *w_gate, const mokBf16 *w_up, mokBf16 *dx,
                                             cudaStream_t stream) {
  static const char fn[] = "mok_gemm_gateup_dgrad";
  MOK_CHECK(check_rows(fn, rows, hidden, inter));
  MOK_CHECK(check_ptr(fn, "dgu", dgu));
  MOK_CHECK(check_ptr(fn, "w_gate", w_gate));
  MOK_CHECK(check_ptr(fn, "w_up", w_up));
  MOK_CHECK(check_ptr(fn, "dx", dx));
  mokGemmTileShape_t ts;
  MOK_CHECK(mok_gemm_tile_shape(mokGemmGateUpDgrad, hidden, inter, &ts));
  GemmTileArgs a = base_args(rows);
  const uint64_t E = (uint64_t)rows->num_experts;
  MOK_CHECK(make_map(&a.tm_a, dgu, 2 * (uint64_t)inter, rows->capacity, kBM, "dgu"));
  MOK_CHECK(make_map(&a.tm_a64, dgu, 2 * (uint64_t)inter, rows->capacity, 64, "dgu"));
  MOK_CHECK(make_map(&a.tm_b0, w_gate, hidden, E * inter, 64, "w_gate"));
  MOK_CHECK(make_map(&a.tm_b1, w_up, hidden, E * inter, 64, "w_up"));
  a.n_out = hidden;
  a.k_len = 2 * inter;
  a.b_rows = inter;
  MOK_CHECK(make_map(&a.tm_out0, dx, hidden, rows->capacity, 64, "dx"));
  a.tm_out1 = a.tm_aux = a.tm_out0;
  a.mix = mix_rule(mokGemmGateUpDgrad);
  return launch_bn<kGateUpDgrad>(ts.bn, a, rows, row_tiles_bound(rows, hidden, ts.out_cols), stream);
}

/* a_ext, b_ext: the rows that a_rows and b_rows hold */
static mokResult_t wgrad(const char *fn, mokGemmKind_t kind, const mokGemmRows_t *rows, int hidden, int inter,
                         const mokBf16 *a_rows, uint64_t a_ext, int m_w, int m_split, const mokBf16 *b_rows,
                         uint64_t b_ext, int n_w, mokDtype_t dtype_acc, void *out0, void *out1, cudaStream_t stream) {
  const int accumulate = ((int)dtype_acc & MOK_GEMM_ACCUMULATE) != 0;
  const mokDtype_t dtype = (mokDtype_t)((int)dtype_acc & ~MOK_GEMM_ACCUMULATE);
  if (dtype != mokDtypeBF16 && dtype != mokDtypeFP32)
    return mok_error(NULL, mokInvalidArgument, "%s: grad_dtype = %d, must be mokDtypeBF16 or mokDtypeFP32", fn,
                     (int)dtype);
  if (accumulate && dtype != mokDtypeFP32)
    return mok_error(NULL, mokInvalidArgument, "%s: MOK_GEMM_ACCUMULATE needs mokDtypeFP32 gradients", fn);
  mokGemmTileShape_t ts;
  MOK_CHECK(mok_gemm_tile_shape(kind, hidden, inter, &ts));
  GemmTileArgs a = base_args(rows);
  MOK_CHECK(make_map(&a.tm_a, a_rows, (uint64_t)m_w, a_ext, 64, "wgrad A"));
  MOK_CHECK(make_map(&a.tm_b0, b_rows, (uint64_t)n_w, b_ext, 64, "wgrad B"));
  a.tm_b1 = a.tm_b0;
  a.tm_a64 = a.tm_a;
  a.n_out = n_w;
  a.m_w = m_w;
  a.m_split = m_split;
  a.out_fp32 = dtype == mokDtypeFP32;
  a.accumulate = accumulate;
  const uint64_t E = (uint64_t)rows->num_experts;
  MOK_CHECK(make_map_t(&a.tm_out0, out0, a.out_fp32, (uint64_t)n_w, E * (uint64_t)m_split, 64, "weight gradient"));
  if (m_w > m_split)
    MOK_CHECK(make_map_t(&a.tm_out1, out1, a.out_fp32, (uint64_t)n_w, E * (uint64_t)(m_w - m_split), 64,
                         "weight gradient"));
  else
    a.tm_out1 = a.tm_out0;
  a.tm_aux = a.tm_out0;
  const int64_t tiles = (int64_t)rows->num_experts * ((m_w + kBM - 1) / kBM) * ((n_w + ts.bn - 1) / ts.bn);
  return launch_bn<kWgradGateUp>(ts.bn, a, rows, tiles, stream);
}

extern "C" mokResult_t mok_gemm_wgrad_gateup(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *dgu,
                                             const mokBf16 *x, mokDtype_t grad_dtype, void *dw_gate, void *dw_up,
                                             cudaStream_t stream) {
  static const char fn[] = "mok_gemm_wgrad_gateup";
  MOK_CHECK(check_rows(fn, rows, hidden, inter));
  MOK_CHECK(check_ptr(fn, "dgu", dgu));
  MOK_CHECK(check_ptr(fn, "x", x));
  MOK_CHECK(check_ptr(fn, "dw_gate", dw_gate));
  MOK_CHECK(check_ptr(fn, "dw_up", dw_up));
  return wgrad(fn, mokGemmWgradGateUp, rows, hidden, inter, dgu, (uint64_t)rows->capacity, 2 * inter, inter, x,
               input_rows(rows), hidden, grad_dtype, dw_gate, dw_up, stream);
}

extern "C" mokResult_t mok_gemm_wgrad_down(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *dy,
                                           const mokBf16 *act, mokDtype_t grad_dtype, void *dw_down,
                                           cudaStream_t stream) {
  static const char fn[] = "mok_gemm_wgrad_down";
  MOK_CHECK(check_rows(fn, rows, hidden, inter));
  MOK_CHECK(check_ptr(fn, "dy", dy));
  MOK_CHECK(check_ptr(fn, "act", act));
  MOK_CHECK(check_ptr(fn, "dw_down", dw_down));
  return wgrad(fn, mokGemmWgradDown, rows, hidden, inter, dy, input_rows(rows), hidden, hidden, act,
               (uint64_t)rows->capacity, inter, grad_dtype, dw_down, dw_down, stream);
}

extern "C" mokResult_t mok_gemm_shared_backward(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                                const mokBf16 *dy, const mokBf16 *x, const mokBf16 *s_gate,
                                                const mokBf16 *s_up, const mokBf16 *s_down, const mokBf16 *gu,
                                                const mokBf16 *act, mokBf16 *dgu, mokBf16 *dx, mokDtype_t grad_dtype,
                                                void *dw_gate, void *dw_up, void *dw_down, cudaStream_t stream) {
  static const char fn[] = "mok_gemm_shared_backward";
  MOK_CHECK(check_rows(fn, rows, hidden, inter));
  if (rows->num_experts != 1 || !rows->input_rows)
    return mok_error(NULL, mokInvalidArgument, "%s: one expert of input_rows > 0 rows (here %d experts, %lld rows)",
                     fn, rows->num_experts, (long long)rows->input_rows);
  const int gdt = (int)grad_dtype & ~MOK_GEMM_ACCUMULATE;
  if (gdt != mokDtypeBF16 && gdt != mokDtypeFP32)
    return mok_error(NULL, mokInvalidArgument, "%s: grad_dtype = %d, must be mokDtypeBF16 or mokDtypeFP32", fn,
                     (int)grad_dtype);
  const void *p[] = {dy, x, s_gate, s_up, s_down, gu, act, dgu, dx, dw_gate, dw_up, dw_down};
  static const char *names[] = {"dy", "x", "s_gate", "s_up", "s_down", "gu", "act", "dgu", "dx", "dw_gate", "dw_up",
                                "dw_down"};
  for (int i = 0; i < 12; i++) MOK_CHECK(check_ptr(fn, names[i], p[i]));
  /* dgu from dy (zero past the tokens, so dgu's padding rows are zero: gu's are), then
   * the shared d_x rows, then the weight gradients over the tokens */
  MOK_CHECK(mok_gemm_down_dgrad(rows, hidden, inter, swiglu_limit, dy, s_down, gu, dgu, stream));
  MOK_CHECK(mok_gemm_gateup_dgrad(rows, hidden, inter, dgu, s_gate, s_up, dx, stream));
  MOK_CHECK(mok_gemm_wgrad_down(rows, hidden, inter, dy, act, grad_dtype, dw_down, stream));
  return mok_gemm_wgrad_gateup(rows, hidden, inter, dgu, x, grad_dtype, dw_gate, dw_up, stream);
}

/* ---- test / benchmark helpers ------------------------------------------------------ */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_rows_kernel(uint16_t *dst, int64_t rows, int cols, uint64_t seed, float scale, int experts,
                                 const int32_t *off, const int32_t *count) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols;
    bool live = true;
    if (off) {
      int lo = 0, hi = experts; /* expert whose segment holds r */
      while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (off[mid] <= r) lo = mid;
        else hi = mid;
      }
      live = r < off[experts] && r - off[lo] < count[lo];
    }
    float v = 0.f;
    if (live) {
      const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + (uint64_t)i);
      v = scale * 1.7320508f * (2.0f * (float)(h >> 40) * (1.0f / 16777216.0f) - 1.0f);
    }
    __nv_bfloat16 b = __float2bfloat16_rn(v);
    dst[i] = *reinterpret_cast<uint16_t *>(&b);
  }
}

extern "C" mokResult_t mok_gemm_fill_rows(mokBf16 *dst, int64_t rows, int cols, uint64_t seed, float scale,
                                          int num_experts, const int32_t *expert_offset,
                                          const int32_t *expert_count, cudaStream_t stream) {
  if (!dst || rows < 0 || cols < 1 || (expert_offset && (!expert_count || num_experts < 1)))
    return mok_error(NULL, mokInvalidArgument, "mok_gemm_fill_rows: bad arguments");
  if (rows == 0) return mokSuccess;
  fill_rows_kernel<<<1024, 256, 0, stream>>>(dst, rows, cols, seed, scale, num_experts, expert_offset,
                                             expert_count);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

__global__ void count_nan_kernel(const void *src, int64_t n, int fp32, int *bad) {
  int local = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (fp32) {
      local += isnan(static_cast<const float *>(src)[i]) ? 1 : 0;
    } else {
      const uint16_t b = static_cast<const uint16_t *>(src)[i];
      local += ((b & 0x7f80u) == 0x7f80u && (b & 0x7fu)) ? 1 : 0;
    }
  }
  if (local) atomicAdd(bad, local);
}

extern "C" mokResult_t mok_gemm_count_nan(const void *src, int64_t rows, int cols, int fp32, int *bad,
                                          cudaStream_t stream) {
  if (!src || !bad || rows < 0 || cols < 1)
    return mok_error(NULL, mokInvalidArgument, "mok_gemm_count_nan: bad arguments");
  CUDA_CHECK(NULL, cudaMemsetAsync(bad, 0, sizeof(int), stream));
  if (rows == 0) return mokSuccess;
  count_nan_kernel<<<1024, 256, 0, stream>>>(src, rows * (int64_t)cols, fp32, bad);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
extern "C" mokKernelAnchor mok_anchor_gemm(void) {
  mokKernelAnchor a = {"src/gemm.cu", (const void *)fill_rows_kernel,
                       {(const void *)g_gemm_sched, (const void *)&g_gemm_error, NULL}};
  return a;
}
