/*
 * ffn_fwd.cuh — the routed experts' forward in one persistent launch: every gate+up
 * token tile (SwiGLU epilogue, act and optionally g|u stored), then every down token
 * tile, a down tile of expert e starting its loads once every gate+up tile of e has
 * stored its act rows. The tiles are grouped_gemm.cuh's device functions
 * (tok_tile_produce, tok_tile_consume), called by a second persistent kernel with a
 * schedule and a dependency of its own: the compute part of the forward megakernel
 * (docs/MEGAKERNEL.md) without its communication, and one launch instead of two (the
 * gate+up launch's last wave no longer leaves SMs idle: down tiles fill it).
 *
 * The dependency, per expert, in FfnArgs::ready (zero before the launch):
 *  - a consumer warpgroup that ran a gate+up tile of expert e, before it starts its next
 *    tile (or leaves), waits for its TMA stores to complete (cp.async.bulk.wait_group 0:
 *    the global writes done, not only shared memory read), fences them to the generic
 *    proxy and adds 1 to ready[e] (red.release.gpu): 2 per tile, one per warpgroup;
 *  - the producer, before the first load of a down tile of expert e, waits until ready[e]
 *    counts every gate+up tile of e (ld.acquire.gpu; bounded: MOK_WAIT_GEMM_DEP with the
 *    expert in the error word), then fences the async proxy: its TMA loads of act come
 *    after the acquire.
 * Schedule: phase 0 runs the gate+up tiles, phase 1 the down tiles. Phase 0 as the gate+up
 * launch alone would: a static round-robin where its rule says so (balanced experts, with
 * the stagger), else tickets, in the split mix order where it mixes (the one-tile experts'
 * tiles first on CTAs [0, P), each class from its own counter, a CTA whose class ran out
 * takes the other's once). Phase 1 always by tickets (so a CTA that finished its gate+up
 * tiles early takes more down tiles: the gate+up launch's last wave no longer idles), in
 * the split mix order where down mixes.
 * Deadlock-free: a CTA starts phase 1 only once every gate+up tile has been handed out
 * (its static share done, or both classes' counters past their ends), to CTAs that run
 * them without waiting; all CTAs are resident at once (one a SM, at most one wave).
 * Results: bitwise those of mok_gemm_gateup_fwd then mok_gemm_down_fwd (the same tile
 * code, one fixed reduction order an output, whatever tile or CTA computes it).
 * Rings: the down launch's rule (gemm.cu tok_ring_rule) for both kinds: 128-row stages with
 * an epilogue area where every tile is <= 128 rows, else 176-row stages.
 * Not here (yet): CTA pairs, diagnostics (lean instances only), weights of W_up below
 * W_gate (no 4-D box: the two launches then).
 */
#ifndef MOK_GEMM_FFN_FWD_CUH
#define MOK_GEMM_FFN_FWD_CUH

#include "bf16.h"            /* defines: mok_bf16_to_f32, mok_f32_to_bf16 */
#include "comm_device.cuh" /* defines: ld_acquire_gpu_u32, red_release_gpu_add_u32 */
#include "gemm/grouped_gemm.cuh"
#include "route_rows.cuh" /* defines: mok_comb_init, mok_comb_add, mok_comb_pack */
#include "schedule.h"     /* defines: mok_route_decode */

