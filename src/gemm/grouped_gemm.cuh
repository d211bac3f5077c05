/*
 * grouped_gemm.cuh — the expert GEMM tiles of mok on Hopper: TMA loads into a ring of
 * shared-memory stages, wgmma from shared memory, one producer warpgroup and two
 * consumer warpgroups (warp specialised), epilogues staged in shared memory and written
 * by asynchronous TMA stores.
 *
 * Everything is a device function over one tile, so a persistent megakernel's compute
 * CTAs can run exactly this code for any tile index in a fixed task order:
 *
 *   GemmCursor: a walk over the experts' segment offsets (read from global memory),
 *               moved by gemm_decode_tile, which maps a tile index to a TileCoord and
 *               returns false past the last tile. It steps forward or back one expert
 *               at a time, so indices that move steadily either way are cheapest; any
 *               index works.
 *   gemm_tile_produce<KIND, BN>(args, coord, smem, pipe, wait)  one thread of the producer WG
 *   gemm_tile_consume<KIND, BN>(args, coord, smem, pipe, epi, wait, wg) both consumer WGs
 *   gemm_consumer_finish(): before a consumer warpgroup exits (drains its stores)
 *   PipeState: the ring position; producer and consumers walk the same tile sequence, so
 *              their positions agree. EpiState: a consumer warpgroup's staging state.
 *   WaitCtx: the bounded-wait state of a thread (every mbarrier wait is bounded).
 *
 * Tile: BM = 128 rows (consumer warpgroup wg owns rows wg*64 .. +64), BN output columns
 * (128, 192 or 256; gate+up holds BN/2 outputs as, per 64 outputs, 64 gate then the same
 * 64 up weight rows, so one thread owns g and u of the same element and a 64-row tail
 * tile's half of B is one contiguous block), BK = 64 (one 128-byte swizzle row of bf16).
 * Shared memory: the ring of stages (A 128 x 64, 16 KB, then B BN x 64; K-major operands
 * are one TMA box of 64-element rows, MN-major ones 64-wide MN chunks of 64 K-rows, 8 KB
 * each), then the epilogue area, then the mbarriers. Epilogue area per consumer
 * warpgroup: two 8 KB staging chunks (64 rows x 128 bytes, TMA's 128-byte swizzle) used
 * in turn: the warpgroup writes a chunk with stmatrix, one thread stores it with a TMA
 * store and the warpgroup goes on while the copy runs; a chunk is rewritten only after
 * its previous store has read it. Down dgrad (BN = 128) has four chunks per warpgroup
 * instead: the tile's g and u, loaded by TMA when the tile starts (so the load overlaps
 * the main loop), turned into dg and du in place and stored from there.
 *
 * Row-grouped kinds (forward, dgrad): M = the schedule's rows. The tiles of expert e are
 * ordered n-block major, m-block minor, experts in order, so the CTAs running at one time
 * share the weight block (and the rows) through L2. A tile whose second half lies past
 * the segment end runs on one warpgroup; one warp of the other keeps the ring in step,
 * then that warpgroup meets on named barrier 1 + wg (gemm_tile_consume; the epilogue
 * uses the same barriers): a kernel that embeds these tiles leaves ids 1 and 2 to them.
 * Weight-gradient kinds: M x N = the weight's [out, in], K = expert e's rows, reduced in
 * row order inside one tile (no split-K), so results are bitwise reproducible.
 * Token tiles (forward gate+up when I % 128 == 0, down when H % 256 == 0): the rows are the
 * wgmma N side, cut per expert into 64-160-row tiles that fit the segment (no 64-row
 * remainder of a 128-row grid), 256 weight rows the M side: see "token tiles" below
 * (tok_tile_produce / tok_tile_consume, TokConfig).
 * Token tiles may run in CTA pairs (grouped_gemm_kernel TOK 2, a 2-CTA cluster): the unit
 * of the schedule is then a pair of tiles that share an operand (the weight block, or a
 * tile's rows), loaded half by each CTA and multicast into both; every stage waits for the
 * consumers of both CTAs; CTA 0 takes the pair's tickets and hands them to CTA 1 through a
 * mailbox in shared memory (PairMail). A diagnostic trace (a.trace) records each token
 * tile's start and end (tile_trace_start / tile_trace_end).
 */
#ifndef MOK_GEMM_GROUPED_GEMM_CUH
#define MOK_GEMM_GROUPED_GEMM_CUH

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
 * <= max_units units, or one more where that makes them equal (512 rows: 4 x 128, not
 * 176 + 176 + 160; measured: kimi R341 as 128 + 128 + 96 rows ran 12% slower than as
 * 3 x 128, tiles of unequal cost drifting apart under a static schedule). */
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

/* ---- epilogues ------------------------------------------------------------------------
 * Accumulator d[4j+q] of m64nNk16 holds row warp*16 + lane/4 + 8*(q>>1), column
 * 8*j + 2*(lane%4) + (q&1): for each 8-column group j and row half h, the pair
 * (d[4j+2h], d[4j+2h+1]) is exactly lane's share of an 8x8 stmatrix fragment. A staging
 * chunk holds 64 rows x 128 bytes; 16-byte unit u of row r sits at r*128 + ((u ^ r%8) << 4)
 * (TMA's 128-byte swizzle, so the stores are bank-conflict free and the TMA store reads
 * the layout its map describes). */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __float22bfloat162_rn(make_float2(lo, hi));
  return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

/* __fdividef: a reciprocal and a multiply, not an IEEE division (the epilogue's ALU work
 * runs while the tensor cores wait; the result is rounded to bf16 or multiplied into a
 * bf16 gradient). 1 + e^-x past 2^126 gives 0, sigmoid's limit. */
__device__ __forceinline__ float sigmoid_f(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

/* SwiGLU backward of one value: dg, du from the gradient da of h = silu(g) * u and the saved
 * g, u. LIM: the forward saved a value its limit L cut as +-inf, so the mask is exactly its
 * (the reference's clamp derivative). */
template <bool LIM>
__device__ __forceinline__ void swiglu_bwd(float da, float g, float u, float L, float &dg, float &du) {
  float gc = g, uc = u, gmask = 1.f, umask = 1.f;
  if (LIM && L > 0.f) {
    if (isinf(g)) { gc = L; gmask = 0.f; }
    if (isinf(u)) { uc = u > 0.f ? L : -L; umask = 0.f; }
  }
  const float sg = sigmoid_f(gc);
  dg = da * uc * (sg * (1.f + gc * (1.f - sg))) * gmask;
  du = da * (gc * sg) * umask;
}

__device__ __forceinline__ uint32_t stg_addr(uint32_t chunk, int row, int unit) {
  return chunk + row * 128 + ((unit ^ (row & 7)) << 4);
}
/* Lane's row address for an x4 matrix move of column groups 2jp, 2jp+1 (both row halves)
 * of its warp's 16 rows: matrix m = lane/8 is (half m&1, group 2jp + m/2). */
__device__ __forceinline__ uint32_t x4_addr(uint32_t chunk, int jp) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, m = lane >> 3;
  return stg_addr(chunk, warp * 16 + 8 * (m & 1) + (lane & 7), 2 * jp + (m >> 1));
}
/* Writes 64 bf16 columns: v[jj][h] = packed (row half h, column group jj). */
__device__ __forceinline__ void stage_bf16(uint32_t chunk, const uint32_t (&v)[8][2]) {
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) stmatrix_x4(x4_addr(chunk, jp), v[2 * jp][0], v[2 * jp][1], v[2 * jp + 1][0], v[2 * jp + 1][1]);
}

template <int NA>
__device__ __forceinline__ void pack_groups(const float (&acc)[NA], int j0, uint32_t (&v)[8][2]) {
#pragma unroll
  for (int jj = 0; jj < 8; ++jj)
#pragma unroll
    for (int h = 0; h < 2; ++h) v[jj][h] = pack_bf16x2(acc[4 * (j0 + jj) + 2 * h], acc[4 * (j0 + jj) + 2 * h + 1]);
}

/* Writes 32 fp32 columns = column groups j0 .. j0+3. */
template <int NA>
__device__ __forceinline__ void stage_f32(uint32_t chunk, const float (&acc)[NA], int j0) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, q = lane & 3;
#pragma unroll
  for (int jj = 0; jj < 4; ++jj)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + 8 * h + (lane >> 2);
      st_shared_v2_f32(stg_addr(chunk, row, 2 * jj + (q >> 1)) + (q & 1) * 8, acc[4 * (j0 + jj) + 2 * h],
                       acc[4 * (j0 + jj) + 2 * h + 1]);
    }
}

__device__ __forceinline__ void wg_sync(int wg) {
  if (wg == 0) named_barrier_sync<1>(128u);
  else named_barrier_sync<2>(128u);
}

/* The staging chunk the warpgroup writes next, once the store that last read it is done. */
template <int KIND, int BN>
__device__ __forceinline__ uint32_t epi_acquire(char *smem, const EpiState &st, int wg) {
  if ((threadIdx.x & 127) == 0) bulk_wait_group_read<1>();
  wg_sync(wg);
  return smem_u32(smem + TileConfig<KIND, BN>::kEpiOffset + (wg * TileConfig<KIND, BN>::kEpiChunks + st.buf) * kStgBytes);
}
/* Hands the written chunk to the async proxy and stores it at (c0, c1) of `map`. */
__device__ __forceinline__ void epi_publish(EpiState &st, int wg, const CUtensorMap *map, uint32_t chunk, int c0,
                                            int c1, bool add = false) {
  fence_proxy_async_shared();
  wg_sync(wg);
  if ((threadIdx.x & 127) == 0) {
    if (add) tma_reduce_add_2d(map, chunk, c0, c1); /* (weight gradients summed in place) */
    else tma_store_2d(map, chunk, c0, c1);
    bulk_commit_group();
  }
  st.buf ^= 1;
}

/* The warpgroup's 64 x NC accumulators as bf16, stored 64 columns at a time to (n0, row)
 * of `map` (columns past n_out are not stored). */
template <int KIND, int BN, int NC>
__device__ __forceinline__ void store_bf16_tile(const GemmTileArgs &a, char *smem, EpiState &st, int wg,
                                                const CUtensorMap *map, int n0, int row, const float (&acc)[NC / 2]) {
#pragma unroll
  for (int cc = 0; cc < NC / 64; ++cc) {
    const int col = n0 + 64 * cc;
    if (col >= a.n_out) break;
    uint32_t v[8][2];
    pack_groups(acc, 8 * cc, v);
    const uint32_t ch = epi_acquire<KIND, BN>(smem, st, wg);
    stage_bf16(ch, v);
    epi_publish(st, wg, map, ch, col, row);
  }
}

