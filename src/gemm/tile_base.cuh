/*
 * tile_base.cuh — the GEMM tiles' common ground (grouped_gemm.cuh has the whole picture):
 * kinds and shared-memory plans, GemmTileArgs, bounded waits, the pipeline and epilogue
 * state, the schedule (GemmCursor, gemm_decode_tile: tile index -> coordinates, token tile
 * cuts, expert order, mix order) and the row-grouped tiles' producer (gemm_tile_produce).
 */
#ifndef MOK_GEMM_TILE_BASE_CUH
#define MOK_GEMM_TILE_BASE_CUH

#include <cuda_bf16.h> /* defines: __nv_bfloat162, __float22bfloat162_rn */
#include <stdint.h>

#include "comm.h"                   /* defines: MOK_ERRWORD, MOK_DEVERR_TIMEOUT, MOK_WAIT_GEMM_* */
#include "plan.h"                   /* defines: mok_plan_tok_split, mok_plan_tok_tile, mok_plan_tok_rows_routed */
#include "gemm/sm90_primitives.cuh" /* defines: mbarrier_*, tma_*, bulk_*, stmatrix_x4, wgmma_* */

namespace mok_sm90 {

/* Kinds, numbered as mokGemmKind_t in gemm.h. */
enum { kGateUpFwd = 0, kDownFwd = 1, kDownDgrad = 2, kGateUpDgrad = 3, kWgradGateUp = 4, kWgradDown = 5 };

/* The producer hands decoded tiles to the consumers through kSchedSlots slots of
 * kSlotInts ints in the barrier area (grouped_gemm_kernel), the cursor after them. */
constexpr int kSchedSlots = 4;
constexpr int kSlotInts = 9;

constexpr int kBM = 128;
constexpr int kBK = 64;
constexpr int kThreads = 384; /* WG0 producer, WG1 and WG2 consumers */
constexpr int kABytes = kBM * kBK * 2;
constexpr int kChunkBytes = 64 * kBK * 2; /* one MN-major box: 64 MN x 64 K */
constexpr int kStgBytes = 8192;           /* one epilogue chunk: 64 rows x 128 bytes */
constexpr int kSmemLimit = 232448;        /* opt-in shared memory per block on sm_90 */
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
/* CTA pairs (TOK 2): the producer also walks pairs and a ticket mailbox; 40 registers
 * spill there (ptxas), 56 do not, and the consumers fit in 224 (384 threads: <= 64K). */
constexpr int kPairProducerRegs = 56;
constexpr int kPairConsumerRegs = 224;
static_assert(128 * kPairProducerRegs + 256 * kPairConsumerRegs <= 65536, "register file");

template <int KIND>
struct KindTraits {
  static constexpr bool kWgrad = KIND == kWgradGateUp || KIND == kWgradDown;
  static constexpr int kAMn = kWgrad ? 1 : 0;                                    /* A MN-major */
  static constexpr int kBMn = (KIND == kDownDgrad || KIND == kGateUpDgrad || kWgrad) ? 1 : 0;
};

/* Shared-memory plan of one kernel: as many stages (<= 6) as fit beside the epilogue
 * area; offsets from the 1024-aligned base. */
template <int KIND, int BN>
struct TileConfig {
  static constexpr int kBBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes; /* a multiple of 1024 */
  static constexpr int kEpiChunks = KIND == kDownDgrad ? 4 : 2; /* per consumer warpgroup */
  static constexpr int kEpiBytes = 2 * kEpiChunks * kStgBytes;
  static constexpr int kBarBytes = 512; /* full[S] empty[S] aux[2] sfull[4] sempty[4] slot[4] */
  static constexpr int kFit = (kSmemLimit - 1024 - kEpiBytes - kBarBytes) / kStageBytes;
  static constexpr int kStages = kFit > 6 ? 6 : kFit;
  static constexpr int kEpiOffset = kStages * kStageBytes;
  static constexpr int kBarOffset = kEpiOffset + kEpiBytes;
  static constexpr int kSmemBytes = 1024 + kBarOffset + kBarBytes; /* 1024 of slack for alignment */
  static_assert(kStages >= 3, "too few pipeline stages");
  static_assert((2 * kStages + 2 + 2 * kSchedSlots) * 8 + kSchedSlots * kSlotInts * 4 + 2 * 32 + 16 <= kBarBytes,
                "barrier area too small");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan too large");
  static_assert(KIND != kDownDgrad || BN == 128, "down dgrad stages g and u of BN = 128 columns");
  static_assert(KIND != kGateUpFwd || BN != 192, "gate+up stores whole 64-column chunks of act, g and u");
};

/* Everything a tile reads: backend-neutral sizes and pointers plus the sm90 tensor maps
 * (built on the host; the struct is a __grid_constant__ kernel parameter). */
struct GemmTileArgs {
  CUtensorMap tm_a;    /* A operand: rows x K (K-major), or for wgrad rows x M (MN-major) */
  CUtensorMap tm_b0;   /* weights (gate / down) or, for wgrad, the rows x N operand */
  CUtensorMap tm_b1;   /* W_up: second half of N (gate+up fwd) or of K (gate+up dgrad) */
  CUtensorMap tm_out0; /* stores: act / y / dgu / dx / dW_gate / dW_down (box 64 rows x 128 B) */
  CUtensorMap tm_out1; /* stores: gu (gate+up fwd) / dW_up */
  CUtensorMap tm_aux;  /* loads: gu (down dgrad), box 64 x 64 */
  CUtensorMap tm_a64;  /* row-grouped kinds: A with a 64-row box (tail tiles load only their rows) */
  CUtensorMap tm_tok;  /* token tiles: the rows operand with a 32-row box */
  CUtensorMap tm_tok16;  /* token tiles: the same with a 16-row box (a tile's odd unit) */
  CUtensorMap tm_out0h;  /* token tiles: tm_out0 / tm_out1 (32-row boxes there) with */
  CUtensorMap tm_out1h;  /* 16-row boxes */
  CUtensorMap tm_tok128; /* token tiles: the rows operand with a 128-row box (row_box128) */
  const int32_t *expert_offset; /* [E_l + 1] */
  const int32_t *expert_count;  /* [E_l] routed rows of each expert, or NULL (token tiles) */
  const int32_t *skip;          /* backward kinds: nonzero at the start = the launch writes nothing */
  int num_experts;
  int raster;     /* row-grouped kinds: tiles of an expert run in groups of `raster` row
                     tiles, every output block of a group before the next group */
  int tok_units;  /* token tiles: most 16-row units a tile (1 .. kTokMaxUnits) */
  int mix;        /* token tiles, or the data gradients' 128-row tiles, under tickets: mix
                     order (mix_tile; gemm.cu: the rule) */
  int eager_rows; /* token tiles of at most eager_rows rows give each stage but the last back
                     once its own MMAs are done (wgmma.wait_group 0), not once the next stage
                     has landed: one more stage in flight for the weight streams of few rows
                     (tok_consume_nt; only tiles of <= kTokEagerMaxRows rows can); 0 = never */
  int mix_ctas;   /* mix order (not token pairs): split the CTAs instead of the order
                     (grouped_gemm_kernel): about mix_ctas of them (0: mix_counts' rule)
                     run the one-tile experts' tiles, the rest the others'; -1: no split, the
                     one-tile experts' tiles spread over the order (mix_tile) */
  int stagger;    /* token tiles under the static schedule: expert 0's tiles at most half as
                     many units (tok_units_of) */
  int n_out;      /* output columns: I (gate+up fwd, down dgrad), H (down fwd, gate+up dgrad), N_w */
  int k_len;      /* reduction length of row-grouped kinds: H, I, H, 2I */
  int b_rows;     /* rows of one expert in the weight tensor maps: I or H */
  int m_w;        /* wgrad: output rows per expert (2I or H) */
  int m_split;    /* wgrad: rows [0, m_split) go to out0, the rest to out1 */
  float limit;    /* SwiGLU clamp, 0 = off */
  int out_fp32;   /* wgrad output dtype */
  int accumulate; /* wgrad, fp32: add to the output (TMA reduce-add) instead of storing */
  int save_gu;    /* gate+up fwd: store g and u (tm_out1) */
  /* standalone kernel only (a megakernel schedules tiles itself): */
  int *sched;     /* [3] next-tile counter, finished-CTA count, next-tile counter of the
                     one-tile experts (mix_ctas): zero before the launch;
                     the last CTA to finish zeroes them again */
  unsigned long long *error_word; /* a wait that runs out records MOK_ERRWORD(TIMEOUT, ...) */
  unsigned long long timeout_ns;  /* budget of one wait */
  int rank;       /* written into the error word */
  int stall_tile; /* tests: the producer stops before this tile (a lost load); -1 = off */
  int epi_debug;  /* timing diagnostics of token tiles (outputs wrong): 1 = no TMA stores,
                     2 = no epilogue at all; 0 = off */
  int sched_mode;   /* 0: the rule (grouped_gemm_kernel); 1: static; 2: tickets */
  int split_tail;   /* BN = 256 kinds: 64-row tail tiles split by columns (else one warpgroup) */
  int pair_solo;    /* CTA pairs, diagnostics: each CTA loads all its operands (no multicast) */
  int gu_boxes;     /* gate+up token tiles alone, weights from tm_aux (gemm.cu make_map_gu):
                       1: a stage's 256 weight rows in one 4-D box [64-row groups][gate, up]
                       [64 rows][K]; 2: two 3-D boxes [gate, up][64 rows][K]; 0: four 64-row
                       boxes of tm_b0 / tm_b1 */
  int row_box128;   /* token tiles: the rows in 128-row boxes first, then 32s and a 16
                       (gemm.cu row_box_rule) */
  int rows_m;       /* forward token tiles of exactly 128 rows, not pairs (gate+up on the
                       176-row ring: the standalone kernel and the megakernel; down on the
                       128-row ring: the standalone kernel): the rows as wgmma M, the 256
                       weight rows as N (tok_consume_rows_m; gemm.cu rows_m_rule,
                       dn_rows_m_rule) */
  int cold_evict;   /* gate+up token tiles of the split mix order: the one-tile experts'
                       weights loaded with an L2 evict-first policy (tok_tile_produce) */
  int expert_order; /* token tiles under tickets with expert counts, at most
                       kOrderMaxExperts experts: their tiles in the order of the experts
                       with most rows first (tok_expert_rank); 0 = index order */
  unsigned long long *sclk; /* token tiles, diagnostics (stage clock): kSclkWords counters of
                              how long each stage took from its loads' issue to the consumers'
                              use (tok_sclk_record); NULL = off */
  unsigned long long *trace; /* token tiles, diagnostics: [0] records taken, then trace_cap records
                                of 4 words (tile_trace); NULL = off */
  int trace_cap;
};

/* ---- bounded waits --------------------------------------------------------------------
 * Every mbarrier wait of the tiles is bounded: a wait that is still open after
 * timeout_ns records MOK_ERRWORD(MOK_DEVERR_TIMEOUT, what, rank, tile) in *err (first
 * word wins) and returns false; a wait that sees a recorded word returns false too. From
 * then on the thread is `dead`: its waits return false at once, it still runs its code
 * path (garbage data, same barriers), so the threads of a warpgroup stay in step and the
 * kernel ends instead of hanging. Outputs of such a launch are undefined. */
struct WaitCtx {
  unsigned long long *err;
  unsigned long long timeout_ns;
  uint32_t rank;
  uint32_t tile; /* where: the tile being waited for */
  bool dead;
};

__device__ __forceinline__ WaitCtx wait_ctx(const GemmTileArgs &a) {
  WaitCtx w;
  w.err = a.error_word;
  w.timeout_ns = a.timeout_ns;
  w.rank = (uint32_t)a.rank;
  w.tile = 0;
  w.dead = false;
  return w;
}

/* The slow path touches neither the clock nor global memory for its first 2048 tests
 * (a normal wait ends there; a load of the error word in the loop would delay noticing
 * the phase by an L2 round trip), then checks both every 256 tests. Its loops stay loops
 * (unroll 1): unrolled, every wait site took ~70 copies of the test (910 barrier tests in
 * the down kernel, cuBLAS's has 24); the compact loops measured level to +3% (qwen3.5
 * down), docs/PERF.md session 12. */
template <bool kCluster = false> /* acquire at cluster scope (mbarrier_try_wait_parity) */
__device__ __forceinline__ bool bar_wait(uint64_t *bar, uint32_t parity, WaitCtx &w, uint32_t what) {
  if (mbarrier_try_wait_parity<kCluster>(bar, parity)) return true;
  if (w.dead) return false;
#pragma unroll 1
  for (int spin = 0; spin < 2048; ++spin)
    if (mbarrier_try_wait_parity<kCluster>(bar, parity)) return true;
  const unsigned long long start = globaltimer_u64();
  for (;;) {
#pragma unroll 1
    for (int spin = 0; spin < 256; ++spin)
      if (mbarrier_try_wait_parity<kCluster>(bar, parity)) return true;
    if (*reinterpret_cast<volatile unsigned long long *>(w.err) != 0ull) {
      w.dead = true;
      return false;
    }
    if (globaltimer_u64() - start > w.timeout_ns) {
      atomicCAS(w.err, 0ull, MOK_ERRWORD(MOK_DEVERR_TIMEOUT, what, w.rank, w.tile));
      __threadfence_system();
      w.dead = true;
      return false;
    }
  }
}

struct TileCoord {
  int expert;
  int m0;       /* first row of the tile: schedule row (row-grouped) or weight row (wgrad) */
  int m_end;    /* rows >= m_end are not this tile's (segment end, or m_w) */
  int n0;       /* first output column */
  int k0;       /* wgrad: first schedule row of the expert */
  int k_blocks; /* BK-wide steps of the reduction */
  int nt;       /* token tiles: its rows (16 .. 176); 0 for the 128-row tiles */
  int z_end;    /* token tiles: rows [m_end, z_end) are padding this tile writes as zeros */
  int share;    /* token tiles in CTA pairs (TOK 2): what the pair's two tiles share and
                   load once for both (multicast): kShareW, kShareRows; else 0 */
};

struct PipeState {
  int stage;
  uint32_t phase;
};

template <int STAGES>
__device__ __forceinline__ void pipe_advance(PipeState &p) {
  if (++p.stage == STAGES) {
    p.stage = 0;
    p.phase ^= 1u;
  }
}
/* n pipe_advance steps at once. */
template <int STAGES>
__device__ __forceinline__ void pipe_advance_by(PipeState &p, int n) {
  const int s = p.stage + n;
  p.phase ^= (uint32_t)(s / STAGES) & 1u;
  p.stage = s % STAGES;
}

/* A consumer warpgroup's epilogue state: the staging chunk it writes next (0 / 1) and
 * the parity of its aux barrier (down dgrad). */
struct EpiState {
  int buf;
  uint32_t aux_phase;
};

template <int KIND, int BN>
__host__ __device__ __forceinline__ int tile_out_cols() {
  return KIND == kGateUpFwd ? BN / 2 : BN;
}

/* ---- schedule: tile index -> coordinates --------------------------------------------
 * Row-grouped kinds: expert e has ceil(seg_e / 128) * n_tiles tiles; the cursor holds the
 * first tile index of expert e and its segment bounds, and walks forward (restarting at
 * expert 0 when asked for an earlier index). Offsets are read with __ldg: they must not
 * change while the kernel runs. */
struct GemmCursor {
  int e, first, o0, o1; /* e: a position in the expert order; o0, o1: its segment's bounds */
  int n;       /* token tiles: rows of the segment the tiles cover (tok_rows) */
  int stagger; /* token tiles: a.stagger, unless the launch hands tiles out by tickets */
  const uint16_t *order; /* token tiles: order[i] is the expert at position i (most rows
                            first: tok_expert_rank); NULL: experts in index order */
};
static_assert(sizeof(GemmCursor) <= 32, "two cursors after the slots take 64 bytes");
/* The barrier area after the slots (grouped_gemm_kernel): the two cursors, then 4 mix words
 * (mix_tc), then 4 stage-clock stamps; offsets in ints from the slots' start. */
constexpr int kMixWordInt = kSchedSlots * kSlotInts + 2 * (int)(sizeof(GemmCursor) / sizeof(int));

/* A read-only load of a schedule offset (__ldg on the device; host builds of the schedule
 * functions, for tests, read plain memory). */
__host__ __device__ __forceinline__ int32_t sched_ld(const int32_t *p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}


/* ---- token tiles (forward gate+up and down) -------------------------------------------
 * The rows are the wgmma N side: the rows of a segment the tiles cover (all seg rows, or
 * with expert counts the routed rows rounded up to 16: tok_rows) are cut into
 * ceil(rows / 176) tiles of 16-row units (at most a.tok_units units a tile), as even as
 * can be (tok_split: 341 routed rows -> 176 + 176, 320 -> 160 + 160, 512 -> 4 x 128, 192
 * -> 96 + 96, 16 -> 16), so tiles of an expert cost the same and none is a mostly empty
 * remainder of a fixed grid; the weights are the M side, 256 rows a tile (gate+up: 128
 * outputs as [64 gate | 64 up] x 2; down: 256 outputs). */
constexpr int kTokUnit = 16;
constexpr int kTokMaxUnits = 11;
constexpr int kTokMax = kTokUnit * kTokMaxUnits; /* 176 */
/* Tiles of at most this many rows may give each stage back once their own MMAs on it are
 * done (GemmTileArgs::eager_rows, tok_consume_nt): a branch compiled into those only. */
constexpr int kTokEagerMaxRows = 96;

/* ---- lean token-tile instances ----------------------------------------------------------
 * The forward token tiles alone are compiled twice (grouped_gemm_kernel's DIAG). DIAG = true
 * reads every knob and diagnostic from the arguments. DIAG = false, the instance a launch
 * takes when no diagnostic is on and the box knobs are at their rules (gemm.cu: tok_lean),
 * has those rules compiled in and none of the diagnostics' code (tile trace, stage clock,
 * epilogue switches, pairs without multicast) nor the other weight- and row-box paths: a
 * kernel's speed depends on code its hot loop never runs (docs/MEGAKERNEL.md). Measured in
 * four runs on four H200s (docs/PERF.md, session 23): deepseek-v4-pro Zipf gate+up over
 * balanced +1.4-1.9 points, qwen3.5 R512 down +1.1-1.6, kimi down -0.4..-2.0, the rest
 * within 2. (Also compiling in the other rules, eager rows, evict-first and the mix split,
 * measured level against the parent: not done.) Diagnostic runs time the DIAG instance. */
constexpr int kLeanGuBoxes = 1; /* gate+up weights: one 4-D box a stage (gu_boxes_rule) */
template <bool DIAG>
struct TokKnobs {
  static __device__ __forceinline__ unsigned long long *sclk(const GemmTileArgs &a) { return DIAG ? a.sclk : nullptr; }
  static __device__ __forceinline__ unsigned long long *trace(const GemmTileArgs &a) { return DIAG ? a.trace : nullptr; }
  static __device__ __forceinline__ int epi_debug(const GemmTileArgs &a) { return DIAG ? a.epi_debug : 0; }
  static __device__ __forceinline__ int pair_solo(const GemmTileArgs &a) { return DIAG ? a.pair_solo : 0; }
  static __device__ __forceinline__ int gu_boxes(const GemmTileArgs &a) { return DIAG ? a.gu_boxes : kLeanGuBoxes; }
  /* row_box_rule: gate+up on, down off */
  template <int KIND>
  static __device__ __forceinline__ int row_box128(const GemmTileArgs &a) { return DIAG ? a.row_box128 : KIND == kGateUpFwd; }
};
/* The cut itself is plan.h's (mok_plan_tok_split / _tok_tile / _tok_rows: one definition
 * for the GEMM kernels, the megakernel's plan and its CPU model): the fewest tiles of
 * <= max_units units, or one more where that makes them equal and keeps them >= 128 rows
 * (512 rows: 4 x 128, not 176 + 176 + 160; measured: kimi R341 as 128 + 128 + 96 rows ran
 * 12% slower than as 3 x 128, tiles of unequal cost drifting apart under a static
 * schedule; 336 rows: 176 + 160, not 3 x 112, session 42). */
static_assert(kTokUnit == MOK_PLAN_UNIT_ROWS && kTokMaxUnits == MOK_PLAN_TILE_MAX_UNITS, "plan.h's token tiles");
__host__ __device__ __forceinline__ int tok_split(int u, int max_units) { return mok_plan_tok_split(u, max_units); }
__host__ __device__ __forceinline__ int tok_tiles(int rows, int max_units) {
  return tok_split(rows / kTokUnit, max_units);
}
/* tile i of rows: first row off (from the segment start), nt rows */
__host__ __device__ __forceinline__ void tok_tile(int rows, int max_units, int i, int &off, int &nt) {
  mok_plan_tok_tile(rows, max_units, i, &off, &nt);
}
/* Rows of a segment of seg rows that its token tiles compute: all of them, or with
 * expert_count the routed rows rounded up to 16 (at least one unit of a non-empty
 * segment); the last tile writes zeros on the rest (z_end). */
__host__ __device__ __forceinline__ int tok_rows(const GemmTileArgs &a, int e, int seg) {
  if (!a.expert_count || seg <= 0) return seg;
  return mok_plan_tok_rows_routed(seg, sched_ld(a.expert_count + e));
}
/* Most units of the cursor's expert's token tiles. Stagger: expert 0's tiles are cut half
 * as large, so the CTAs that run them in the first wave finish early and from then on run
 * half a tile out of step with the others (equal tiles under the static schedule keep
 * every CTA in lock step: all start their weight loads, and all write their outputs, at
 * the same moments). Tickets desynchronise CTAs anyway (the kernel drops stagger there). */
__host__ __device__ __forceinline__ int tok_units_of(const GemmTileArgs &a, const GemmCursor &cu) {
  return cu.stagger && cu.e == 0 ? (a.tok_units + 1) / 2 : a.tok_units;
}
/* The expert at position i of the cursor's order. */
__host__ __device__ __forceinline__ int cursor_expert(const GemmCursor &cu, int i) {
  return cu.order ? cu.order[i] : i;
}
/* The cursor's segment bounds (and token rows) for its position cu.e < num_experts. */
__host__ __device__ __forceinline__ void cursor_bounds(const GemmTileArgs &a, GemmCursor &cu) {
  const int x = cursor_expert(cu, cu.e);
  cu.o0 = sched_ld(a.expert_offset + x);
  cu.o1 = sched_ld(a.expert_offset + x + 1);
  cu.n = tok_rows(a, x, cu.o1 - cu.o0);
}
/* order: token tiles only (NULL: experts in index order). */
__host__ __device__ __forceinline__ void gemm_cursor_init(const GemmTileArgs &a, GemmCursor &cu,
                                                          const uint16_t *order = nullptr) {
  cu.e = 0;
  cu.first = 0;
  cu.order = order;
  cursor_bounds(a, cu);
  cu.stagger = a.stagger;
}
/* Expert order of token tiles under tickets (grouped_gemm_kernel, a.expert_order): the
 * experts with most rows first (tok_rows; ties in index order), so that the tile order does
 * not depend on how routing numbers the experts. With the same Zipf counts in a shuffled
 * order of experts, qwen3.5's down launch ran 3% slower in index order than in this one
 * (docs/PERF.md, session 19; gemm.cu expert_order_rule). The rank of expert e: rows holds
 * the experts' tok_rows, padded with -1 to a multiple of 4 (16-byte aligned: the kernel
 * reads it 4 at a time); the same on the host (tests) and in the kernel
 * (grouped_gemm_kernel: a thread an expert). */
constexpr int kOrderMaxExperts = 512; /* more experts: index order (the order's smem is 1 KB) */
__host__ __device__ __forceinline__ int tok_expert_rank(const int *rows, int E, int e) {
  const int r = rows[e];
  int rank = 0;
  for (int j = 0; j < E; j += 4) {
#ifdef __CUDA_ARCH__
    const int4 q = *reinterpret_cast<const int4 *>(rows + j);
#else
    const int4 q = make_int4(rows[j], rows[j + 1], rows[j + 2], rows[j + 3]);
#endif
    rank += (q.x > r || (q.x == r && j < e)) + (q.y > r || (q.y == r && j + 1 < e)) +
            (q.z > r || (q.z == r && j + 2 < e)) + (q.w > r || (q.w == r && j + 3 < e));
  }
  return rank;
}
/* Kinds whose tiles may run in mix order: token tiles, and the data gradients' 128-row
 * tiles; the other row-grouped kinds and the weight gradients never do. */
template <int KIND, int TOK>
__host__ __device__ constexpr bool kind_mixes() {
  return TOK != 0 || KIND == kDownDgrad || KIND == kGateUpDgrad;
}
/* Tiles of the cursor's expert per output block. cls (mix order: token tiles, or with
 * MIX the data gradients' 128-row tiles): -1 every expert; 1 only experts of one tile per
 * output block, 0 only the others (the tiles of an expert of the other class count 0).
 * Other row-grouped kinds never mix: cls is not read (their code as before the data
 * gradients mixed). */
template <int TOK, bool MIX = TOK != 0>
__host__ __device__ __forceinline__ int cursor_row_tiles(const GemmCursor &cu, int tok_units, int cls = -1) {
  if (!TOK && !MIX) return (cu.o1 - cu.o0 + kBM - 1) / kBM;
  const int mt = TOK ? tok_tiles(cu.n, tok_units) : (cu.o1 - cu.o0 + kBM - 1) / kBM;
  return cls < 0 || (mt <= 1) == (cls == 1) ? mt : 0;
}
/* Token tiles in CTA pairs (TOK 2, a cluster of two CTAs that load the operand their
 * tiles share once, by multicast, each CTA half of it): the unit of the schedule is a
 * pair. An expert of mt token tiles per output block has mt / 2 rows of pairs that share
 * the weight block (token tiles 2j and 2j + 1 of one output block: kShareW) and, for odd
 * mt, one row of pairs that share the last token tile's rows (output blocks 2i and
 * 2i + 1: kShareRows). Needs an even number of output blocks (the launcher checks). */
enum { kShareW = 1, kShareRows = 2 };
__host__ __device__ __forceinline__ int pair_units(int mt, int n_tiles) {
  return mt / 2 * n_tiles + (mt & 1) * (n_tiles / 2);
}
/* Schedule units (tiles, or pairs of them under TOK 2) of the cursor's expert. */
template <int TOK, bool MIX = TOK != 0>
__host__ __device__ __forceinline__ int cursor_units(const GemmCursor &cu, int tok_units, int n_tiles, int cls = -1) {
  const int mt = cursor_row_tiles<TOK, MIX>(cu, tok_units, cls);
  return TOK == 2 ? pair_units(mt, n_tiles) : mt * n_tiles;
}
/* Mix order (token tiles under tickets): of T tiles, C belong to experts of one tile per
 * output block, whose tiles stream a whole weight block for <= 176 rows (memory-bound);
 * tile t of the launch is the idx-th tile of class cls, the C spread evenly over the T
 * (Bresenham), so that their weight streaming overlaps the other experts' MMAs instead of
 * coming after them. */
__host__ __device__ __forceinline__ void mix_tile(int t, int T, int C, int &cls, int &idx) {
  const int before = (int)((int64_t)t * C / T), after = (int)((int64_t)(t + 1) * C / T);
  cls = after > before;
  idx = cls ? before : t - before;
}
template <int KIND>
__host__ __device__ __forceinline__ int tok_out_cols() {
  return KIND == kGateUpFwd ? 128 : 256;
}

/* false: t is past the last tile. TOK: token tiles (forward gate+up and down); TOK 2:
 * t is a pair, rank (0 / 1) picks its tile. */
template <int KIND, int BN, int TOK = 0>
__host__ __device__ __forceinline__ bool gemm_decode_tile(const GemmTileArgs &a, GemmCursor &cu, int t,
                                                          TileCoord &c, int cls = -1, int rank = 0) {
  constexpr bool kMix = kind_mixes<KIND, TOK>(); /* cls read */
  const int out_cols = TOK ? tok_out_cols<KIND>() : tile_out_cols<KIND, BN>();
  const int n_tiles = (a.n_out + out_cols - 1) / out_cols;
  if constexpr (KindTraits<KIND>::kWgrad) {
    const int m_tiles = (a.m_w + kBM - 1) / kBM, per_e = m_tiles * n_tiles;
    const int e = t / per_e, r = t - e * per_e;
    if (e >= a.num_experts) return false;
    c.share = 0;
    const int nb = r / m_tiles, mb = r - nb * m_tiles;
    const int o0 = sched_ld(a.expert_offset + e), o1 = sched_ld(a.expert_offset + e + 1);
    c.expert = e;
    c.m0 = mb * kBM;
    c.m_end = a.m_w;
    c.n0 = nb * BN;
    c.k0 = o0;
    c.k_blocks = (o1 - o0) / kBK;
    c.nt = 0;
    c.z_end = c.m_end;
    return true;
  } else {
    while (t < cu.first) { /* step back one expert (a cursor past the end keeps the last one's bounds) */
      if constexpr (TOK != 0) {
        if (cu.e-- < a.num_experts) cursor_bounds(a, cu);
      } else {
        if (cu.e < a.num_experts) {
          cu.o1 = cu.o0;
          cu.o0 = sched_ld(a.expert_offset + cu.e - 1);
        }
        --cu.e;
      }
      cu.first -= cursor_units<TOK, kMix>(cu, tok_units_of(a, cu), n_tiles, cls);
    }
    for (;;) {
      if (cu.e >= a.num_experts) return false;
      const int tiles = cursor_units<TOK, kMix>(cu, tok_units_of(a, cu), n_tiles, cls);
      if (t < cu.first + tiles) break;
      cu.first += tiles;
      if constexpr (TOK != 0) {
        if (++cu.e < a.num_experts) cursor_bounds(a, cu);
      } else if (++cu.e < a.num_experts) {
        cu.o0 = cu.o1;
        cu.o1 = sched_ld(a.expert_offset + cu.e + 1);
      }
    }
    /* raster: groups of `raster` row tiles; in a group, rows fastest (consecutive tiles
     * share a weight block), every output block before the next group, so a hot
     * expert's weights stay in L2 while its rows stream once (an expert of <= raster
     * row tiles: plain output-block-major order) */
    const int mt = cursor_row_tiles<TOK, kMix>(cu, tok_units_of(a, cu), cls), r = t - cu.first;
    int nb, mb;
    c.share = 0;
    if (TOK == 2 && r >= mt / 2 * n_tiles) { /* the odd last token tile: output blocks 2i, 2i + 1 */
      nb = 2 * (r - mt / 2 * n_tiles) + rank;
      mb = mt - 1;
      c.share = kShareRows;
    } else { /* TOK 2: the same over rows of pairs (raster / 2 of them a group) */
      const int m = TOK == 2 ? mt / 2 : mt, ras = TOK == 2 ? (a.raster > 1 ? a.raster / 2 : 1) : a.raster;
      const int gsz = ras * n_tiles, grp = r / gsz, w = r - grp * gsz, g0 = grp * ras;
      const int rows_g = m - g0 < ras ? m - g0 : ras;
      nb = w / rows_g;
      mb = g0 + (w - nb * rows_g);
      if (TOK == 2) {
        mb = 2 * mb + rank;
        c.share = kShareW;
      }
    }
    c.expert = TOK ? cursor_expert(cu, cu.e) : cu.e;
    c.n0 = nb * out_cols;
    c.k0 = 0;
    c.k_blocks = a.k_len / kBK;
    if (TOK) {
      int off, nt;
      tok_tile(cu.n, tok_units_of(a, cu), mb, off, nt);
      c.m0 = cu.o0 + off;
      c.m_end = c.m0 + nt;
      c.nt = nt;
      c.z_end = mb == mt - 1 ? cu.o1 : c.m_end;
    } else {
      c.m0 = cu.o0 + mb * kBM;
      c.m_end = cu.o1;
      c.nt = 0;
      c.z_end = c.m_end;
    }
    return true;
  }
}

/* ---- producer: one thread issues every TMA load of the tile ----------------------- */
/* false: a wait ran out (WaitCtx); nothing more may be issued. */
template <int KIND, int BN>
__device__ bool gemm_tile_produce(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p, WaitCtx &w) {
  using TC = TileConfig<KIND, BN>;
  using KT = KindTraits<KIND>;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  /* a row-grouped tile with 64 rows in its segment loads only those (the consumers never
   * read rows 64-127 of such a stage) */
  const bool tail64 = !KT::kAMn && c.m0 + 64 >= c.m_end;
  const uint32_t stage_tx = TC::kStageBytes - (tail64 ? kChunkBytes : 0);
  for (int kb = 0; kb < c.k_blocks; ++kb) {
    if (!bar_wait(&empty[p.stage], p.phase ^ 1u, w, MOK_WAIT_GEMM_SLOT)) return false; /* consumers freed it */
    uint64_t *bar = &full[p.stage];
    char *sa = smem + p.stage * TC::kStageBytes;
    char *sb = sa + kABytes;
    mbarrier_arrive_expect_tx(bar, stage_tx);
    const int kk = kb * kBK;
    if (KT::kAMn) { /* wgrad: A = rows x M, M contiguous: two 64-wide chunks */
      tma_load_2d(sa, &a.tm_a, bar, c.m0, c.k0 + kk);
      tma_load_2d(sa + kChunkBytes, &a.tm_a, bar, c.m0 + 64, c.k0 + kk);
    } else {
      tma_load_2d(sa, tail64 ? &a.tm_a64 : &a.tm_a, bar, kk, c.m0);
    }
    if (KIND == kGateUpFwd) { /* [E*I, H]: per 64 output columns, 64 gate rows then the same 64 up rows */
      const int row = c.expert * a.b_rows + c.n0;
#pragma unroll
      for (int ch = 0; ch < BN / 128; ++ch) {
        tma_load_2d(sb + ch * 2 * kChunkBytes, &a.tm_b0, bar, kk, row + 64 * ch);
        tma_load_2d(sb + (ch * 2 + 1) * kChunkBytes, &a.tm_b1, bar, kk, row + 64 * ch);
      }
    } else if (KIND == kDownFwd) { /* W_down [E*H, I], K-major */
      tma_load_2d(sb, &a.tm_b0, bar, kk, c.expert * a.b_rows + c.n0);
    } else { /* MN-major B: BN/64 chunks of 64 columns x 64 K-rows */
      const CUtensorMap *map = &a.tm_b0;
      int krow;
      if (KIND == kDownDgrad) {
        krow = c.expert * a.b_rows + kk; /* W_down [E*H, I] read as K = H rows */
      } else if (KIND == kGateUpDgrad) { /* K = [I rows of W_gate | I rows of W_up] */
        const bool up = kk >= a.b_rows;
        map = up ? &a.tm_b1 : &a.tm_b0;
        krow = c.expert * a.b_rows + (up ? kk - a.b_rows : kk);
      } else {
        krow = c.k0 + kk; /* wgrad: x / act rows of the expert */
      }
#pragma unroll
      for (int ch = 0; ch < BN / 64; ++ch) tma_load_2d(sb + ch * kChunkBytes, map, bar, c.n0 + ch * 64, krow);
    }
    pipe_advance<TC::kStages>(p);
  }
  return true;
}

} /* namespace mok_sm90 */

#endif /* MOK_GEMM_TILE_BASE_CUH */
