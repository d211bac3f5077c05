/*
 * tok_tiles.cuh — the forward token tiles (rows as the wgmma N side, 256 weight rows as M):
 * their ring (TokConfig), producer (tok_tile_produce), epilogues and consumer
 * (tok_tile_consume), CTA pairs' mailbox, stage clock and tile trace. grouped_gemm.cuh has
 * the whole picture.
 */
#ifndef MOK_GEMM_TOK_TILES_CUH
#define MOK_GEMM_TOK_TILES_CUH

#include "gemm/tile_epilogue.cuh" /* defines: swiglu_h, stage_bf16, mma_loop, gemm_consumer_finish */

namespace mok_sm90 {

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

/* Token tiles of exactly 128 rows with the rows as wgmma M (a.rows_m; docs/PERF.md,
 * sessions 41-42; gate+up on the 176-row ring, down on the 128-row ring): each warpgroup
 * multiplies its 64 rows by all 256 weight rows of the stage, one m64n256k16 a k16 step,
 * where the rows as N (tok_consume_nt) take two m64n128k16, each reading the tile's 128
 * rows again: per k16 step the SM's shared-memory reads drop from 24 to 20 KB. The stage
 * is the token tiles' (256 weight rows, then the rows), so the producer does not change;
 * the accumulators are [64 rows x 256 weight rows] as in the row-grouped tiles (gate+up:
 * per 64 outputs 64 gate, then the same 64 up columns), staged without a transpose and
 * stored as two 32-row boxes. On the 176-row ring both warpgroups read every weight row of
 * the last stage, so they meet (named barrier 3) before either stages its epilogue in its
 * half of that stage's weight rows; the 128-row ring's epilogue area lets the stage go
 * back first. */
/* One 64-row x 64-column piece of a rows-as-M tile's outputs (v: packed bf16) staged at
 * buffer `buf` of region and stored at (x, row0) of `map` as two 32-row boxes. */
template <bool DIAG>
__device__ __forceinline__ void tok_rows_m_piece(const GemmTileArgs &a, uint32_t region, int &buf, bool leader, int wg,
                                                 const uint32_t (&v)[8][2], const CUtensorMap *map, int x, int row0) {
  const uint32_t b = region + buf * kTokBufBytes;
  tok_piece_open(leader, wg);
  stage_bf16(b, v);
  fence_proxy_async_shared();
  wg_sync(wg);
  if (leader && TokKnobs<DIAG>::epi_debug(a) != 1) {
    tma_store_2d(map, b, x, row0);
    tma_store_2d(map, b + 2 * kTokUnit * 128, x, row0 + 2 * kTokUnit);
    bulk_commit_group();
  }
  buf ^= 1;
}

template <int KIND, bool LIMIT, bool DIAG, bool OWN_AREA>
__device__ __forceinline__ void tok_epilogue_rows_m(const GemmTileArgs &a, const TileCoord &c, uint32_t region,
                                                    int wg, const float (&acc)[128], int &ebuf) {
  const float L = a.limit;
  const bool leader = (threadIdx.x & 127) == 0;
  const int row0 = c.m0 + 64 * wg;
  if (TokKnobs<DIAG>::epi_debug(a) == 2) return;
  int buf = OWN_AREA ? ebuf : 0;
  if constexpr (KIND == kGateUpFwd) {
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) { /* outputs c.n0 + 64 cc: gate groups 16 cc .. +7, up 16 cc + 8 .. +15 */
      const int col = c.n0 + 64 * cc;
      if (col >= a.n_out) break;
#pragma unroll
      for (int pass = 0; pass < 3; ++pass) { /* 0: act; 1: g; 2: u (saved context) */
        if (pass > 0 && !a.save_gu) break;
        uint32_t v[8][2];
        gu_pass_values<LIMIT ? 1 : 0>(pass, L, acc, cc, v);
        tok_rows_m_piece<DIAG>(a, region, buf, leader, wg, v, pass == 0 ? &a.tm_out0 : &a.tm_out1,
                               pass == 2 ? a.n_out + col : col, row0);
      }
    }
  } else { /* down: outputs c.n0 + 64 cc are column groups 8 cc .. +7 */
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int col = c.n0 + 64 * cc;
      if (col >= a.n_out) break;
      uint32_t v[8][2];
      pack_groups(acc, 8 * cc, v);
      tok_rows_m_piece<DIAG>(a, region, buf, leader, wg, v, &a.tm_out0, col, row0);
    }
  }
  if (OWN_AREA) ebuf = buf; /* (its stores drain under the next tile, as tok_epilogue's) */
  else if (leader) bulk_wait_group_read<0>(); /* the stage goes back to the producer after this */
}