namespace mok_sm90 {

/* The forward megakernel's own part (ffn_fwd_kernel<RING, true>; docs/MEGAKERNEL.md): its
 * last comm_ctas CTAs dispatch the token rows into the gate+up tiles' rows operand, an
 * expert's segment at a time in chunks of kMegaChunk rows (zeros on padding rows), and
 * count them per expert (x_ready); a gate+up tile of expert e waits for all of e's rows.
 * A comm CTA that finished its dispatch joins the down tiles (phase 1, by tickets; it takes
 * no gate+up tile, so every gate+up tile stays with a CTA that never waits on a down tile).
 * The combine (one GPU; out NULL: the layer's own launch after this one): a consumer
 * warpgroup that ran a down tile of expert e counts it in done[e] as a gate+up tile is
 * counted in ready[e]; once a warpgroup has no more tiles, its warps take tokens by
 * tickets, wait until done[] counts every down tile of each expert the token routes to
 * (and of the shared expert where its tiles run in the launch), and sum the token's rows
 * as k_combine_rows does (route_rows.cuh's steps: bitwise its out). The combine is a
 * function of its own (mega_combine, not inlined): inlined into the kernel, its float
 * registers made ptxas serialise every wgmma (C7514; sessions 27-28). */
struct FfnMega {
  const uint4 *src;         /* [T, H] the tokens (row_u4 uint4 a row) */
  uint4 *xg;                /* [capacity, H] the rows operand of gu's tensor maps */
  const int32_t *row_tok;   /* [capacity] the token of each row, -1 on padding rows */
  const int32_t *row_route; /* or (N > 1) [capacity] route ids (s * t_max + t) * topk + j, -1
                               on padding rows: token t of source s, from x_src[s] */
  const uint4 *const *x_src;
  int t_max, topk;
  const int32_t *bad;       /* the schedule refused its input: the launch writes nothing */
  int row_u4;
  int comm_ctas;            /* the grid's last comm_ctas CTAs: the dispatch */
  /* the combine (out NULL: none here); y and cbase are written by this launch's tiles: read
   * through L2 (ld.global.cg) after the acquire of done[] */
  const int32_t *route_row; /* [tokens * topk] each route's row, -1: none */
  const float *topk_w;      /* [tokens * topk] */
  const uint4 *y;           /* [capacity, H] the down tiles' output */
  const uint4 *cbase;       /* [tokens, H] added first, or NULL */
  uint4 *out;               /* [tokens, H] */
  int tokens;
  int cbase_wait;           /* cbase is the shared expert's s_y, stored by the launch's S1 tiles */
  /* expert parallel (row_route): the push of the y rows to their sources' combine slots
   * inside the launch (push 0: the layer's own launch after it); source s's slots lie
   * push_off bytes after its x_src[s] (the window's layout is the same on every rank) */
  int push;
  long long push_off;
};
constexpr int kMegaChunk = 8; /* rows a dispatch ticket (segments are multiples of 64) */

struct FfnArgs {
  GemmTileArgs gu; /* gate+up token tiles (gemm.cu builds both as for their own launches) */
  GemmTileArgs dn; /* down token tiles; the error word, wait budget and schedule knobs
                      read are gu's (the same values); neither sched is used */
  uint32_t *ready; /* [num_experts] gate+up warpgroup tiles stored, then kFfnCounters
                      counters (FfnCtr); all zero before the launch, zeroed again by the
                      last of the CTAs' 3 roles to leave; the megakernel's after them:
                      x_ready[num_experts], the dispatch ticket, a spare */
  FfnMega m;       /* the megakernel only */
};
/* The megakernel's shared expert (I_s = I) as tiles of the launch, a one-expert problem
 * over the tokens: its gate+up tiles (phase S0, before the routed gate+up tiles: its rows
 * are the tokens themselves, so they run while the comm CTAs dispatch) and its down tiles
 * (phase S1, between the routed gate+up and down tiles, each after every S0 tile stored:
 * s_ready), both by tickets of their own. on = 0: the layer ran it before the launch. */
struct FfnShared {
  GemmTileArgs gu, dn;
  int on;
};
/* The megakernel's arguments (ffn_fwd_kernel<RING, true>). */
struct FfnMegaArgs : FfnArgs {
  FfnShared s;
};
template <bool MEGA>
struct FfnParam {
  typedef FfnArgs T;
};
template <>
struct FfnParam<true> {
  typedef FfnMegaArgs T;
};

/* The launch's counters after ready[num_experts]: the next ticket of each phase (0 gate+up,
 * 1 down) and class (0: experts of several tiles an output block, or all experts without
 * the split; 1: the one-tile experts of the split mix order), and the roles that left. */
enum FfnCtr { kCtrTicket = 0, kCtrLeft = 4, kFfnCounters = 8 };
/* The megakernel's counters: x_ready[num_experts], then the dispatch ticket, the tickets of
 * phases S0 and S1, s_ready (the shared expert's gate+up warpgroup tiles stored) and the
 * combine's token ticket, then done[num_experts + 1] (down warpgroup tiles stored, per
 * expert; the shared expert's last). */
__device__ __forceinline__ uint32_t *mega_ctr(const FfnArgs &f) { return f.ready + f.gu.num_experts + kFfnCounters; }
enum MegaCtr { kMegaTicket = 0, kMegaS0 = 1, kMegaS1 = 2, kMegaSReady = 3, kMegaComb = 4, kMegaPush = 5, kMegaCounters = 6 };
/* The megakernel's counters after x_ready (MegaCtr). */
__device__ __forceinline__ uint32_t *mega_aux(const FfnArgs &f) { return mega_ctr(f) + f.gu.num_experts; }
/* done[num_experts + 1], after them (counted where the combine or the push runs in the launch). */
__device__ __forceinline__ uint32_t *mega_done(const FfnArgs &f) { return mega_aux(f) + kMegaCounters; }
/* Words of a launch's counters: the fused launch's, and the megakernel's after them. */
__host__ __device__ constexpr int ffn_counter_words(int num_experts, bool mega) {
  return num_experts + kFfnCounters + (mega ? 2 * num_experts + 1 + kMegaCounters : 0);
}
/* The CTAs that run tiles: all, or (megakernel) all but the comm CTAs, which are the last. */
template <bool MEGA>
__device__ __forceinline__ int ffn_ctas(const FfnArgs &f) {
  if constexpr (MEGA) return (int)gridDim.x - f.m.comm_ctas;
  else return (int)gridDim.x;
}

/* The ring of RING-unit stages (kTokMaxUnits: 176 rows; kTokRing128: 128 rows and an
 * epilogue area, tiles of <= 128 rows), one layout for both kinds. */
template <int RING>
struct FfnRing : TokConfig<kGateUpFwd, RING> {
  static_assert(TokConfig<kGateUpFwd, RING>::kSmemBytes == TokConfig<kDownFwd, RING>::kSmemBytes &&
                    TokConfig<kGateUpFwd, RING>::kStages == TokConfig<kDownFwd, RING>::kStages &&
                    TokConfig<kGateUpFwd, RING>::kBarOffset == TokConfig<kDownFwd, RING>::kBarOffset,
                "gate+up and down token tiles share one ring layout");
};

/* Token tiles of expert e: its routed rows cut into tiles (expert 0 half as large under
 * stagger: tok_units_of at cursor position 0, which is expert 0 where stagger is on, the
 * static schedule, no expert order), times the output blocks. */
template <int KIND>
__device__ __forceinline__ int ffn_expert_tiles(const GemmTileArgs &a, int e, bool stagger) {
  const int seg = __ldg(a.expert_offset + e + 1) - __ldg(a.expert_offset + e);
  const int units = stagger && e == 0 ? (a.tok_units + 1) / 2 : a.tok_units;
  return tok_tiles(tok_rows(a, e, seg), units) * ((a.n_out + tok_out_cols<KIND>() - 1) / tok_out_cols<KIND>());
}
/* All token tiles of a kind, one warp (every lane gets the sum). */
template <int KIND>
__device__ __forceinline__ int ffn_kind_tiles(const GemmTileArgs &a, bool stagger) {
  int t = 0;
  for (int e = threadIdx.x & 31; e < a.num_experts; e += 32) t += ffn_expert_tiles<KIND>(a, e, stagger);
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

/* Until *ctr >= need (ld.acquire.gpu), bounded like bar_wait: on expiry the error word
 * gets MOK_ERRWORD(TIMEOUT, what, rank, where); false once this or another wait failed. */
__device__ __forceinline__ bool ffn_wait_geq(const uint32_t *ctr, uint32_t need, uint32_t what, uint32_t where,
                                             WaitCtx &w) {
  bool ok = ld_acquire_gpu_u32(ctr) >= need;
  if (!ok && !w.dead) {
    const unsigned long long start = globaltimer_u64();
    for (uint32_t ns = 32;; ns = ns < 1024 ? 2 * ns : 1024) {
      if ((ok = ld_acquire_gpu_u32(ctr) >= need)) break;
      if (*reinterpret_cast<volatile unsigned long long *>(w.err) != 0ull) break;
      if (globaltimer_u64() - start > w.timeout_ns) {
        atomicCAS(w.err, 0ull, MOK_ERRWORD(MOK_DEVERR_TIMEOUT, what, w.rank, where));
        __threadfence_system();
        break;
      }
      __nanosleep(ns);
    }
  }
  if (!ok) {
    w.dead = true;
    return false;
  }
  fence_proxy_async_global(); /* the TMA loads after the acquire */
  return true;
}

/* The producer, before a down tile of expert e: every gate+up tile of e stored (both
 * warpgroups' arrivals); then its loads may read act. */
__device__ __forceinline__ bool ffn_wait_gateup(const FfnArgs &f, int e, bool stagger, WaitCtx &w) {
  const uint32_t need = 2u * (uint32_t)ffn_expert_tiles<kGateUpFwd>(f.gu, e, stagger);
  return ffn_wait_geq(f.ready + e, need, MOK_WAIT_GEMM_DEP, (uint32_t)e, w);
}

/* The megakernel's producer, before a gate+up tile of expert e: every row of e's segment
 * dispatched (padding rows as zeros); then its loads may read them. */
__device__ __forceinline__ bool mega_wait_x(const FfnArgs &f, int e, WaitCtx &w) {
  const uint32_t need = (uint32_t)(__ldg(f.gu.expert_offset + e + 1) - __ldg(f.gu.expert_offset + e));
  return ffn_wait_geq(mega_ctr(f) + e, need, MOK_WAIT_MEGA_X, (uint32_t)e, w);
}

/* The counter a gate+up tile of expert e adds to: ready[e], or (the megakernel, e =
 * num_experts) its shared expert's s_ready. */
template <bool MEGA>
__device__ __forceinline__ uint32_t *ffn_ready_ctr(const FfnArgs &f, int e) {
  if constexpr (MEGA) {
    if (e == f.gu.num_experts) return mega_aux(f) + kMegaSReady;
  }
  return f.ready + e;
}

/* A consumer warpgroup's leader, once before its next tile after a gate+up tile of
 * expert e: its stores complete, then counted (see the file's comment). */
__device__ __forceinline__ void ffn_signal(uint32_t *ctr, bool leader) {
  if (!leader) return;
  bulk_wait_group<0>();
  fence_proxy_async_global();
  red_release_gpu_add_u32(ctr, 1u);
}

/* Each of a CTA's three roles (producer, two consumer warpgroups), last thing: the last of
 * the grid's to leave zeroes the ready and ticket counters for the next launch that takes
 * them (nothing reads them any more: every down tile's wait, every arrival and every
 * ticket came before its role left). */
template <bool MEGA = false>
__device__ __forceinline__ void ffn_leave(const FfnArgs &f) {
  __threadfence();
  uint32_t *ctr = f.ready + f.gu.num_experts;
  if (atomicAdd(ctr + kCtrLeft, 1u) == 3u * gridDim.x - 1u) {
    const int n = ffn_counter_words(f.gu.num_experts, MEGA);
    for (int e = 0; e < n; ++e) f.ready[e] = 0u;
    __threadfence();
  }
}

/* The producer's schedule state, in shared memory after the five cursors (it runs on 40
 * registers): per phase k (0 gate+up, 1 down) its tiles T[k], of them C[k] of one-tile
 * experts, and P[k] (> 0: the split mix order's CTAs [0, P) start on those; 0: one class);
 * then the phase, this CTA's class in it and whether it took the other class's tickets. */
struct FfnSched {
  int T[2], C[2], P[2];
  int phase, q, stole;
  int tickets; /* phase 0 by tickets (else static) */
  int next;    /* phase 0, static: this CTA's next tile */
  int sphase;  /* the megakernel's shared expert: 0 in S0, 1 in phase 0, 2 in S1, 3 after */
  int TS[2];   /* its gate+up and down tiles */
};
static_assert(kSchedSlots * kSlotInts * 4 + 5 * (int)sizeof(GemmCursor) + (int)sizeof(FfnSched) +
                      (2 * FfnRing<kTokMaxUnits>::kStages + 2 + 2 * kSchedSlots) * 8 <= FfnRing<kTokMaxUnits>::kBarBytes &&
                  kSchedSlots * kSlotInts * 4 + 5 * (int)sizeof(GemmCursor) + (int)sizeof(FfnSched) +
                          (2 * FfnRing<kTokRing128>::kStages + 2 + 2 * kSchedSlots) * 8 <=
                      FfnRing<kTokRing128>::kBarBytes,
              "the fused kernel's barrier area");

/* Phase k's split (as grouped_gemm_kernel's: mix_counts, one warp), or none. */
template <int KIND>
__device__ __forceinline__ void ffn_phase_counts(const GemmTileArgs &a, bool tickets, bool stagger, int &T, int &C,
                                                 int &P, int grid) {
  T = ffn_kind_tiles<KIND>(a, stagger);
  C = 0, P = 0;
  if (!tickets || !a.mix || a.mix_ctas < 0) return;
  int t = 0;
  mix_counts<KIND, 256, 1>(a, t, C, P, grid);
  if (!(C > 0 && C < T)) C = 0, P = 0;
  else if (a.mix_ctas > 0) P = a.mix_ctas < grid ? a.mix_ctas : grid - 1;
}

/* The producer's next tile: its index in the launch's numbering (gate+up tiles, then down
 * tiles; in a split phase class 0's tiles, then class 1's) and its coordinates; false when
 * both phases are done. Phase 0 under the static schedule walks blockIdx.x + i * grid;
 * every other phase takes tickets of its class (the CTA's class; once that class is done,
 * once the other's; then the next phase). */
template <bool MEGA>
__device__ __forceinline__ bool ffn_next_tile(const FfnArgs &f, GemmCursor *cur, volatile FfnSched *z, int &tnum,
                                             bool &down, TileCoord &c, bool pause0 = false) {
  uint32_t *ctr = f.ready + f.gu.num_experts;
  for (;;) {
    const int k = z->phase;
    if (k > 1) return false;
    const int T = z->T[k], C = z->C[k];
    int idx, cls = -1;
    bool more;
    if (k == 0 && !z->tickets) {
      idx = z->next;
      z->next = idx + ffn_ctas<MEGA>(f);
      more = idx < T;
    } else if (z->P[k] > 0) {
      int q = z->q;
      idx = (int)atomicAdd(ctr + kCtrTicket + 2 * k + q, 1u);
      if (idx >= (q ? C : T - C) && !z->stole) {
        q ^= 1;
        z->q = q, z->stole = 1;
        idx = (int)atomicAdd(ctr + kCtrTicket + 2 * k + q, 1u);
      }
      more = idx < (q ? C : T - C);
      cls = q;
    } else {
      idx = (int)atomicAdd(ctr + kCtrTicket + 2 * k, 1u);
      more = idx < T;
    }
    if (more) {
      down = k == 1;
      more = down ? gemm_decode_tile<kDownFwd, 256, 1>(f.dn, cur[2 + (cls > 0)], idx, c, cls)
                  : gemm_decode_tile<kGateUpFwd, 256, 1>(f.gu, cur[cls > 0], idx, c, cls);
      tnum = (down ? z->T[0] : 0) + (cls == 1 ? T - C : 0) + idx;
      if (more) return true;
    }
    /* the phase is done for this CTA: the next one, in the class the split gives it */
    z->phase = k + 1;
    if (k == 0) z->q = z->P[1] > 0 && (int)blockIdx.x < z->P[1], z->stole = 0;
    if (k == 0 && pause0) return false; /* (pause0: the caller runs phase S1 first) */
  }
}

/* A tile of the megakernel's shared expert by ticket (ctr), total tiles of KIND; false
 * once they are handed out. tnum: base + its index. */
template <int KIND>
__device__ __forceinline__ bool mega_shared_tile(const GemmTileArgs &a, GemmCursor &cu, uint32_t *ctr, int total,
                                                 int base, int &tnum, TileCoord &c) {
  const int idx = (int)atomicAdd(ctr, 1u);
  if (idx >= total) return false;
  if (!gemm_decode_tile<KIND, 256, 1>(a, cu, idx, c, -1)) return false;
  tnum = base + idx;
  return true;
}

/* The megakernel's next tile with its shared expert's phases around the routed ones: S0,
 * routed gate+up (phase 0), S1, routed down (phase 1); sh: a shared tile. cur[4]: the
 * shared expert's cursor (both kinds: one expert, one segment). */
__device__ __forceinline__ bool mega_next_tile(const FfnMegaArgs &f, GemmCursor *cur, volatile FfnSched *z, int &tnum,
                                               bool &down, bool &sh, TileCoord &c) {
  sh = false;
  if (!f.s.on) return ffn_next_tile<true>(f, cur, z, tnum, down, c);
  uint32_t *mc = mega_aux(f);
  const int base = z->T[0] + z->T[1];
  if (z->sphase == 0) {
    if (mega_shared_tile<kGateUpFwd>(f.s.gu, cur[4], mc + kMegaS0, z->TS[0], base, tnum, c)) return down = false, sh = true;
    z->sphase = 1;
  }
  if (z->sphase == 1) {
    if (ffn_next_tile<true>(f, cur, z, tnum, down, c, true)) return true;
    z->sphase = 2;
  }
  if (z->sphase == 2) {
    if (mega_shared_tile<kDownFwd>(f.s.dn, cur[4], mc + kMegaS1, z->TS[1], base + z->TS[0], tnum, c))
      return down = true, sh = true;
    z->sphase = 3;
  }
  return ffn_next_tile<true>(f, cur, z, tnum, down, c);
}

/* ---- the megakernel's comm CTAs ---------------------------------------------------------- */
/* A ticket from *ctr for the whole warp: lane 0 takes it, every lane gets it. */
__device__ __forceinline__ int warp_ticket(uint32_t *ctr) {
  int i = 0;
  if ((threadIdx.x & 31) == 0) i = (int)atomicAdd(ctr, 1u);
  return __shfl_sync(0xffffffffu, i, 0);
}
/* The order position whose chunks hold chunk i (cpre[p]: the chunks before position p, E
 * positions): the last p with cpre[p] <= i (an empty expert's is its successor's). */
__device__ __forceinline__ int mega_chunk_pos(const int *cpre, int E, int i) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cpre[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* A comm CTA's dispatch, every warp: chunks of kMegaChunk rows by tickets, in the order the
 * gate+up tiles take the experts (order: the ranked order, or NULL: index order); where
 * the split mix order runs the one-tile experts (the order's tail) on CTAs of their own
 * from the start (split), even tickets walk the order from its head and odd ones from its
 * tail. A chunk's rows copied (zeros on padding rows), each lane fences its stores to
 * the async proxy (the TMA loads that read them), then lane 0 adds the rows to the
 * expert's x_ready (red.release.gpu). cpre: smem [E + 1]. */
__device__ __forceinline__ void mega_dispatch(const FfnArgs &f, int *cpre, const uint16_t *order, bool split) {
  const GemmTileArgs &a = f.gu;
  const int E = a.num_experts, lane = threadIdx.x & 31, ru = f.m.row_u4;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int p = 0; p < E; ++p) {
      const int e = order ? order[p] : p;
      cpre[p] = n;
      n += (__ldg(a.expert_offset + e + 1) - __ldg(a.expert_offset + e)) / kMegaChunk;
    }
    cpre[E] = n;
  }
  __syncthreads();
  uint32_t *x_ready = mega_ctr(f), *ticket = mega_aux(f) + kMegaTicket;
  const int total = cpre[E];
  for (;;) {
    int i = warp_ticket(ticket);
    if (i >= total) break;
    if (split) i = i & 1 ? total - 1 - (i >> 1) : i >> 1;
    const int lo = mega_chunk_pos(cpre, E, i);
    const int e = order ? order[lo] : lo;
    const int r0 = __ldg(a.expert_offset + e) + (i - cpre[lo]) * kMegaChunk;
    for (int r = r0; r < r0 + kMegaChunk; ++r) {
      int t;
      const uint4 *x = f.m.src;
      if (f.m.row_route) { /* (N > 1: the source's copy of x, a peer's over NVLink) */
        const int q = __ldg(f.m.row_route + r);
        t = q < 0 ? -1 : q / f.m.topk;
        if (t >= 0) {
          const int s = t / f.m.t_max;
          t -= s * f.m.t_max;
          x = f.m.x_src[s];
        }
      } else {
        t = __ldg(f.m.row_tok + r);
      }
      uint4 *d = f.m.xg + (size_t)r * ru;
      if (t < 0) {
        for (int u = lane; u < ru; u += 32) d[u] = make_uint4(0u, 0u, 0u, 0u);
      } else {
        const uint4 *src = x + (size_t)t * ru;
#pragma unroll 4
        for (int u = lane; u < ru; u += 32) d[u] = __ldg(src + u);
      }
    }
    fence_proxy_async_global();
    __threadfence();
    __syncwarp();
    if (lane == 0) red_release_gpu_add_u32(x_ready + e, (uint32_t)kMegaChunk);
  }
}

/* The push (expert parallel, push on), a comm CTA once it dispatched, every warp: chunks of
 * kMegaChunk rows by tickets in the order the down tiles take the experts (cpre and order
 * as mega_dispatch left them in shared memory, from the order's head), a chunk once every
 * down tile of its expert is stored (done[e]; bounded), its routed rows copied to their
 * sources' combine slots, route (s, t, j) to slot t * topk + j of source s (k_ep_push's
 * copy; padding rows skipped). The rows leave while other experts' down tiles still run:
 * the NVLink transfer under the compute. */
__device__ __forceinline__ void mega_push(const FfnArgs &f, const int *cpre, const uint16_t *order) {
  const GemmTileArgs &a = f.gu;
  const int E = a.num_experts, lane = threadIdx.x & 31, ru = f.m.row_u4, k = f.m.topk;
  uint32_t *done = mega_done(f), *ticket = mega_aux(f) + kMegaPush;
  WaitCtx w = wait_ctx(a);
  const int total = cpre[E];
  for (;;) {
    const int i = warp_ticket(ticket);
    if (i >= total) return;
    const int lo = mega_chunk_pos(cpre, E, i);
    const int e = order ? order[lo] : lo;
    bool ok = true;
    if (lane == 0)
      ok = ffn_wait_geq(done + e, 2u * (uint32_t)ffn_expert_tiles<kDownFwd>(f.dn, e, false), MOK_WAIT_MEGA_Y,
                        (uint32_t)e, w);
    if (!__shfl_sync(0xffffffffu, ok, 0)) return; /* (also orders lane 0's acquire before the lanes' loads) */
    const int r0 = __ldg(a.expert_offset + e) + (i - cpre[lo]) * kMegaChunk;
    for (int r = r0; r < r0 + kMegaChunk; ++r) {
      const int q = __ldg(f.m.row_route + r);
      if (q < 0) continue;
      int src, t, j;
      mok_route_decode(q, f.m.t_max, k, &src, &t, &j);
      const uint4 *y = f.m.y + (size_t)r * ru;
      uint4 *d = reinterpret_cast<uint4 *>(reinterpret_cast<char *>(const_cast<uint4 *>(f.m.x_src[src])) +
                                           f.m.push_off) +
                 ((size_t)t * k + j) * ru;
#pragma unroll 4
      for (int u = lane; u < ru; u += 32) d[u] = __ldcg(y + u);
    }
  }
}

/* A comm CTA, every thread: the dispatch; then (the caller) it joins the down tiles, or
 * with the push on it pushes the rows (and runs no tiles). */
template <int ORDER_OFFSET>
__device__ __forceinline__ void mega_comm_cta(const FfnArgs &f, char *smem, bool order_on, bool tickets) {
  int T0, C0, P0; /* (warp 0: the counts are warp-wide) */
  __shared__ int split;
  if (threadIdx.x < 32) {
    ffn_phase_counts<kGateUpFwd>(f.gu, tickets, f.gu.stagger && !tickets, T0, C0, P0, ffn_ctas<true>(f));
    if (threadIdx.x == 0) split = P0 > 0;
  }
  __syncthreads();
  mega_dispatch(f, reinterpret_cast<int *>(smem), order_on ? reinterpret_cast<const uint16_t *>(smem + ORDER_OFFSET)
                                                          : nullptr, split);
  if (f.m.push)
    mega_push(f, reinterpret_cast<const int *>(smem),
              order_on ? reinterpret_cast<const uint16_t *>(smem + ORDER_OFFSET) : nullptr);
  fence_proxy_async_shared(); /* stage 0's generic reads and writes before its first TMA load */
  __syncthreads();
}

/* ---- the megakernel's combine --------------------------------------------------------------- */
/* The expert whose segment holds row r (< expert_offset[E]): the last e with
 * expert_offset[e] <= r (an empty expert's offset is its successor's). */
__device__ __forceinline__ int mega_row_expert(const GemmTileArgs &a, int r) {
  int lo = 0, hi = a.num_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(a.expert_offset + mid) <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* A consumer warpgroup's warps once it has no more tiles (every tile is handed out by
 * then, to CTAs that wait on nothing the combine holds): tokens by tickets (a warp a
 * token, in token order); lane j < topk reads route j and waits until done[] counts its
 * expert's down tiles (lane 0 first the shared expert's, where they run in the launch);
 * then each lane sums 8 columns at a time over the routes in order (k_combine_rows' steps,
 * route_rows.cuh). A failed wait (a timeout, recorded in the error word, or a recorded
 * error) ends the warp's combine, as does dead (one of the warpgroup's waits failed
 * before). Not inlined: see FfnMega. */