/* Down dgrad: g and u of the warpgroup's 64 rows x NC columns from (row0, n0) into its
 * aux chunks [g0 g1 u0 u1], issued by the warpgroup leader when the tile starts. */
template <int KIND, int BN, int NC>
__device__ __forceinline__ void aux_load(const GemmTileArgs &a, int row0, int n0, char *smem, int wg) {
  if (KIND != kDownDgrad || (threadIdx.x & 127) != 0) return;
  using TC = TileConfig<KIND, BN>;
  const int nch = min(NC / 64, (a.n_out - n0) / 64);
  if (nch <= 0) return;
  uint64_t *aux = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset) + 2 * TC::kStages + wg;
  char *base = smem + TC::kEpiOffset + wg * TC::kEpiChunks * kStgBytes;
  bulk_wait_group_read<0>(); /* the last tile's stores have read these chunks */
  mbarrier_arrive_expect_tx(aux, (uint32_t)(2 * nch * kStgBytes));
  for (int cc = 0; cc < nch; ++cc) {
    tma_load_2d(base + cc * kStgBytes, &a.tm_aux, aux, n0 + 64 * cc, row0);
    tma_load_2d(base + (2 + cc) * kStgBytes, &a.tm_aux, aux, a.n_out + n0 + 64 * cc, row0);
  }
}

/* The gate+up token tiles' epilogue values (swiglu_pack's arithmetic): LIMIT is a.limit >
 * 0, chosen once a tile (tok_consume_nt), so a launch without a limit runs (and fetches) no
 * clamp code. swiglu_h: h of two outputs; gu_pack: g (lo = -inf) or u (lo = -L) of two, an
 * input past the limit stored as +-inf (the backward's mark of a clamped value). */
__device__ __forceinline__ uint32_t swiglu_h_lim(bool lim, float L, float g0, float g1, float u0, float u1) {
  if (lim) {
    g0 = fminf(g0, L);
    g1 = fminf(g1, L);
    u0 = fminf(fmaxf(u0, -L), L);
    u1 = fminf(fmaxf(u1, -L), L);
  }
  return pack_bf16x2(g0 * sigmoid_f(g0) * u0, g1 * sigmoid_f(g1) * u1);
}
template <bool LIMIT>
__device__ __forceinline__ uint32_t swiglu_h(float L, float g0, float g1, float u0, float u1) {
  return swiglu_h_lim(LIMIT, L, g0, g1, u0, u1);
}
template <bool LIMIT>
__device__ __forceinline__ uint32_t gu_pack(float L, float lo, float x0, float x1) {
  if (!LIMIT) return pack_bf16x2(x0, x1);
  return pack_bf16x2(x0 > L ? INFINITY : x0 < lo ? -INFINITY : x0, x1 > L ? INFINITY : x1 < lo ? -INFINITY : x1);
}

/* Gate+up outputs of two adjacent elements from their g and u (row-grouped tiles: the limit
 * tested at run time): pass 0: act = bf16(silu(g) * u) (clamped); 1: g, 2: u as saved
 * context. With the clamp on, a value the clamp cuts is saved as +-inf, so the backward's
 * mask is exactly this one (mok.h). */
__device__ __forceinline__ uint32_t swiglu_pack(int pass, float L, float g0, float g1, float u0, float u1) {
  if (pass == 1) return L > 0.f ? gu_pack<true>(L, -INFINITY, g0, g1) : gu_pack<false>(L, 0.f, g0, g1);
  if (pass == 2) return L > 0.f ? gu_pack<true>(L, -L, u0, u1) : gu_pack<false>(L, 0.f, u0, u1);
  return swiglu_h_lim(L > 0.f, L, g0, g1, u0, u1);
}

/* The warpgroup's 64 rows x NC accumulator columns, rows from row0 (schedule row, or
 * weight row of expert c.expert), output columns from n0 (gate+up: per 64 outputs, 64
 * gate then the same 64 up columns). LIM (dgrad down): 1 tests the SwiGLU limit per value
 * (a.limit > 0), 0 compiles no limit code (a launch without one; chosen once a tile,
 * gemm_tile_consume). */
template <int KIND, int BN, int NC, int LIM = 1>
__device__ __forceinline__ void gemm_epilogue(const GemmTileArgs &a, const TileCoord &c, char *smem, EpiState &st,
                                              WaitCtx &w, int wg, int row0, int n0, const float (&acc)[NC / 2]) {
  using TC = TileConfig<KIND, BN>;
  const float L = a.limit;
  if (KIND == kGateUpFwd) {
    /* accumulator columns per 64 outputs: 64 gate then the same 64 up (column groups
     * 16cc .. +7 and 16cc + 8 .. +15) */
#pragma unroll
    for (int cc = 0; cc < NC / 128; ++cc) {
      const int col = n0 + 64 * cc;
      if (col >= a.n_out) break;
      /* pass 0: act; 1: g; 2: u (saved context) */
#pragma unroll
      for (int pass = 0; pass < 3; ++pass) {
        if (pass > 0 && !a.save_gu) break;
        uint32_t v[8][2];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int j = 16 * cc + jj;
            v[jj][h] = swiglu_pack(pass, L, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], acc[4 * (j + 8) + 2 * h],
                                   acc[4 * (j + 8) + 2 * h + 1]);
          }
        const uint32_t ch = epi_acquire<KIND, BN>(smem, st, wg);
        stage_bf16(ch, v);
        epi_publish(st, wg, pass == 0 ? &a.tm_out0 : &a.tm_out1, ch, pass == 2 ? a.n_out + col : col, row0);
      }
    }
  } else if (KIND == kDownDgrad) {
    uint64_t *aux = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset) + 2 * TC::kStages + wg;
    const uint32_t base = smem_u32(smem + TC::kEpiOffset + wg * TC::kEpiChunks * kStgBytes);
    const int nch = min(NC / 64, (a.n_out - n0) / 64);
    if (nch <= 0) return; /* nothing loaded (aux_load), nothing to store */
    bar_wait(aux, st.aux_phase, w, MOK_WAIT_GEMM_LOAD); /* g and u of the tile have landed */
    st.aux_phase ^= 1u;
#pragma unroll
    for (int cc = 0; cc < NC / 64; ++cc) {
      if (cc >= nch) break;
      const uint32_t gch = base + cc * kStgBytes, uch = base + (2 + cc) * kStgBytes;
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t gw[4], uw[4], og[4], ou[4];
        ldmatrix_x4(x4_addr(gch, jp), gw);
        ldmatrix_x4(x4_addr(uch, jp), uw);
#pragma unroll
        for (int i = 0; i < 4; ++i) { /* matrix i: row half i&1, column group 8cc + 2jp + i/2 */
          const int j = 8 * cc + 2 * jp + (i >> 1), h = i & 1;
          float dg[2], du[2];
#pragma unroll
          for (int e = 0; e < 2; ++e)
            swiglu_bwd<LIM != 0>(acc[4 * j + 2 * h + e], e ? bf16_hi(gw[i]) : bf16_lo(gw[i]),
                                 e ? bf16_hi(uw[i]) : bf16_lo(uw[i]), L, dg[e], du[e]);
          og[i] = pack_bf16x2(dg[0], dg[1]);
          ou[i] = pack_bf16x2(du[0], du[1]);
        }
        stmatrix_x4(x4_addr(gch, jp), og[0], og[1], og[2], og[3]);
        stmatrix_x4(x4_addr(uch, jp), ou[0], ou[1], ou[2], ou[3]);
      }
    }
    fence_proxy_async_shared();
    wg_sync(wg);
    if ((threadIdx.x & 127) == 0) {
      for (int cc = 0; cc < nch; ++cc) {
        tma_store_2d(&a.tm_out0, base + cc * kStgBytes, n0 + 64 * cc, row0);
        tma_store_2d(&a.tm_out0, base + (2 + cc) * kStgBytes, a.n_out + n0 + 64 * cc, row0);
      }
      bulk_commit_group();
    }
  } else if (KIND == kDownFwd || KIND == kGateUpDgrad) {
    store_bf16_tile<KIND, BN, NC>(a, smem, st, wg, &a.tm_out0, n0, row0, acc);
  } else { /* weight gradients: row0 = first weight row of the warpgroup in expert c.expert */
    const bool second = row0 >= a.m_split;
    const int r = second ? row0 - a.m_split : row0;
    const int rows_out = second ? a.m_w - a.m_split : a.m_split;
    const int orow = c.expert * rows_out + r;
    const CUtensorMap *map = second ? &a.tm_out1 : &a.tm_out0;
    if (a.out_fp32) {
#pragma unroll
      for (int cc = 0; cc < NC / 32; ++cc) {
        const int col = n0 + 32 * cc;
        if (col >= a.n_out) break;
        const uint32_t ch = epi_acquire<KIND, BN>(smem, st, wg);
        stage_f32(ch, acc, 4 * cc);
        epi_publish(st, wg, map, ch, col, orow, a.accumulate != 0);
      }
    } else {
      store_bf16_tile<KIND, BN, NC>(a, smem, st, wg, map, n0, orow, acc);
    }
  }
}

/* ---- consumer ------------------------------------------------------------------------
 * The main loop of one warpgroup: k_blocks stages of A rows at a_off (bytes into the
 * stage) times NC B columns at b_off. Releases each stage once its MMAs are done. */
template <int KIND, int BN, int NC>
__device__ __forceinline__ void mma_loop(char *smem, PipeState &p, WaitCtx &w, int k_blocks, uint32_t a_off,
                                         uint32_t b_off, float (&acc)[NC / 2]) {
  using TC = TileConfig<KIND, BN>;
  using KT = KindTraits<KIND>;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  const bool leader = (threadIdx.x & 127) == 0;
#pragma unroll
  for (int i = 0; i < NC / 2; ++i) acc[i] = 0.f;
  int prev = 0;
  for (int kb = 0; kb < k_blocks; ++kb) {
    bar_wait(&full[p.stage], p.phase, w, MOK_WAIT_GEMM_LOAD);
    /* The stage's two descriptors once, from an address redux.sync leaves in a uniform
     * register: each wgmma's descriptor is then one uniform add (a k16 step moves 2048 bytes
     * MN-major, 32 K-major; in 16-byte descriptor units 128 or 2), not a masked, shifted and
     * moved value per wgmma (docs/PERF.md, session 13). */
    const uint32_t s0 = __reduce_or_sync(0xffffffffu, smem_u32(smem + p.stage * TC::kStageBytes));
    const uint64_t da = wgmma_desc_sw128(s0 + a_off, KT::kAMn ? kChunkBytes : 16, 1024);
    const uint64_t db = wgmma_desc_sw128(s0 + kABytes + b_off, KT::kBMn ? kChunkBytes : 16, 1024);
#pragma unroll
    for (int i = 0; i < NC / 2; ++i) reg_fence(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16)
      wgmma_bf16<NC, KT::kAMn, KT::kBMn>(acc, da + k16 * (KT::kAMn ? 128 : 2), db + k16 * (KT::kBMn ? 128 : 2), 1);
    wgmma_commit_group();
    wgmma_wait_group<1>(); /* the previous stage's MMAs are done: release its slot */
#pragma unroll
    for (int i = 0; i < NC / 2; ++i) reg_fence(acc[i]);
    if (kb > 0) mbarrier_arrive_if(&empty[prev], leader);
    prev = p.stage;
    pipe_advance<TC::kStages>(p);
  }
  wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < NC / 2; ++i) reg_fence(acc[i]);
  if (k_blocks > 0) mbarrier_arrive_if(&empty[prev], leader);
}