template <int KIND, bool PAIR, int RING, bool DIAG>
__device__ __forceinline__ void tok_consume_rows_m(const GemmTileArgs &a, const TileCoord &c, char *smem,
                                                   PipeState &p, WaitCtx &w, int wg, int k_blocks, int &ebuf) {
  using TC = TokConfig<KIND, RING>;
  static_assert(!PAIR && (KIND == kGateUpFwd || KIND == kDownFwd), "rows as M: forward kinds, no pairs");
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  const bool leader = (threadIdx.x & 127) == 0;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  int prev = 0;
  unsigned long long *const sclk = TokKnobs<DIAG>::sclk(a); /* (as tok_consume_nt) */
  const bool clk = sclk && threadIdx.x == 128;
  for (int kb = 0; kb < k_blocks; ++kb) {
    const uint32_t t0 = clk ? (uint32_t)clock64() : 0u;
    bar_wait(&full[p.stage], p.phase, w, MOK_WAIT_GEMM_LOAD);
    if (clk) tok_sclk_record(sclk, tok_sclk_stamps<TC::kStages>(smem + TC::kBarOffset)[p.stage], t0, (uint32_t)clock64());
    const uint32_t sw = smem_u32(smem + p.stage * TC::kStageBytes);
    const uint32_t sa = sw + TC::kWBytes + wg * 64 * 128; /* this warpgroup's 64 rows */
#pragma unroll
    for (int i = 0; i < 128; ++i) reg_fence(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16)
      wgmma_bf16<256, 0, 0>(acc, wgmma_desc_sw128(sa + k16 * 32, 16, 1024), wgmma_desc_sw128(sw + k16 * 32, 16, 1024), 1);
    wgmma_commit_group();
    wgmma_wait_group<1>();
#pragma unroll
    for (int i = 0; i < 128; ++i) reg_fence(acc[i]);
    if (kb > 0) tok_release<PAIR>(&empty[prev], leader);
    prev = p.stage;
    pipe_advance<TC::kStages>(p);
  }
  wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) reg_fence(acc[i]);
  if constexpr (TC::kEpiBytes > 0) { /* an epilogue area of its own (128-row ring): the stage goes back first */
    if (k_blocks > 0) tok_release<PAIR>(&empty[prev], leader);
    const uint32_t area = smem_u32(smem + TC::kEpiOffset + wg * 2 * kTokBufBytes);
    if (KIND == kGateUpFwd && a.limit > 0.f) tok_epilogue_rows_m<KIND, true, DIAG, true>(a, c, area, wg, acc, ebuf);
    else tok_epilogue_rows_m<KIND, false, DIAG, true>(a, c, area, wg, acc, ebuf);
  } else {
    named_barrier_sync<3>(256u); /* both warpgroups' MMAs on the last stage are done */
    const uint32_t region = smem_u32(smem + prev * TC::kStageBytes + wg * (TC::kWBytes / 2));
    if (KIND == kGateUpFwd && a.limit > 0.f) tok_epilogue_rows_m<KIND, true, DIAG, false>(a, c, region, wg, acc, ebuf);
    else tok_epilogue_rows_m<KIND, false, DIAG, false>(a, c, region, wg, acc, ebuf);
    if (k_blocks > 0) tok_release<PAIR>(&empty[prev], leader);
  }
}

/* One token tile, both consumer warpgroups (wg = 0, 1); PAIR: in a CTA pair; RING: the
 * stage's rows (TokConfig); ebuf: the warpgroup's next epilogue buffer (kTokRing128);
 * ROWS_M: the rows-as-M path of 128-row tiles compiled in (a.rows_m picks it): gate+up on
 * the 176-row ring (the standalone kernel and the megakernel; the fused forward's kernel
 * spilled 4 bytes with it), down on the 128-row ring (the standalone kernel: compiled into
 * the 176-row ring's instance it slowed qwen3.5 R320's 160-row tiles by 2%). */
template <int KIND, bool PAIR, int RING = kTokMaxUnits, bool DIAG = true, bool ROWS_M = false>
__device__ __forceinline__ void tok_tile_consume(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p, WaitCtx &w,
                                 int wg, int &ebuf) {
  const int k_blocks = __shfl_sync(0xffffffffu, c.k_blocks, 0);
  constexpr int kMax = RING * kTokUnit; /* the ring's largest tile: 128 (kTokRing128) or 176 rows */
  switch (__shfl_sync(0xffffffffu, c.nt, 0)) { /* sizes past kMax never come: they fall to it */
    case 16: tok_consume_nt<KIND, 16, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 32: tok_consume_nt<KIND, 32, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 48: tok_consume_nt<KIND, 48, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 64: tok_consume_nt<KIND, 64, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 80: tok_consume_nt<KIND, 80, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 96: tok_consume_nt<KIND, 96, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 112: tok_consume_nt<KIND, 112, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
    case 128:
      if constexpr (ROWS_M && !PAIR &&
                    ((KIND == kGateUpFwd && TokConfig<KIND, RING>::kEpiBytes == 0) ||
                     (KIND == kDownFwd && TokConfig<KIND, RING>::kEpiBytes > 0))) {
        /* (every row a computed one: padding rows past m_end take the rows-as-N epilogue) */
        if (a.rows_m && __shfl_sync(0xffffffffu, (int)(c.z_end <= c.m_end), 0)) {
          tok_consume_rows_m<KIND, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf);
          break;
        }
      }
      if constexpr (kMax > 128) { tok_consume_nt<KIND, 128, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break; }
      [[fallthrough]];
    case 144:
      if constexpr (kMax > 144) { tok_consume_nt<KIND, 144, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break; }
      [[fallthrough]];
    case 160:
      if constexpr (kMax > 160) { tok_consume_nt<KIND, 160, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break; }
      [[fallthrough]];
    default: tok_consume_nt<KIND, kMax, PAIR, RING, DIAG>(a, c, smem, p, w, wg, k_blocks, ebuf); break;
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

} /* namespace mok_sm90 */

#endif /* MOK_GEMM_TOK_TILES_CUH */