__device__ __noinline__ void mega_combine(const FfnMegaArgs &f, bool dead) {
  if (dead) return; /* (a wait of this warpgroup failed: the error word says why) */
  WaitCtx w = wait_ctx(f.gu); /* (built here, not passed: a struct argument costs the kernel a stack frame) */
  const FfnMega &m = f.m;
  const int lane = threadIdx.x & 31, k = m.topk, ru = m.row_u4;
  uint32_t *done = mega_done(f), *ticket = mega_aux(f) + kMegaComb;
  bool ok = true;
  if (m.cbase_wait) {
    const uint32_t need = 2u * (uint32_t)ffn_kind_tiles<kDownFwd>(f.s.dn, false); /* (warp-wide) */
    if (lane == 0) ok = ffn_wait_geq(done + f.gu.num_experts, need, MOK_WAIT_MEGA_Y, (uint32_t)f.gu.num_experts, w);
  }
  if (!__all_sync(0xffffffffu, ok)) return;
  for (;;) {
    const int t = warp_ticket(ticket);
    if (t >= m.tokens) return;
    int r = -1;
    float wt = 0.f;
    if (lane < k) {
      r = __ldg(m.route_row + (size_t)t * k + lane);
      wt = __ldg(m.topk_w + (size_t)t * k + lane);
      if (r >= 0) {
        const int e = mega_row_expert(f.gu, r);
        ok = ffn_wait_geq(done + e, 2u * (uint32_t)ffn_expert_tiles<kDownFwd>(f.dn, e, false), MOK_WAIT_MEGA_Y,
                          (uint32_t)e, w);
      }
    }
    if (!__all_sync(0xffffffffu, ok)) return; /* (also orders the lanes' acquires before every lane's loads) */
    /* two 8-column steps a lane at once (u, u + 32), eight routes' loads in flight before
     * their sums: a warp a token has to keep many loads in flight (the tail's few warps a
     * SM, where k_combine_rows runs T blocks) */
    const uint4 *base = m.cbase ? m.cbase + (size_t)t * ru : nullptr;
    for (int u = lane; u < ru; u += 64) { /* (ru % 32 == 0: H % 256 == 0 for token tiles) */
      const bool two = u + 32 < ru;
      float acc[2][8];
      uint4 b[2];
      if (base) {
        b[0] = __ldcg(base + u);
        if (two) b[1] = __ldcg(base + u + 32);
      }
      mok_comb_init(acc[0], base ? &b[0] : nullptr);
      mok_comb_init(acc[1], base ? &b[1] : nullptr);
      for (int j0 = 0; j0 < k; j0 += 8) {
        int rj[8];
        uint4 v[2][8];
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
          rj[jj] = __shfl_sync(0xffffffffu, r, (j0 + jj) & 31);
          if (j0 + jj < k && rj[jj] >= 0) {
            v[0][jj] = __ldcg(m.y + (size_t)rj[jj] * ru + u);
            if (two) v[1][jj] = __ldcg(m.y + (size_t)rj[jj] * ru + u + 32);
          }
        }
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
          const float wj = __shfl_sync(0xffffffffu, wt, (j0 + jj) & 31);
          if (j0 + jj < k && rj[jj] >= 0) { /* (routes in order: k_combine_rows' sums) */
            mok_comb_add(acc[0], v[0][jj], wj);
            if (two) mok_comb_add(acc[1], v[1][jj], wj);
          }
        }
      }
      m.out[(size_t)t * ru + u] = mok_comb_pack(acc[0]);
      if (two) m.out[(size_t)t * ru + u + 32] = mok_comb_pack(acc[1]);
    }
  }
}