/* Row-grouped tiles of BN = 256 (and down dgrad's 128) split a 64-row tail tile by
 * columns: both warpgroups run the same 64 rows, each half of the columns (gate+up: half
 * of the gate and the same half of the up columns), so no warpgroup idles. */
template <int KIND, int BN>
struct SplitTail {
  static constexpr bool kOn = !KindTraits<KIND>::kWgrad && (BN == 256 || KIND == kDownDgrad);
};

/* One tile, both consumer warpgroups (wg = 0, 1), each 64 rows x BN columns; a tail tile
 * (rows past the segment end in the second half) splits by columns or idles the second
 * warpgroup. */
template <int KIND, int BN>
__device__ void gemm_tile_consume(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p,
                                  EpiState &st, WaitCtx &w, int wg) {
  using TC = TileConfig<KIND, BN>;
  using KT = KindTraits<KIND>;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  const bool leader = (threadIdx.x & 127) == 0;
  /* Broadcast so ptxas sees warp-uniform conditions around the wgmmas (otherwise it
   * serialises them, warning C7518). */
  const int k_blocks = __shfl_sync(0xffffffffu, c.k_blocks, 0); /* uniform trip count */
  const bool tail = __shfl_sync(0xffffffffu, (int)(c.m0 + 64 >= c.m_end), 0) != 0;
  if constexpr (SplitTail<KIND, BN>::kOn) {
    if (tail && (KIND == kDownDgrad || a.split_tail)) {
      constexpr int NC = BN / 2;
      float acc[NC / 2];
      int n0;
      /* gate+up: B rows [wg * BN/2, +BN/2) hold the gate and up rows of outputs
       * c.n0 + wg * BN/4 .. +BN/4 (K-major, 128 B a row) */
      n0 = c.n0 + wg * tile_out_cols<KIND, BN>() / 2;
      aux_load<KIND, BN, NC>(a, c.m0, n0, smem, wg);
      mma_loop<KIND, BN, NC>(smem, p, w, k_blocks, 0, KT::kBMn ? wg * (NC / 64) * kChunkBytes : wg * NC * 128, acc);
      if (KIND == kDownDgrad && !(a.limit > 0.f)) gemm_epilogue<KIND, BN, NC, 0>(a, c, smem, st, w, wg, c.m0, n0, acc);
      else gemm_epilogue<KIND, BN, NC>(a, c, smem, st, w, wg, c.m0, n0, acc);
      return;
    }
  }
  if (tail && wg == 1) {
    /* Rows past the segment: keep the ring in step, compute nothing. Only the leader's
     * warp walks the ring. The other three warps are tied to nothing here (no wgmma) and
     * the leader's arrivals let the ring run on without them: a warp still in the
     * previous tile's epilogue could reach full[s] after the stage had been refilled and
     * had landed once more, find the barrier two phases on (same parity, still open),
     * wait for the refill after that, and so run two phases late to the end, where it
     * waits for fills that never come (the kimi Zipf hang). The warpgroup meets at named
     * barrier 1 + wg once the leader's warp has taken the tile's last stage, so all four
     * warps leave the tile at the same ring position. */
    if (((threadIdx.x >> 5) & 3) == 0) {
      for (int kb = 0; kb < k_blocks; ++kb) {
        bar_wait(&full[p.stage], p.phase, w, MOK_WAIT_GEMM_LOAD);
        mbarrier_arrive_if(&empty[p.stage], leader);
        pipe_advance<TC::kStages>(p);
      }
    } else {
      pipe_advance_by<TC::kStages>(p, k_blocks);
    }
    wg_sync(wg);
    return;
  }
  const int row0 = c.m0 + wg * 64;
  aux_load<KIND, BN, BN>(a, row0, c.n0, smem, wg);
  float acc[BN / 2];
  mma_loop<KIND, BN, BN>(smem, p, w, k_blocks, wg * kChunkBytes, 0, acc);
  if (KIND == kDownDgrad && !(a.limit > 0.f)) gemm_epilogue<KIND, BN, BN, 0>(a, c, smem, st, w, wg, row0, c.n0, acc);
  else gemm_epilogue<KIND, BN, BN>(a, c, smem, st, w, wg, row0, c.n0, acc);
}

/* A consumer warpgroup's last step: its TMA stores have finished (global writes done)
 * before the kernel may end. */
__device__ __forceinline__ void gemm_consumer_finish() {
  if ((threadIdx.x & 127) == 0) bulk_wait_group<0>();
}

/* ---- token tiles: produce, consume ----------------------------------------------------
 * Shared memory: a ring of stages [256 weight rows x 64 (32 KB, K-major) | up to 176 rows
 * x 64 (22 KB, K-major; TMA boxes of 32 rows and one of 16 for an odd unit, or with
 * row_box128 boxes of 128 rows first: gate+up's rule)], then the barriers (same layout as
 * TileConfig); the epilogue stages in the tile's last stage. Or (TokConfig kTokRing128,
 * down where every tile is <= 128 rows) stages of 256 + 128 rows and an epilogue area of
 * two 8 KB buffers per consumer warpgroup. Consumer warpgroup wg owns
 * weight rows 128wg .. +128 as two m64 blocks (gate+up: 64 gate rows then the same
 * outputs' 64 up rows), so it runs two wgmma m64nNTk16 per k16 step (NT accumulators a
 * thread). Its epilogue writes [32 rows x 64 outputs] pieces through stmatrix.trans and
 * stores each by TMA (the output maps of token launches have 32-row boxes). */
constexpr int kTokBufBytes = 64 * 128; /* an epilogue buffer: 64 rows x 64 outputs, bf16 */
/* CTA pairs (TOK 2): the ticket mailbox, at the end of each CTA's barrier area: CTA 0's
 * producer takes the pair's tickets and hands each to CTA 1's through two slots (an int
 * and a barrier `full` in CTA 1, a barrier `empty` in CTA 0, one arrival each). */
struct PairMail {
  uint64_t full[2], empty[2];
  int32_t ticket[2];
};
constexpr int kMailOffset = 448;
static_assert(kMailOffset + (int)sizeof(PairMail) <= 488, "ticket mailbox past the barrier area (trace at 488)");

/* RING: the most 16-row units a stage holds. kTokMaxUnits (176 rows): 4 stages of 54 KB,
 * the epilogue stages in the tile's last stage (held until its stores have read it);
 * kTokRing128 (128 rows, tiles cut at <= 8 units): 4 stages of 48 KB and an epilogue area
 * of its own (two 8 KB buffers a consumer warpgroup), so the last stage goes back before
 * the epilogue (cuBLAS's 256 x 128 kernel keeps one too; docs/PERF.md session 14). */
constexpr int kTokRing128 = 8;
/* Whether E experts of these routed-row counts (host memory) all get token tiles of <= 128
 * rows under the 176-row cut (tok_split), so that the 128-row ring cuts none of them
 * smaller (gemm.cu tok_ring_rule). */
__host__ __device__ __forceinline__ bool tok_tiles_fit_ring128(const int32_t *count, int E) {
  for (int e = 0; e < E; ++e) {
    const int n = count[e];
    if (n <= 0) continue;
    const int u = (n + kTokUnit - 1) / kTokUnit, t = tok_split(u, kTokMaxUnits);
    if (t > 0 && (u + t - 1) / t > kTokRing128) return false; /* a tile of more than 128 rows */
  }
  return true;
}
template <int KIND, int RING = kTokMaxUnits>
struct TokConfig {
  static constexpr int kWBytes = 256 * 128;
  static constexpr int kStageBytes = kWBytes + RING * kTokUnit * 128;
  static constexpr int kEpiBytes = RING == kTokMaxUnits ? 0 : 2 * 2 * kTokBufBytes;
  static constexpr int kBarBytes = 512;
  static constexpr int kOrderBytes = 2 * kOrderMaxExperts; /* the expert order (tok_expert_rank) */
  static constexpr int kFit = (kSmemLimit - 1024 - kEpiBytes - kBarBytes - kOrderBytes) / kStageBytes;
  static constexpr int kStages = kFit > 6 ? 6 : kFit;
  static constexpr int kEpiOffset = kStages * kStageBytes;
  static constexpr int kBarOffset = kEpiOffset + kEpiBytes;
  static constexpr int kOrderOffset = kBarOffset + kBarBytes;
  static constexpr int kSmemBytes = 1024 + kOrderOffset + kOrderBytes;
  static_assert(KIND == kGateUpFwd || KIND == kDownFwd || KIND == kDownDgrad,
                "token tiles: forward gate+up and down, down dgrad");
  static_assert(kStageBytes % 1024 == 0 && kStages >= 4, "token tile ring");
  static_assert(2 * kTokBufBytes == kWBytes / 2, "epilogue buffers: a warpgroup's weight rows of a stage");
  static_assert((2 * kStages + 2 + 2 * kSchedSlots) * 8 + kSchedSlots * kSlotInts * 4 + 2 * 32 + 32 <= kMailOffset,
                "barrier area too small");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan too large");
};

/* One thread: the loads of a token tile into the ring. PAIR: this CTA (rank) and the
 * other of its cluster run a pair of tiles; the operand they share (c.share) is loaded
 * half by each, multicast into both, so each CTA's stage receives the same bytes as
 * alone. Every stage waits for both CTAs' consumers (empty counts four arrivals). */
/* Stage clock (diagnostics, a.sclk): the producer stamps each stage (SM clock, low 32
 * bits) when it issues its loads, in 4 words after the mix totals of the barrier area; the
 * first consumer warpgroup's leader, once the stage has landed, adds to a.sclk: [0, 32)
 * issue -> use in 256-cycle bins (the last: more), [32, 64) its own wait on the full barrier
 * in 128-cycle bins, [64] stages, [65] sum issue -> use, [66] sum waits. (A wait starts
 * after the previous stage's MMAs were issued and overlaps them; the clock reads alone
 * take ~100 cycles, so a wait is never 0.) */
