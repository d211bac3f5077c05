/*
 * tile_epilogue.cuh — the row-grouped tiles' epilogues (TMA-store staging, SwiGLU and its
 * backward, fp32 weight gradients) and their consumer (gemm_tile_consume, mma_loop,
 * gemm_consumer_finish); the arithmetic the token tiles share (swiglu_h, stage_bf16, ...).
 * grouped_gemm.cuh has the whole picture.
 */
#ifndef MOK_GEMM_TILE_EPILOGUE_CUH
#define MOK_GEMM_TILE_EPILOGUE_CUH

#include "gemm/tile_base.cuh" /* defines: GemmTileArgs, TileConfig, PipeState, EpiState, bar_wait */

namespace mok_sm90 {

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

/* One gate+up output pass of 64 outputs (outputs 64 cc .. +63: accumulator column groups
 * 16 cc .. +7 gate, 16 cc + 8 .. +15 up) of a warpgroup's 64 rows x 256 accumulator columns
 * (the row-grouped tiles and the rows-as-M token tiles): pass 0 act, 1 g, 2 u. LIM: 0 no
 * limit, 1 the limit (swiglu_h / gu_pack), 2 the limit tested at run time (swiglu_pack). */
template <int LIM, int NA>
__device__ __forceinline__ void gu_pass_values(int pass, float L, const float (&acc)[NA], int cc, uint32_t (&v)[8][2]) {
#pragma unroll
  for (int jj = 0; jj < 8; ++jj)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 16 * cc + jj;
      const float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
      const float u0 = acc[4 * (j + 8) + 2 * h], u1 = acc[4 * (j + 8) + 2 * h + 1];
      if constexpr (LIM == 2) v[jj][h] = swiglu_pack(pass, L, g0, g1, u0, u1);
      else v[jj][h] = pass == 0   ? swiglu_h<LIM == 1>(L, g0, g1, u0, u1)
                      : pass == 1 ? gu_pack<LIM == 1>(L, -INFINITY, g0, g1)
                                  : gu_pack<LIM == 1>(L, -L, u0, u1);
    }
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
        gu_pass_values<2>(pass, L, acc, cc, v);
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

} /* namespace mok_sm90 */

#endif /* MOK_GEMM_TILE_EPILOGUE_CUH */