/* RING: the stage ring (FfnRing; gemm_ffn.cu compiles both, nothing else includes the
 * kernel's instances). MEGA: the forward megakernel (FfnMega; the last comm_ctas CTAs are
 * comm CTAs), else the fused routed forward alone. */
template <int RING, bool MEGA = false>
__global__ void __launch_bounds__(kThreads, 1) ffn_fwd_kernel(const __grid_constant__ typename FfnParam<MEGA>::T f) {
  using TC = FfnRing<RING>;
  const GemmTileArgs &gu = f.gu, &dn = f.dn;
  if constexpr (MEGA) {
    if (*reinterpret_cast<const volatile int32_t *>(f.m.bad)) return; /* (the schedule recorded why) */
  }
  extern __shared__ char smem_raw[];
  char *smem = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *sfull = full + 2 * TC::kStages + 2;
  uint64_t *sempty = sfull + kSchedSlots;
  /* slot s: [tile index (-1: no more), expert, m0, m_end, n0, kind (1: down), k_blocks, nt, z_end] */
  volatile int *slot = reinterpret_cast<volatile int *>(sempty + kSchedSlots);
  if (threadIdx.x == 0) gemm_barriers_init<TC::kStages, 2>(full);
  /* tickets where either kind's rule hands tiles out at run time; every warp decides */
  const bool tickets = gu.sched_mode == 2 || (gu.sched_mode == 0 && (use_tickets<kGateUpFwd, 1>(gu) ||
                                                                     use_tickets<kDownFwd, 1>(dn)));
  const bool order_on = tickets && gu.expert_order && gu.expert_count && gu.num_experts > 1 &&
                        gu.num_experts <= kOrderMaxExperts;
  tok_order_experts<TC::kOrderOffset>(gu, smem, order_on);
  bool late = false; /* MEGA: a comm CTA, which joins the down tiles (phase 1) once it dispatched */
  if constexpr (MEGA) {
    if ((int)blockIdx.x >= ffn_ctas<MEGA>(f)) {
      mega_comm_cta<TC::kOrderOffset>(f, smem, order_on, tickets);
      late = true;
    }
  }

  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
  PipeState p = {0, 0u}, sp = {0, 0u};
  TileCoord c;
  WaitCtx w = wait_ctx(gu);
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x >= 32) return;
    const bool stagger = gu.stagger && !tickets;
    GemmCursor *cur = reinterpret_cast<GemmCursor *>(const_cast<int *>(slot + kSlotInts * kSchedSlots));
    volatile FfnSched *z = reinterpret_cast<volatile FfnSched *>(cur + 5); /* (cur[4]: the megakernel's shared expert) */
    {
      int T0, C0, P0, T1, C1, P1; /* (one warp: mix_counts and the tile counts are warp-wide) */
      ffn_phase_counts<kGateUpFwd>(gu, tickets, stagger, T0, C0, P0, ffn_ctas<MEGA>(f));
      ffn_phase_counts<kDownFwd>(dn, true, false, T1, C1, P1, ffn_ctas<MEGA>(f));
      if (threadIdx.x == 0) {
        z->T[0] = T0, z->C[0] = C0, z->P[0] = P0, z->T[1] = T1, z->C[1] = C1, z->P[1] = P1;
        z->phase = late ? (MEGA && f.m.push ? 2 : 1) : 0; /* (a comm CTA that pushed: no tiles) */
        z->q = late ? P1 > 0 && (int)blockIdx.x < P1 : P0 > 0 && (int)blockIdx.x < P0;
        z->stole = 0;
        z->tickets = tickets, z->next = (int)blockIdx.x;
      }
      if constexpr (MEGA) {
        const int ts0 = f.s.on ? ffn_kind_tiles<kGateUpFwd>(f.s.gu, false) : 0;
        const int ts1 = f.s.on ? ffn_kind_tiles<kDownFwd>(f.s.dn, false) : 0;
        if (threadIdx.x == 0) z->TS[0] = ts0, z->TS[1] = ts1, z->sphase = late ? (f.m.push ? 3 : 2) : 0;
      }
    }
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(&gu.tm_aux);
      tma_prefetch_descriptor(&gu.tm_tok);
      tma_prefetch_descriptor(&dn.tm_b0);
      tma_prefetch_descriptor(&dn.tm_tok);
      const uint16_t *order = order_on ? reinterpret_cast<uint16_t *>(smem + TC::kOrderOffset) : nullptr;
      for (int i = 0; i < 4; ++i) gemm_cursor_init(i < 2 ? gu : dn, cur[i], order);
      cur[0].stagger = cur[1].stagger = stagger; /* (gate+up under the static schedule only) */
      cur[2].stagger = cur[3].stagger = 0;
      if constexpr (MEGA) {
        if (f.s.on) gemm_cursor_init(f.s.gu, cur[4]), cur[4].stagger = 0;
      }
      for (;;) {
        int t = -1;
        bool down = false, sh = false;
        bool more;
        if constexpr (MEGA) more = mega_next_tile(f, cur, z, t, down, sh, c);
        else more = ffn_next_tile<MEGA>(f, cur, z, t, down, c);
        w.tile = (uint32_t)sp.stage;
        if (!bar_wait(&sempty[sp.stage], sp.phase ^ 1u, w, MOK_WAIT_GEMM_SCHED)) break;
        volatile int *o = slot + kSlotInts * sp.stage;
        o[0] = more ? t : -1;
        o[1] = c.expert, o[2] = c.m0, o[3] = c.m_end, o[4] = c.n0, o[5] = MEGA ? down | sh << 1 : down;
        o[6] = c.k_blocks, o[7] = c.nt;
        o[8] = c.z_end;
        mbarrier_arrive(&sfull[sp.stage]);
        pipe_advance<kSchedSlots>(sp);
        if (!more) break;
        w.tile = (uint32_t)t;
        if (t == gu.stall_tile) break; /* tests: a load that never comes */
        bool ok = false, routed = true;
        if constexpr (MEGA) {
          if (sh) { /* the shared expert's down tiles wait for all of its gate+up tiles */
            routed = false;
            ok = down ? ffn_wait_geq(mega_aux(f) + kMegaSReady, 2u * (uint32_t)z->TS[0], MOK_WAIT_GEMM_DEP,
                                     (uint32_t)gu.num_experts, w) &&
                            tok_tile_produce<kDownFwd, false, RING, false>(f.s.dn, c, smem, p, w, false)
                      : tok_tile_produce<kGateUpFwd, false, RING, false>(f.s.gu, c, smem, p, w, false);
          }
        }
        if (routed) {
          const bool cold = !down && z->P[0] > 0 && (z->q & 1) && gu.cold_evict; /* (z->q: this tile's class) */
          ok = down ? ffn_wait_gateup(f, c.expert, stagger, w) &&
                          tok_tile_produce<kDownFwd, false, RING, false>(dn, c, smem, p, w, false)
                    : (!MEGA || mega_wait_x(f, c.expert, w)) &&
                          tok_tile_produce<kGateUpFwd, false, RING, false>(gu, c, smem, p, w, cold);
        }
        if (!ok) break;
      }
      ffn_leave<MEGA>(f);
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    const bool leader = (threadIdx.x & 127) == 0;
    /* pend: the counter of this warpgroup's last tile, not yet counted, as an offset from
     * f.ready (-1: none): ready[e] after a gate+up tile (the megakernel's shared expert:
     * s_ready), and in the megakernel with the combine done[e] after a down tile */
    int ebuf = 0, pend = -1;
    for (;;) {
      int t, kind;
      if (!gemm_take_slot(slot, sfull, sempty, sp, w, wg, c, t, kind)) break;
      c.k0 = 0;
      if (pend >= 0) ffn_signal(f.ready + pend, leader);
      pend = -1;
      if (__shfl_sync(0xffffffffu, t, 0) < 0) break;
      w.tile = (uint32_t)t;
      if constexpr (MEGA) {
        /* the shared expert's tiles (kind bit 1) run the same call sites on its own arguments
         * (two call sites a kind spilled a register, or serialised the wgmmas) */
        const GemmTileArgs *ag = &gu, *ad = &dn;
        if (kind & 2) ag = &f.s.gu, ad = &f.s.dn;
        const int e = kind & 2 ? gu.num_experts : c.expert;
        if (kind & 1) {
          tok_tile_consume<kDownFwd, false, RING, false>(*ad, c, smem, p, w, wg - 1, ebuf);
          if (f.m.out || f.m.push) pend = (int)(mega_done(f) - f.ready) + e;
        } else {
          /* (with the rows-as-M 128-row tiles; the fused forward's kernel below spilled with them) */
          tok_tile_consume<kGateUpFwd, false, RING, false, RING == kTokMaxUnits>(*ag, c, smem, p, w, wg - 1, ebuf);
          pend = (int)(ffn_ready_ctr<MEGA>(f, e) - f.ready);
        }
      } else {
        if (kind) {
          tok_tile_consume<kDownFwd, false, RING, false>(dn, c, smem, p, w, wg - 1, ebuf);
        } else {
          tok_tile_consume<kGateUpFwd, false, RING, false>(gu, c, smem, p, w, wg - 1, ebuf);
          pend = c.expert;
        }
      }
    }
    if (pend >= 0) ffn_signal(f.ready + pend, leader); /* (a stopped launch: counted anyway) */
    gemm_consumer_finish();
    if constexpr (MEGA) {
      if (f.m.out) { /* the combine; then the warpgroup together, so that its leader leaves last */
        mega_combine(f, w.dead);
        if (wg == 1) named_barrier_sync<1>(128u);
        else named_barrier_sync<2>(128u);
      }
    }
    if (leader) ffn_leave<MEGA>(f);
  }
}

} /* namespace mok_sm90 */

#endif /* MOK_GEMM_FFN_FWD_CUH */
