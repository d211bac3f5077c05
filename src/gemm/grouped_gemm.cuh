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
 * remainder of a 128-row grid), 256 weight rows the M side: see tok_tiles.cuh
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

/* The pieces, in this order: tile_base.cuh (kinds, arguments, waits, schedule, row-grouped
 * producer), tile_epilogue.cuh (row-grouped epilogues and consumer), tok_tiles.cuh (token
 * tiles); this file: the standalone persistent kernel. */
#include "gemm/tok_tiles.cuh" /* defines: tok_tile_produce, tok_tile_consume, gemm_tile_*, GemmCursor */

namespace mok_sm90 {

/* ---- the standalone persistent kernel: one CTA per SM ----------------------------------
 * Tile schedule: either static round-robin (CTA b runs tiles b, b + gridDim.x, ...) or
 * run-time tickets (CTA b runs tile b, then gridDim.x + an atomic ticket from a.sched[0],
 * taken by the producer thread once it has issued the current tile's loads, as the fused
 * FFN's and the megakernel's producers do), by use_tickets below. (Tickets taken from
 * both ends of the tile order, to overlap the least-loaded experts' weight streaming with
 * the most-loaded ones' compute, measured slower under Zipf routing: docs/PERF.md.) Tiles that differ in cost
 * (64-row tail tiles, short weight-gradient tiles) leave SMs idle under round-robin (with
 * 3 m-blocks per expert and 132 SMs a third of the CTAs got every tail tile). Which CTA
 * runs a tile changes nothing in its result (each output is written by one tile, reduced
 * in a fixed order), so results stay bitwise reproducible either way. The producer hands
 * the tile index to both consumer warpgroups through a 4-slot ring in shared memory
 * (sfull: 1 arrival, sempty: 256). The last CTA to finish zeroes a.sched for the next
 * launch (also after a timeout: every CTA still ends). */

/* Experiment (session 45; docs/PERF.md): a compile-time switch for build variants (make
 * B=build-r1 NVCC_GENCODE="-gencode arch=compute_90a,code=sm_90a -DMOK_EXP_MIXREV=1"): in
 * the split mix order, bit 0 hands out the one-tile experts' tiles fewest rows first, bit 1
 * the multi-tile experts' (both classes otherwise walk from most rows to fewest, so both
 * turn from MMA-bound to stream-bound together). 0: the order as measured and kept. */
#ifndef MOK_EXP_MIXREV
#define MOK_EXP_MIXREV 0
#endif

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
          const int tq = (MOK_EXP_MIXREV & 1) && q ? C - 1 - t : (MOK_EXP_MIXREV & 2) && !q ? T - C - 1 - t : t;
          more = t < (q ? C : T - C) && gemm_decode_tile<KIND, BN, TOK>(a, cur[q], tq, c, q, rank);
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
        /* The next tile, now that this one's loads are all issued: a ticket taken here is
         * taken about a ring's depth before its tile can start, so the tiles of one weight
         * block (consecutive tickets) start together and the later ones find its blocks in
         * L2. Taken before this tile's loads (sessions 3-43), a ticket went to a CTA a whole
         * tile before it could start it, and under uneven rows tiles of one block started
         * up to 35 us apart. Measured (docs/PERF.md, session 44, one H100, the parent's
         * binary in turns, two processes each; ours on uneven rows over ours on balanced
         * rows, in turn in one process): gate+up under random routing qwen3.5 R320
         * 0.909 -> 0.96 (0.600 -> 0.556 ms), deepseek-v4-pro R256 0.89-0.92 -> 0.92-0.93
         * (1.83 -> 1.73 ms), kimi and glm -1..-2% a launch; under Zipf 1.2 qwen3.5
         * 0.81-0.84 -> 0.84-0.85, deepseek-v4-pro 0.78 -> 0.81, kimi 0.86 -> 0.88-0.90, glm
         * 0.90 -> 0.92; down level to -3% a launch; balanced launches (static: no tickets)
         * level; the backward kinds (tickets on every launch but row-grouped ones of equal tiles)
         * level to faster: Zipf deepseek-v4-pro dgrad down / gate+up -3% / -4%, wgrad
         * -1..-3%, balanced qwen3.5 R320 dgrad down -2.8%. */
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
        tok_tile_consume<KIND, TOK == 2, kRing, DIAG, true>(a, c, smem, p, w, wg - 1, ebuf);
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