constexpr int kSclkWords = 67;
constexpr int kSclkStampInt = kMixWordInt + 4; /* after the 4 mix words */
template <int S>
__device__ __forceinline__ volatile uint32_t *tok_sclk_stamps(char *bars) {
  return reinterpret_cast<volatile uint32_t *>(bars + (2 * S + 2 + 2 * kSchedSlots) * 8) + kSclkStampInt;
}
__device__ __forceinline__ void tok_sclk_record(unsigned long long *o, uint32_t issue, uint32_t t0, uint32_t t1) {
  const uint32_t use = t1 - issue, wait = t1 - t0;
  atomicAdd(o + (use / 256 < 31 ? use / 256 : 31), 1ull);
  atomicAdd(o + 32 + (wait / 128 < 31 ? wait / 128 : 31), 1ull);
  atomicAdd(o + 64, 1ull);
  atomicAdd(o + 65, (unsigned long long)use);
  atomicAdd(o + 66, (unsigned long long)wait);
}

template <int KIND, bool PAIR, int RING = kTokMaxUnits, bool DIAG = true>
__device__ bool tok_tile_produce(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p, WaitCtx &w,
                                 bool cold) {
  using TC = TokConfig<KIND, RING>;
  /* cold: a one-tile expert's tile of the split mix order, its weight block read once:
   * loaded evict-first where a.cold_evict, so it does not push out blocks others reread */
  const bool hint = KIND == kGateUpFwd && cold && a.cold_evict && !PAIR; /* (down: none compiled) */
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  const uint32_t stage_tx = (uint32_t)(TC::kWBytes + c.nt * 128);
  for (int kb = 0; kb < c.k_blocks; ++kb) {
    if (!bar_wait(&empty[p.stage], p.phase ^ 1u, w, MOK_WAIT_GEMM_SLOT)) return false;
    uint64_t *bar = &full[p.stage];
    char *sw = smem + p.stage * TC::kStageBytes;
    char *st = sw + TC::kWBytes;
    if (TokKnobs<DIAG>::sclk(a)) tok_sclk_stamps<TC::kStages>(smem + TC::kBarOffset)[p.stage] = (uint32_t)clock64(); /* before the release */
    mbarrier_arrive_expect_tx(bar, stage_tx);
    const int kk = kb * kBK, row = c.expert * a.b_rows + c.n0;
    const int rank = PAIR ? (int)cluster_ctarank() : 0, n32 = c.nt / 32; /* per stage: few registers */
    const bool share_w = PAIR && !TokKnobs<DIAG>::pair_solo(a) && c.share == kShareW;
    const bool share_rows = PAIR && !TokKnobs<DIAG>::pair_solo(a) && c.share == kShareRows;
    if (share_w) { /* weight half `rank` into both CTAs */
      if (KIND == kGateUpFwd) {
        tma_load_2d_multicast(sw + rank * 2 * kChunkBytes, &a.tm_b0, bar, kk, row + 64 * rank, 3);
        tma_load_2d_multicast(sw + (rank * 2 + 1) * kChunkBytes, &a.tm_b1, bar, kk, row + 64 * rank, 3);
      } else { /* tm_b1: W_down with 128-row boxes */
        tma_load_2d_multicast(sw + rank * (TC::kWBytes / 2), &a.tm_b1, bar, kk, row + 128 * rank, 3);
      }
    } else if (KIND == kGateUpFwd && TokKnobs<DIAG>::gu_boxes(a) == 1) { /* [g 0-63 | u 0-63 | g 64-127 | u 64-127] */
      if (hint) /* (the policy made per load: no 64-bit register held on the producer's 40) */
        tma_load_4d_hint(sw, &a.tm_aux, bar, kk, 0, 0, row / 64, l2_policy_evict_first());
      else tma_load_4d(sw, &a.tm_aux, bar, kk, 0, 0, row / 64);
    } else if (KIND == kGateUpFwd && TokKnobs<DIAG>::gu_boxes(a) == 2) { /* [g | u] of 64 rows, twice */
      tma_load_3d(sw, &a.tm_aux, bar, kk, row, 0);
      tma_load_3d(sw + 2 * kChunkBytes, &a.tm_aux, bar, kk, row + 64, 0);
    } else if (KIND == kGateUpFwd) {
#pragma unroll
      for (int ch = 0; ch < 2; ++ch) {
        tma_load_2d(sw + ch * 2 * kChunkBytes, &a.tm_b0, bar, kk, row + 64 * ch);
        tma_load_2d(sw + (ch * 2 + 1) * kChunkBytes, &a.tm_b1, bar, kk, row + 64 * ch);
      }
    } else if (KIND == kDownDgrad) { /* W_down^T, MN-major: columns n0 + 64 ch of W_down rows kk .. kk+64 */
#pragma unroll
      for (int ch = 0; ch < 4; ++ch)
        tma_load_2d(sw + ch * kChunkBytes, &a.tm_b0, bar, c.n0 + 64 * ch, c.expert * a.k_len + kk);
    } else {
      tma_load_2d(sw, &a.tm_b0, bar, kk, row); /* W_down rows n0 .. n0+256, one box */
    }
    if (share_rows) { /* row boxes b with b % 2 == rank (the odd unit's 16 rows: box n32) */
      for (int b = rank; b < n32; b += 2)
        tma_load_2d_multicast(st + b * 32 * 128, &a.tm_tok, bar, kk, c.m0 + 32 * b, 3);
      if ((c.nt & 16) && (n32 & 1) == rank)
        tma_load_2d_multicast(st + (c.nt - 16) * 128, &a.tm_tok16, bar, kk, c.m0 + c.nt - 16, 3);
    } else {
      int b0 = 0;
      if (TokKnobs<DIAG>::template row_box128<KIND>(a))
        for (; b0 + 128 <= c.nt; b0 += 128) tma_load_2d(st + b0 * 128, &a.tm_tok128, bar, kk, c.m0 + b0);
      for (int b = b0 / 32; b < n32; ++b) tma_load_2d(st + b * 32 * 128, &a.tm_tok, bar, kk, c.m0 + 32 * b);
      if (c.nt & 16) tma_load_2d(st + (c.nt - 16) * 128, &a.tm_tok16, bar, kk, c.m0 + c.nt - 16);
    }
    pipe_advance<TC::kStages>(p);
  }
  return true;
}

/* The epilogue stages its outputs in the tile's last pipeline stage, in the 16 KB of
 * weight rows that only this warpgroup's wgmmas read (so it need not wait for the other
 * warpgroup, whose MMAs go on meanwhile); the stage goes back to the producer once the
 * stores have read it (the producer fills the other stages with the next tile). The 16
 * KB are two 8 KB buffers of up to 64 rows x 64 outputs used in turn (a buffer is
 * rewritten once the store two pieces back has read it). An output block of a tile (64
 * outputs, NT rows) is cut into pieces of 64 rows (176 -> 64 + 64 + 48), written by
 * stmatrix.trans in 16-row groups and stored by TMA in 32-row boxes (and one 16-row box
 * for a tile's odd unit). */
/* Writes 16 rows x 64 outputs at buf as [rows x 64 outputs]: v[jj][h] = packed (output
 * row half h of the warp's 16 rows, row group jj of 8 rows). */
__device__ __forceinline__ void stage_bf16_trans16(uint32_t buf, const uint32_t (&v)[2][2]) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, s = lane >> 3;
  const int row = 8 * (s >> 1) + (lane & 7);
  stmatrix_x4_trans(stg_addr(buf, row, 2 * warp + (s & 1)), v[0][0], v[0][1], v[1][0], v[1][1]);
}

/* A token-tile epilogue piece (rows 16 q0 .. 16 q1 of one 64-output block, staged at b):
 * tok_piece_open waits until the store that last read b is done with it; tok_piece_store,
 * once the warpgroup has staged the piece, stores it in 32-row boxes (and one 16-row box
 * for an odd unit) at column x. */
__device__ __forceinline__ void tok_piece_open(bool leader, int wg) {
  if (leader) bulk_wait_group_read<1>();
  wg_sync(wg);
}
template <bool DIAG = true>
__device__ __forceinline__ void tok_piece_store(const GemmTileArgs &a, const TileCoord &c, uint32_t b, bool leader,
                                                int wg, int q0, int q1, const CUtensorMap *m32,
                                                const CUtensorMap *m16, int x) {
  fence_proxy_async_shared();
  wg_sync(wg);
  if (leader && TokKnobs<DIAG>::epi_debug(a) != 1) {
    for (int q = q0; q + 1 < q1; q += 2) /* 32-row boxes, then the odd unit's 16 */
      tma_store_2d(m32, b + (q - q0) * kTokUnit * 128, x, c.m0 + kTokUnit * q);
    if ((q1 - q0) & 1) tma_store_2d(m16, b + (q1 - 1 - q0) * kTokUnit * 128, x, c.m0 + kTokUnit * (q1 - 1));
    bulk_commit_group();
  }
}

/* Stages rows 16 q0 .. 16 q1 of a piece at b, the values of `mode` (a constant once
 * inlined): 0 h = SwiGLU(x, y), 1 g = x, 2 u = y (gate+up, LIMIT: tok_epilogue_gu), 3 x as
 * it is (down). */
template <int NT, bool LIMIT>
__device__ __forceinline__ void tok_stage_piece(uint32_t b, int q0, int q1, int mode, float L,
                                                const float (&x)[NT / 2], const float (&y)[NT / 2]) {
#pragma unroll
  for (int q = q0; q < q1; ++q) { /* rows 16q .. 16q + 15 */
    uint32_t v[2][2];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 4 * (2 * q + jj) + 2 * h;
        v[jj][h] = mode == 0   ? swiglu_h<LIMIT>(L, x[j], x[j + 1], y[j], y[j + 1])
                   : mode == 1 ? gu_pack<LIMIT>(L, -INFINITY, x[j], x[j + 1])
                   : mode == 2 ? gu_pack<LIMIT>(L, -L, y[j], y[j + 1])
                               : pack_bf16x2(x[j], x[j + 1]);
      }
    stage_bf16_trans16(b + (q - q0) * kTokUnit * 128, v);
  }
}

/* 16 zero rows x 128 bytes at b for the padding rows' stores, once the stores before the
 * last PENDING groups have read b. */
template <int PENDING>
__device__ __forceinline__ void tok_zero_piece(uint32_t b, bool leader, int wg) {
  if (leader) bulk_wait_group_read<PENDING>();
  wg_sync(wg);
  st_shared_zero16(b + (threadIdx.x & 127) * 16);
  fence_proxy_async_shared();
  wg_sync(wg);
}

/* The gate+up token tile's epilogue, pieces of <= 64 rows x 64 outputs: h = SwiGLU(g, u),
 * then (a.save_gu) g and u. Its code is the tile's longest straight line, and most of its
 * stall samples were instruction fetches (docs/PERF.md, session 15): the limit's code is
 * compiled apart (LIMIT; with the limit's test in every value, a 176-row tile's epilogue
 * was ~2300 instructions, ~1500 without). */
template <int NT, bool LIMIT, bool DIAG = true>
__device__ __forceinline__ void tok_epilogue_gu(const GemmTileArgs &a, const TileCoord &c, uint32_t region, int wg,
                                                const float (&acc0)[NT / 2], const float (&acc1)[NT / 2], int &buf) {
  constexpr int kUnits = NT / kTokUnit, kPiece = 4, kPieces = (kUnits + kPiece - 1) / kPiece;
  const float L = a.limit;
  const bool leader = (threadIdx.x & 127) == 0;
  const int col = c.n0 + 64 * wg;
  if (col >= a.n_out) return;
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    if (pass > 0 && !a.save_gu) break;
#pragma unroll
    for (int piece = 0; piece < kPieces; ++piece) {
      const int q0 = piece * kPiece, q1 = q0 + kPiece < kUnits ? q0 + kPiece : kUnits;
      const uint32_t b = region + buf * kTokBufBytes;
      tok_piece_open(leader, wg);
      tok_stage_piece<NT, LIMIT>(b, q0, q1, pass, L, acc0, acc1);
      tok_piece_store<DIAG>(a, c, b, leader, wg, q0, q1, pass == 0 ? &a.tm_out0 : &a.tm_out1,
                      pass == 0 ? &a.tm_out0h : &a.tm_out1h, pass == 2 ? a.n_out + col : col);
      buf ^= 1;
    }
  }
}

/* OWN_AREA: region is the warpgroup's own epilogue area (TokConfig kTokRing128), which
 * outlives the tile: its buffers alternate across tiles (buf), and the stores of a tile
 * are left to drain during the next tile's main loop (a buffer is rewritten once the store
 * that last read it is done; the consumers' exit drains the rest). */
template <int KIND, int NT, bool OWN_AREA = false, bool LIMIT = false, bool DIAG = true>
__device__ __forceinline__ void tok_epilogue(const GemmTileArgs &a, const TileCoord &c, uint32_t region, int wg,
                                             const float (&acc0)[NT / 2], const float (&acc1)[NT / 2], int &ebuf) {
  /* 16-row units of the tile and of its pieces (4: only the last piece may end in a
   * 16-row box) */
  constexpr int kUnits = NT / kTokUnit, kPiece = 4, kPieces = (kUnits + kPiece - 1) / kPiece;
  const bool leader = (threadIdx.x & 127) == 0;
  int buf = OWN_AREA ? ebuf : 0;
  if (TokKnobs<DIAG>::epi_debug(a) == 2) return;
  if constexpr (KIND == kGateUpFwd) {
    tok_epilogue_gu<NT, LIMIT, DIAG>(a, c, region, wg, acc0, acc1, buf);
  } else { /* down: the warpgroup's 128 outputs as two blocks of 64 */
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int col = c.n0 + 128 * wg + 64 * i;
      if (col >= a.n_out) break;
      const float(&acc)[NT / 2] = i ? acc1 : acc0;
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) {
        const int q0 = piece * kPiece, q1 = q0 + kPiece < kUnits ? q0 + kPiece : kUnits;
        const uint32_t b = region + buf * kTokBufBytes;
        tok_piece_open(leader, wg);
        tok_stage_piece<NT, false>(b, q0, q1, 3, 0.f, acc, acc);
        tok_piece_store<DIAG>(a, c, b, leader, wg, q0, q1, &a.tm_out0, &a.tm_out0h, col);
        buf ^= 1;
      }
    }
  }
  if (c.z_end > c.m_end) { /* padding rows past the computed ones: stores of a zeroed piece */
    const uint32_t b = region + buf * kTokBufBytes;
    tok_zero_piece<1>(b, leader, wg);
    if (leader) {
      for (int i = 0; i < (KIND == kGateUpFwd ? 1 : 2); ++i) {
        const int col = c.n0 + (KIND == kGateUpFwd ? 64 * wg : 128 * wg + 64 * i);
        if (col >= a.n_out) break;
        for (int pass = 0; pass < (KIND == kGateUpFwd ? (a.save_gu ? 3 : 1) : 1); ++pass)
          for (int row = c.m_end; row < c.z_end; row += kTokUnit)
            tma_store_2d(pass == 0 ? &a.tm_out0h : &a.tm_out1h, b, pass == 2 ? a.n_out + col : col, row);
      }
      bulk_commit_group();
    }
  }
  if (OWN_AREA) ebuf = buf;
  else if (leader) bulk_wait_group_read<0>(); /* the stage goes back to the producer after this */
}

constexpr int kDdHalf = 2 * kTokUnit * 128; /* a 32-row x 64-column piece of g or u: 4 KB */
/* The leader: g and u of piece p (columns col, 32 rows from row) into buffer p & 1 at rp,
 * once the stores that last read that buffer (piece p - 2's, the last issued) are done. */
__device__ __forceinline__ void tok_dd_load(const GemmTileArgs &a, char *rp, uint64_t *aux, int p, int col,
                                            int row) {
  char *b = rp + (p & 1) * 2 * kDdHalf;
  bulk_wait_group_read<0>();
  mbarrier_arrive_expect_tx(aux, 2 * kDdHalf);
  tma_load_2d(b, &a.tm_aux, aux, col, row);
  tma_load_2d(b + kDdHalf, &a.tm_aux, aux, a.n_out + col, row);
}
/* The down dgrad token tile's epilogue (experiment, mok_gemm_debug_ddown_tok): the
 * accumulators are dA^T (this warpgroup's 128 columns i of I as two m64 blocks x NT rows);
 * dG and dU = SwiGLU'(dA, g, u) go to dgu's columns i and I + i. Pieces of 32 rows x 64
 * columns: g and u of a piece land by TMA (tm_aux, 32-row boxes; prefetched into L2 when
 * the tile started) in 4 KB buffers in the tile's last stage (this warpgroup's 16 KB of
 * weight rows, two pieces in turn), ldmatrix.trans reads them in the accumulators' layout
 * (the inverse of stage_bf16_trans16's stmatrix.trans), dG and dU overwrite them in place
 * and are stored by TMA; the next piece's loads fly meanwhile. aux: this warpgroup's
 * barrier, aux_ph its parity (kept across tiles). */
template <int NT, bool LIM>
__device__ __forceinline__ void tok_epilogue_dd(const GemmTileArgs &a, const TileCoord &c, char *rp, int wg,
                                                uint64_t *aux, WaitCtx &w, const float (&acc0)[NT / 2],
                                                const float (&acc1)[NT / 2], int &aux_ph) {
  constexpr int kUnits = NT / kTokUnit, kPieces = (kUnits + 1) / 2, kHalf = kDdHalf;
  const bool leader = (threadIdx.x & 127) == 0;
  const float L = a.limit;
  const uint32_t region = smem_u32(rp);
  const int col0 = c.n0 + 128 * wg;
  const int nb = col0 >= a.n_out || a.epi_debug == 2 ? 0 : col0 + 64 >= a.n_out ? 1 : 2, np = nb * kPieces;
  if (leader && np > 0) tok_dd_load(a, rp, aux, 0, col0, c.m0);
#pragma unroll
  for (int p = 0; p < 2 * kPieces; ++p) {
    if (p >= np) break;
    const int ib = p / kPieces, q0 = 2 * (p % kPieces), q1 = q0 + 2 < kUnits ? q0 + 2 : kUnits;
    const uint32_t b = region + (p & 1) * 2 * kHalf;
    bar_wait(aux, (uint32_t)aux_ph, w, MOK_WAIT_GEMM_LOAD);
    aux_ph ^= 1;
    wg_sync(wg); /* every thread past this phase before the leader arms the next */
    if (leader && p + 1 < np)
      tok_dd_load(a, rp, aux, p + 1, col0 + 64 * ((p + 1) / kPieces), c.m0 + 2 * kTokUnit * ((p + 1) % kPieces));
    const float(&acc)[NT / 2] = ib ? acc1 : acc0;
#pragma unroll
    for (int q = q0; q < q1; ++q) { /* rows 16q .. 16q + 15 */
      const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, s = lane >> 3;
      const uint32_t ga = stg_addr(b + (q - q0) * kTokUnit * 128, 8 * (s >> 1) + (lane & 7), 2 * warp + (s & 1));
      uint32_t gw[4], uw[4], og[4], ou[4];
      ldmatrix_x4_trans(ga, gw);
      ldmatrix_x4_trans(ga + kHalf, uw);
#pragma unroll
      for (int r = 0; r < 4; ++r) { /* word r: rows group jj = r / 2 of the unit, output half h = r % 2 */
        const int j = 4 * (2 * q + (r >> 1)) + 2 * (r & 1);
        float dg[2], du[2];
#pragma unroll
        for (int e = 0; e < 2; ++e)
          swiglu_bwd<LIM>(acc[j + e], e ? bf16_hi(gw[r]) : bf16_lo(gw[r]), e ? bf16_hi(uw[r]) : bf16_lo(uw[r]), L, dg[e],
                          du[e]);
        og[r] = pack_bf16x2(dg[0], dg[1]);
        ou[r] = pack_bf16x2(du[0], du[1]);
      }
      stmatrix_x4_trans(ga, og[0], og[1], og[2], og[3]);
      stmatrix_x4_trans(ga + kHalf, ou[0], ou[1], ou[2], ou[3]);
    }
    fence_proxy_async_shared();
    wg_sync(wg);
    if (leader) {
      const int col = col0 + 64 * ib;
      for (int h = 0; h < 2; ++h) {
        const uint32_t src = b + h * kHalf;
        const int x = h ? a.n_out + col : col;
        if (q1 - q0 == 2) tma_store_2d(&a.tm_out0, src, x, c.m0 + kTokUnit * q0);
        else tma_store_2d(&a.tm_out0h, src, x, c.m0 + kTokUnit * q0);
      }
      bulk_commit_group();
    }
  }
  if (c.z_end > c.m_end && nb > 0) { /* padding rows past the computed ones: zeros */
    tok_zero_piece<0>(region, leader, wg);
    if (leader) {
      for (int ib = 0; ib < nb; ++ib)
        for (int row = c.m_end; row < c.z_end; row += kTokUnit) {
          tma_store_2d(&a.tm_out0h, region, col0 + 64 * ib, row);
          tma_store_2d(&a.tm_out0h, region, a.n_out + col0 + 64 * ib, row);
        }
      bulk_commit_group();
    }
  }
  if (leader) bulk_wait_group_read<0>(); /* the stage goes back to the producer after this */
}

/* reg_fence on every accumulator of both m64 blocks (keeps the compiler from moving their
 * reads and writes across the asynchronous wgmmas). */
template <int N>
__device__ __forceinline__ void reg_fence_all(float (&x)[N], float (&y)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    reg_fence(x[i]);
    reg_fence(y[i]);
  }
}

/* A consumer warpgroup gives a stage back: to its producer and, in CTA pairs, to the other
 * CTA's (which multicasts into this stage too). */
template <bool PAIR>
__device__ __forceinline__ void tok_release(uint64_t *bar, bool leader) {
  mbarrier_arrive_if(bar, leader);
  if (PAIR) mbarrier_arrive_remote_if(bar, cluster_ctarank() ^ 1u, leader); /* read here: no register kept */
}

template <int KIND, int NT, bool PAIR, int RING = kTokMaxUnits, bool DIAG = true>
__device__ __forceinline__ void tok_consume_nt(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p,
                                               WaitCtx &w, int wg, int k_blocks, int &ebuf) {
  using TC = TokConfig<KIND, RING>;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  const bool leader = (threadIdx.x & 127) == 0;
  float acc0[NT / 2], acc1[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc0[i] = acc1[i] = 0.f;
  int prev = 0;
  unsigned long long *const sclk = TokKnobs<DIAG>::sclk(a);
  const bool clk = sclk && threadIdx.x == 128;
  /* compiled only into tiles of <= kTokEagerMaxRows rows: the larger tiles' loop is untouched */
  const bool eager = NT <= kTokEagerMaxRows && NT <= a.eager_rows;
  if constexpr (KIND == kDownDgrad) { /* the epilogue's g and u into L2 while the tile runs */
    const int col = c.n0 + 128 * wg;
    if (leader && col < a.n_out)
      for (int r = c.m0; r < c.m_end; r += 2 * kTokUnit)
        for (int ib = 0; ib < 2 && col + 64 * ib < a.n_out; ++ib) {
          tma_prefetch_l2_2d(&a.tm_aux, col + 64 * ib, r);
          tma_prefetch_l2_2d(&a.tm_aux, a.n_out + col + 64 * ib, r);
        }
  }
  for (int kb = 0; kb < k_blocks; ++kb) {
    const uint32_t t0 = clk ? (uint32_t)clock64() : 0u;
    bar_wait(&full[p.stage], p.phase, w, MOK_WAIT_GEMM_LOAD);
    if (clk) tok_sclk_record(sclk, tok_sclk_stamps<TC::kStages>(smem + TC::kBarOffset)[p.stage], t0, (uint32_t)clock64());
    const uint32_t sw = smem_u32(smem + p.stage * TC::kStageBytes) + wg * 128 * 128;
    const uint32_t st = smem_u32(smem + p.stage * TC::kStageBytes + TC::kWBytes);
    reg_fence_all(acc0, acc1);
    wgmma_fence();
    if constexpr (KIND == kDownDgrad) { /* A = W_down^T, MN-major: 64-column chunks, a k16 step 16 rows */
#pragma unroll
      for (int k16 = 0; k16 < kBK / 16; ++k16) {
        const uint64_t db = wgmma_desc_sw128(st + k16 * 32, 16, 1024);
        wgmma_bf16<NT, 1, 0>(acc0, wgmma_desc_sw128(sw + k16 * 2048, kChunkBytes, 1024), db, 1);
        wgmma_bf16<NT, 1, 0>(acc1, wgmma_desc_sw128(sw + 64 * 128 + k16 * 2048, kChunkBytes, 1024), db, 1);
      }
    } else {
#pragma unroll
      for (int k16 = 0; k16 < kBK / 16; ++k16) {
        const uint64_t db = wgmma_desc_sw128(st + k16 * 32, 16, 1024);
        wgmma_bf16<NT, 0, 0>(acc0, wgmma_desc_sw128(sw + k16 * 32, 16, 1024), db, 1);
        wgmma_bf16<NT, 0, 0>(acc1, wgmma_desc_sw128(sw + 64 * 128 + k16 * 32, 16, 1024), db, 1);
      }
    }
    wgmma_commit_group();
    if (eager) { /* few rows: the MMAs are short, the stream is bound by loads in flight */
      wgmma_wait_group<0>();
      reg_fence_all(acc0, acc1);
      if (kb + 1 < k_blocks) tok_release<PAIR>(&empty[p.stage], leader); /* the last: the epilogue's */
    } else {
      wgmma_wait_group<1>();
      reg_fence_all(acc0, acc1);
      if (kb > 0) tok_release<PAIR>(&empty[prev], leader);
    }
    prev = p.stage;
    pipe_advance<TC::kStages>(p);
  }
  wgmma_wait_group<0>();
  reg_fence_all(acc0, acc1);
  if constexpr (TC::kEpiBytes > 0) { /* an epilogue area of its own: the stage goes back first */
    if (k_blocks > 0) tok_release<PAIR>(&empty[prev], leader);
    const uint32_t area = smem_u32(smem + TC::kEpiOffset + wg * 2 * kTokBufBytes);
    if constexpr (KIND == kGateUpFwd) { /* (the fused forward's gate+up tiles on this ring) */
      if (a.limit > 0.f) tok_epilogue<KIND, NT, true, true, DIAG>(a, c, area, wg, acc0, acc1, ebuf);
      else tok_epilogue<KIND, NT, true, false, DIAG>(a, c, area, wg, acc0, acc1, ebuf);
    } else {
      tok_epilogue<KIND, NT, true, false, DIAG>(a, c, area, wg, acc0, acc1, ebuf);
    }
  } else {
    /* the last stage's weight rows of this warpgroup stage the epilogue, then it goes back */
    const uint32_t region = smem_u32(smem + prev * TC::kStageBytes + wg * (TC::kWBytes / 2));
    if constexpr (KIND == kDownDgrad) { /* ebuf: this warpgroup's aux parity */
      uint64_t *aux = full + 2 * TC::kStages + wg;
      char *rp = smem + prev * TC::kStageBytes + wg * (TC::kWBytes / 2);
      if (a.limit > 0.f) tok_epilogue_dd<NT, true>(a, c, rp, wg, aux, w, acc0, acc1, ebuf);
      else tok_epilogue_dd<NT, false>(a, c, rp, wg, aux, w, acc0, acc1, ebuf);
    } else if (KIND == kGateUpFwd && a.limit > 0.f) {
      tok_epilogue<KIND, NT, false, true, DIAG>(a, c, region, wg, acc0, acc1, ebuf);
    } else {
      tok_epilogue<KIND, NT, false, false, DIAG>(a, c, region, wg, acc0, acc1, ebuf);
    }
    if (k_blocks > 0) tok_release<PAIR>(&empty[prev], leader);
  }
}

/* One token tile, both consumer warpgroups (wg = 0, 1); PAIR: in a CTA pair; RING: the
 * stage's rows (TokConfig); ebuf: the warpgroup's next epilogue buffer (kTokRing128). */
template <int KIND, bool PAIR, int RING = kTokMaxUnits, bool DIAG = true>
__device__ __forceinline__ void tok_tile_consume(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p, WaitCtx &w,
                                 int wg, int &ebuf) {
  const int k_blocks = __shfl_sync(0xffffffffu, c.k_blocks, 0);
  if constexpr (RING == kTokRing128) { /* tiles of <= 128 rows */
    switch (__shfl_sync(0xffffffffu, c.nt, 0)) {
      case 16: tok_consume_nt<KIND, 16, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
      case 32: tok_consume_nt<KIND, 32, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
      case 48: tok_consume_nt<KIND, 48, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
      case 64: tok_consume_nt<KIND, 64, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
      case 80: tok_consume_nt<KIND, 80, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
      case 96: tok_consume_nt<KIND, 96, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
      case 112: tok_consume_nt<KIND, 112, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
      default: tok_consume_nt<KIND, 128, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    }
    return;
  }
  switch (__shfl_sync(0xffffffffu, c.nt, 0)) {
    case 16: tok_consume_nt<KIND, 16, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 32: tok_consume_nt<KIND, 32, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 48: tok_consume_nt<KIND, 48, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 64: tok_consume_nt<KIND, 64, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 80: tok_consume_nt<KIND, 80, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 96: tok_consume_nt<KIND, 96, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 112: tok_consume_nt<KIND, 112, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 128: tok_consume_nt<KIND, 128, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 144: tok_consume_nt<KIND, 144, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 160: tok_consume_nt<KIND, 160, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    default: tok_consume_nt<KIND, 176, PAIR, kTokMaxUnits, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
  }
}

/* Diagnostics (a.trace): one record per token tile, by the leader of consumer warpgroup 0:
 * [start, end] in %globaltimer ns (start: the tile's slot read; end: after its epilogue),
 * (CTA << 32) | tile index, (expert << 32) | (rows << 16) | output block. The record waits
 * in shared memory (kTraceOffset of the barrier area) while the tile runs: the consumers
 * keep no register for it. */
constexpr int kTraceOffset = 488;
__device__ __forceinline__ void tile_trace_start(const TileCoord &c, char *bars, int t) {
  volatile unsigned long long *s = reinterpret_cast<volatile unsigned long long *>(bars + kTraceOffset);
  s[0] = (unsigned long long)blockIdx.x << 32 | (uint32_t)t;
  s[1] = (unsigned long long)(uint32_t)c.expert << 32 | (uint32_t)c.nt << 16 | (uint32_t)(c.n0 / 128);
  s[2] = globaltimer_u64();
}
__device__ __forceinline__ void tile_trace_end(const GemmTileArgs &a, char *bars) {
  const volatile unsigned long long *s = reinterpret_cast<const volatile unsigned long long *>(bars + kTraceOffset);
  const unsigned long long i = atomicAdd(a.trace, 1ull);
  if (i >= (unsigned long long)a.trace_cap) return;
  unsigned long long *r = a.trace + 1 + 4 * i;
  r[0] = s[2];
  r[1] = globaltimer_u64();
  r[2] = s[0];
  r[3] = s[1];
}

/* ---- the standalone persistent kernel: one CTA per SM ----------------------------------
 * Tile schedule: either static round-robin (CTA b runs tiles b, b + gridDim.x, ...) or
 * run-time tickets (CTA b runs tile b, then gridDim.x + an atomic ticket from a.sched[0],
 * taken by the producer thread one tile ahead), by use_tickets below. (Tickets taken from
 * both ends of the tile order, to overlap the least-loaded experts' weight streaming with
 * the most-loaded ones' compute, measured slower under Zipf routing: docs/PERF.md.) Tiles that differ in cost
 * (64-row tail tiles, short weight-gradient tiles) leave SMs idle under round-robin (with
 * 3 m-blocks per expert and 132 SMs a third of the CTAs got every tail tile). Which CTA
 * runs a tile changes nothing in its result (each output is written by one tile, reduced
 * in a fixed order), so results stay bitwise reproducible either way. The producer hands
 * the tile index to both consumer warpgroups through a 4-slot ring in shared memory
 * (sfull: 1 arrival, sempty: 256). The last CTA to finish zeroes a.sched for the next
 * launch (also after a timeout: every CTA still ends). */

/* The schedule rule, from measurements (docs/PERF.md): tickets for weight gradients
 * (short tiles, K = one expert's rows) and for row-grouped launches whose tiles differ in
 * cost (some segment ends in a 64-row tail tile); static round-robin for row-grouped
 * launches of equal tiles (measured 1-7% faster there). One warp, the same answer in
 * every CTA. */
template <int KIND, int TOK>
__device__ __forceinline__ bool use_tickets(const GemmTileArgs &a) {
  if (KindTraits<KIND>::kWgrad) return true;
  const int lane = threadIdx.x & 31; /* (stagger's smaller tiles of expert 0 do not count) */
  const int32_t rows0 = tok_rows(a, 0, __ldg(a.expert_offset + 1) - __ldg(a.expert_offset));
  bool uneven = false;
  for (int e = lane; e < a.num_experts; e += 32) {
    const int32_t seg = __ldg(a.expert_offset + e + 1) - __ldg(a.expert_offset + e);
    if (TOK) { /* token tiles: experts of different rows, or tiles of different rows */
      const int rows = tok_rows(a, e, seg), u = rows / kTokUnit, n = tok_split(u, a.tok_units);
      uneven |= rows != rows0 || (n > 0 && u % n != 0);
    } else {
      uneven |= (seg & 127) == 64;
    }
  }
  return __any_sync(0xffffffffu, uneven);
}

/* Mix order totals, one warp: T tiles (token tiles; TOK 2: pairs) of the launch, C of them of
 * experts with one tile per output block; P: the split rule's CTAs for those (mix_ctas 0).
 * The rule gives the one-tile experts' tiles the share of the CTAs that their share of the
 * work is, a tile's work counted in rows, except that a one-tile expert's tile costs at
 * least kStreamRows + 48 * 1024 / K rows: alone on its weight block it is bound by how fast
 * one SM streams that block (measured, docs/PERF.md: 48- to 96-row tiles take the time of
 * ~120 rows of MMAs at K = 4096, a larger share at K = 1024 where a tile's fixed costs
 * weigh more). */
constexpr int kStreamRows = 112;
/* (TOK 0: the data gradients' row-grouped launches: an expert of one 128-row tile, a
 * segment of <= 128 rows, streams a whole weight block a tile for its rows alone; its
 * padded rows count, the tile computes them; the same floor.) */
template <int KIND, int BN, int TOK>
__device__ __forceinline__ void mix_counts(const GemmTileArgs &a, int &T, int &C, int &P, int grid = 0) {
  int oc;
  if constexpr (TOK != 0) oc = tok_out_cols<KIND>();
  else oc = tile_out_cols<KIND, BN>();
  const int lane = threadIdx.x & 31, n_tiles = (a.n_out + oc - 1) / oc;
  const int floor_rows = kStreamRows + 48 * 1024 / (a.k_len > 0 ? a.k_len : 1);
  int t = 0, c = 0, ws = 0, wh = 0;
  for (int e = lane; e < a.num_experts; e += 32) {
    const int32_t seg = __ldg(a.expert_offset + e + 1) - __ldg(a.expert_offset + e);
    const int rows = TOK ? tok_rows(a, e, seg) : seg; /* (tickets: no stagger) */
    const int mt = TOK ? tok_tiles(rows, a.tok_units) : (seg + kBM - 1) / kBM;
    t += TOK == 2 ? pair_units(mt, n_tiles) : mt * n_tiles;
    c += mt == 1 ? (TOK == 2 ? n_tiles / 2 : n_tiles) : 0;
    if (mt == 1) ws += n_tiles * (rows > floor_rows ? rows : floor_rows);
    else wh += n_tiles * rows;
  }
  for (int o = 16; o > 0; o >>= 1) {
    t += __shfl_xor_sync(0xffffffffu, t, o);
    c += __shfl_xor_sync(0xffffffffu, c, o);
    ws += __shfl_xor_sync(0xffffffffu, ws, o);
    wh += __shfl_xor_sync(0xffffffffu, wh, o);
  }
  T = t;
  C = c;
  const int g = grid > 0 ? grid : (int)gridDim.x; /* (grid: the CTAs that run tiles, where not all do) */
  P = ws + wh > 0 ? (int)(((int64_t)g * ws + (ws + wh) / 2) / (ws + wh)) : 0;
  P = P < 1 ? 1 : P > g - 1 ? g - 1 : P;
}

/* One thread: the barriers of a persistent GEMM kernel's shared memory from `full`: the
 * ring's full[STAGES] (the producer's arrive.expect_tx) and empty[STAGES] (EMPTY arrivals:
 * one per consumer warpgroup, of both CTAs in pairs), aux[2] (the consumer warpgroups'
 * leaders), then the schedule slots' sfull / sempty [kSchedSlots]; then the fence that
 * makes them visible to the async proxy. */
template <int STAGES, int EMPTY>
__device__ __forceinline__ void gemm_barriers_init(uint64_t *full) {
  uint64_t *empty = full + STAGES, *sfull = empty + STAGES + 2, *sempty = sfull + kSchedSlots;
  for (int s = 0; s < STAGES; ++s) {
    mbarrier_init(&full[s], 1);
    mbarrier_init(&empty[s], EMPTY);
  }
  mbarrier_init(&empty[STAGES], 1);     /* aux[0]: leader of consumer WG 0 */
  mbarrier_init(&empty[STAGES + 1], 1); /* aux[1] */
  for (int s = 0; s < kSchedSlots; ++s) {
    mbarrier_init(&sfull[s], 1);
    mbarrier_init(&sempty[s], kThreads - 128);
  }
  fence_mbarrier_init();
}

/* A consumer warpgroup takes the next schedule slot: waits for it (bounded); false when any
 * of the warpgroup's threads failed (the warpgroup leaves together: its named barrier);
 * else the tile into c, its index into t (-1: no more), word 5 (the tile's k0, or the fused
 * forward's kind) into x5, and the slot goes back to the producer. */
__device__ __forceinline__ bool gemm_take_slot(volatile int *slot, uint64_t *sfull, uint64_t *sempty, PipeState &sp,
                                               WaitCtx &w, int wg, TileCoord &c, int &t, int &x5) {
  w.tile = (uint32_t)sp.stage;
  const bool ok = bar_wait(&sfull[sp.stage], sp.phase, w, MOK_WAIT_GEMM_SCHED);
  const bool stop = wg == 1 ? named_barrier_or<1>(128u, !ok) : named_barrier_or<2>(128u, !ok);
  if (stop) return false;
  const volatile int *o = slot + kSlotInts * sp.stage;
  t = o[0];
  c.expert = o[1], c.m0 = o[2], c.m_end = o[3], c.n0 = o[4], x5 = o[5], c.k_blocks = o[6], c.nt = o[7];
  c.z_end = o[8];
  mbarrier_arrive(&sempty[sp.stage]);
  pipe_advance<kSchedSlots>(sp);
  return true;
}

/* The expert order of token tiles under tickets (order_on), by every thread of the CTA:
 * the experts' tok_rows staged in ring stage 0 (nothing is loaded there yet), then a
 * thread an expert writes it at its rank (tok_expert_rank); the order (uint16) at
 * smem + ORDER_OFFSET. Ends with every thread past a __syncthreads (the barriers'
 * initialisation before it is seen too). */
template <int ORDER_OFFSET>
__device__ __forceinline__ void tok_order_experts(const GemmTileArgs &a, char *smem, bool order_on) {
  int *order_rows = reinterpret_cast<int *>(smem);
  if (order_on)
    for (int e = threadIdx.x; e < (a.num_experts + 3) / 4 * 4; e += kThreads)
      order_rows[e] =
          e < a.num_experts ? tok_rows(a, e, __ldg(a.expert_offset + e + 1) - __ldg(a.expert_offset + e)) : -1;
  __syncthreads();
  if (order_on) {
    uint16_t *o = reinterpret_cast<uint16_t *>(smem + ORDER_OFFSET);
    for (int e = threadIdx.x; e < a.num_experts; e += kThreads)
      o[tok_expert_rank(order_rows, a.num_experts, e)] = (uint16_t)e;
    fence_proxy_async_shared(); /* stage 0's generic reads and writes before its first TMA load */
    __syncthreads();
  }
}

template <bool B, class T, class F>
struct PickType {
  using type = T;
};
template <class T, class F>
struct PickType<false, T, F> {
  using type = F;
};

/* DIAG: the instance with every knob and diagnostic read from the arguments; false only for
 * the forward token tiles alone (TOK 1): the lean instance (TokKnobs). */
template <int KIND, int BN, int TOK, bool DIAG = true>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemm_kernel(const __grid_constant__ GemmTileArgs a) {
  static_assert(DIAG || (TOK == 1 && KIND != kDownDgrad), "lean instances: the forward token tiles alone");
  if constexpr (KIND >= kDownDgrad) /* the backward kinds: a forward the device refused, nothing to write */
    if (a.skip && *(const volatile int32_t *)a.skip) return;
  using K = TokKnobs<DIAG>;
  /* token tiles: BN = 128 picks the ring of 128-row stages (kTokRing128), else 256 */
  constexpr int kRing = TOK != 0 && BN == 128 ? kTokRing128 : kTokMaxUnits;
  using TC = typename PickType<TOK != 0, TokConfig<KIND == kDownFwd || KIND == kDownDgrad ? KIND : kGateUpFwd, kRing>,
                               TileConfig<KIND, BN>>::type;
  extern __shared__ char smem_raw[];
  char *smem = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  uint64_t *sfull = empty + TC::kStages + 2; /* after aux[2] */
  uint64_t *sempty = sfull + kSchedSlots;
  /* slot s: the decoded tile [tile index (-1: no more), expert, m0, m_end, n0, k0,
   * k_blocks, nt, z_end], so the consumers keep no cursor */
  volatile int *slot = reinterpret_cast<volatile int *>(sempty + kSchedSlots);

  PairMail *mail = reinterpret_cast<PairMail *>(smem + TC::kBarOffset + kMailOffset);
  if (threadIdx.x == 0) {
    if (TOK == 2)
      for (int s = 0; s < 2; ++s) {
        mbarrier_init(&mail->full[s], 1);
        mbarrier_init(&mail->empty[s], 1);
      }
    gemm_barriers_init<TC::kStages, TOK == 2 ? 4 : 2>(full);
  }
  /* The expert order (a.expert_order; forward token tiles with counts, under tickets), by
   * every thread: the experts' tok_rows staged in ring stage 0 (nothing is loaded there
   * yet), then a thread an expert writes it at its rank; the order (uint16) after the
   * barrier area. Every warp takes the schedule rule's answer (use_tickets) itself, so that
   * launches under the static schedule (balanced) skip this and its barrier. */
  constexpr bool kOrder = TOK == 1 && KIND != kDownDgrad; /* (the dgrad experiment: no room) */
  bool order_on = false;
  if constexpr (kOrder)
    order_on = a.expert_order && a.expert_count && a.num_experts > 1 && a.num_experts <= kOrderMaxExperts &&
               (a.sched_mode == 2 || (a.sched_mode == 0 && use_tickets<KIND, TOK>(a)));
  if constexpr (kOrder) tok_order_experts<TC::kOrderOffset>(a, smem, order_on);
  else __syncthreads();
  if constexpr (TOK == 2) cluster_sync(); /* the other CTA's barriers exist before anything reaches them */

  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0); /* warp-uniform for ptxas */
  PipeState p = {0, 0u}, sp = {0, 0u};
  TileCoord c;
  WaitCtx w = wait_ctx(a);
  if (wg == 0) {
    setmaxnreg_dec<TOK == 2 ? kPairProducerRegs : kProducerRegs>();
    if (threadIdx.x >= 32) { /* CTA pairs: every thread takes part in the final cluster_sync */
      if constexpr (TOK == 2) cluster_sync();
      return;
    }
    const bool tickets = a.sched_mode == 2 || (a.sched_mode == 0 && use_tickets<KIND, TOK>(a));
    int mix_T = 0, mix_C = 0, mix_P = 0;
    if (kind_mixes<KIND, TOK>() && a.mix && tickets) /* (token tiles: counted as the forward kind's) */
      mix_counts<!TOK ? KIND : KIND == kDownFwd || KIND == kDownDgrad ? kDownFwd : kGateUpFwd, BN, TOK>(a, mix_T, mix_C,
                                                                                                     mix_P);
    const bool mix = mix_C > 0 && mix_C < mix_T;
    const uint16_t *order = nullptr; /* the expert order, ranked at the start (order_on) */
    if constexpr (kOrder) order = order_on ? reinterpret_cast<uint16_t *>(smem + TC::kOrderOffset) : nullptr;
    /* the totals live in shared memory after the cursors (the producer runs on 40 registers) */
    volatile int *mix_tc = slot + kMixWordInt;
    if (threadIdx.x == 0) mix_tc[0] = mix_T, mix_tc[1] = mix_C;
    /* split mix order (mix_ctas >= 0; token tiles alone, not pairs, or the data
     * gradients' 128-row tiles): CTAs [0, P) run
     * the one-tile experts' tiles, the others the rest, each class from its own counter
     * (sched[2], sched[0]); a CTA whose class ran out takes the other's. mix_tc[2] = P (0:
     * Bresenham order), mix_tc[3] = the CTA's class (bit 0) | took the other's (bit 1). */
    if (threadIdx.x == 0) {
      const int P = TOK == 2 || !mix || a.mix_ctas < 0 ? 0 : a.mix_ctas ? a.mix_ctas : mix_P;
      mix_tc[2] = P > 0 && P < (int)gridDim.x ? P : 0;
      mix_tc[3] = mix_tc[2] && (int)blockIdx.x < mix_tc[2]; /* (by SM number, or spread: level) */
    }
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(&a.tm_a);
      tma_prefetch_descriptor(&a.tm_b0);
      tma_prefetch_descriptor(&a.tm_b1);
      tma_prefetch_descriptor(TOK ? &a.tm_tok : &a.tm_a64);
      if (TOK) tma_prefetch_descriptor(&a.tm_tok16);
      /* the cursor lives in shared memory (after the slots): the producer runs on 40
       * registers */
      GemmCursor *cur = reinterpret_cast<GemmCursor *>(const_cast<int *>(slot + kSlotInts * kSchedSlots));
      GemmCursor &cu = cur[0];
      gemm_cursor_init(a, cur[0], order);
      gemm_cursor_init(a, cur[1], order);
      cur[0].stagger = cur[1].stagger = a.stagger && !tickets;
      /* TOK 2: t numbers pairs, one per cluster at a time; both CTAs decode the same t */
      const int units = TOK == 2 ? (int)gridDim.x / 2 : (int)gridDim.x;
      int mails = 0; /* tickets through the mailbox so far (slot mails & 1, parity mails >> 1 & 1) */
      for (int t = mix_tc[2] ? atomicAdd(&a.sched[mix_tc[3] ? 2 : 0], 1) : TOK == 2 ? (int)blockIdx.x / 2
                                                                                  : (int)blockIdx.x;;) {
        const int rank = TOK == 2 ? (int)cluster_ctarank() : 0;
        bool more;
        if (mix_tc[2]) { /* t: index in class q; past its end, once, the other class's next ticket */
          const int T = mix_tc[0], C = mix_tc[1];
          int q = mix_tc[3] & 1;
          if (t >= (q ? C : T - C) && mix_tc[3] < 2) {
            q ^= 1;
            mix_tc[3] = 2 | q;
            t = atomicAdd(&a.sched[q ? 2 : 0], 1);
          }
          more = t < (q ? C : T - C) && gemm_decode_tile<KIND, BN, TOK>(a, cur[q], t, c, q, rank);
        } else if (mix) { /* two cursors: one per class */
          int cls = 0, idx = 0;
          const int T = mix_tc[0];
          if ((more = t < T)) {
            mix_tile(t, T, mix_tc[1], cls, idx);
            more = gemm_decode_tile<KIND, BN, TOK>(a, cur[cls], idx, c, cls, rank);
          }
        } else {
          more = gemm_decode_tile<KIND, BN, TOK>(a, cu, t, c, -1, rank);
        }
        w.tile = (uint32_t)sp.stage;
        if (!bar_wait(&sempty[sp.stage], sp.phase ^ 1u, w, MOK_WAIT_GEMM_SCHED)) break;
        volatile int *o = slot + kSlotInts * sp.stage;
        const int tnum = mix_tc[2] && !(mix_tc[3] & 1) ? mix_tc[1] + t : t; /* mix_ctas: one-tile experts' first */
        o[0] = more ? tnum : -1;
        o[1] = c.expert, o[2] = c.m0, o[3] = c.m_end, o[4] = c.n0, o[5] = c.k0, o[6] = c.k_blocks, o[7] = c.nt;
        o[8] = c.z_end;
        mbarrier_arrive(&sfull[sp.stage]); /* release: the consumers read the slot after their wait */
        pipe_advance<kSchedSlots>(sp);
        if (!more) break;
        int next = t + units;
        if (mix_tc[2]) {
          next = atomicAdd(&a.sched[(mix_tc[3] & 1) ? 2 : 0], 1);
        } else if (tickets) {
          if (TOK != 2) {
            next = units + atomicAdd(&a.sched[0], 1);
          } else { /* CTA 0 takes the pair's ticket and hands it to CTA 1 */
            const int ms = mails & 1;
            const uint32_t mph = (uint32_t)(mails >> 1) & 1u;
            int v;
            if (cluster_ctarank() == 0) {
              v = atomicAdd(&a.sched[0], 1);
              if (!bar_wait(&mail->empty[ms], mph ^ 1u, w, MOK_WAIT_GEMM_SCHED)) break;
              st_shared_remote_u32(&mail->ticket[ms], 1u, (uint32_t)v);
              mbarrier_arrive_remote_if<true>(&mail->full[ms], 1u, 1);
            } else {
              if (!bar_wait<true>(&mail->full[ms], mph, w, MOK_WAIT_GEMM_SCHED)) break;
              v = *reinterpret_cast<volatile int32_t *>(&mail->ticket[ms]);
              mbarrier_arrive_remote_if(&mail->empty[ms], 0u, 1);
            }
            ++mails;
            next = units + v;
          }
        }
        w.tile = (uint32_t)tnum;
        if (tnum == a.stall_tile) break; /* tests: a load that never comes */
        bool ok;
        if constexpr (TOK != 0) { /* cold: a one-tile expert's tile (split mix order, gate+up alone) */
          const bool cold = KIND == kGateUpFwd && TOK == 1 && mix_tc[2] && (mix_tc[3] & 1);
          ok = tok_tile_produce<KIND, TOK == 2, kRing, DIAG>(a, c, smem, p, w, cold);
        } else {
          ok = gemm_tile_produce<KIND, BN>(a, c, smem, p, w);
        }
        if (!ok) break;
        t = next;
      }
      __threadfence(); /* this CTA's tickets come before its finish count */
      if (atomicAdd(&a.sched[1], 1) == (int)gridDim.x - 1) { /* every CTA took its last ticket */
        atomicExch(&a.sched[0], 0);
        atomicExch(&a.sched[1], 0);
        atomicExch(&a.sched[2], 0);
      }
    }
  } else {
    setmaxnreg_inc<TOK == 2 ? kPairConsumerRegs : kConsumerRegs>();
    EpiState st = {0, 0u};
    int ebuf = 0; /* token tiles with an epilogue area of their own: its next buffer; down
                     dgrad token tiles: the parity of this warpgroup's aux barrier */
    for (;;) {
      int t;
      if (!gemm_take_slot(slot, sfull, sempty, sp, w, wg, c, t, c.k0)) break;
      if (__shfl_sync(0xffffffffu, t, 0) < 0) break; /* uniform loop exit for ptxas */
      w.tile = (uint32_t)t;
      if constexpr (TOK != 0) {
        if (K::trace(a) && threadIdx.x == 128) tile_trace_start(c, smem + TC::kBarOffset, t);
        tok_tile_consume<KIND, TOK == 2, kRing, DIAG>(a, c, smem, p, w, wg - 1, ebuf);
        if (K::trace(a) && threadIdx.x == 128) tile_trace_end(a, smem + TC::kBarOffset);
      }
      else gemm_tile_consume<KIND, BN>(a, c, smem, p, st, w, wg - 1);
    }
    gemm_consumer_finish();
  }
  /* CTA pairs: neither CTA leaves while the other may still arrive on its barriers */
  if constexpr (TOK == 2) cluster_sync();
}

} /* namespace mok_sm90 */

#endif /* MOK_GEMM_GROUPED_GEMM_CUH */
