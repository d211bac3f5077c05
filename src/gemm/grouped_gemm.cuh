/*
 * grouped_gemm.cuh — the expert GEMM tiles of mok on Hopper: TMA loads into a ring of
 * shared-memory stages, wgmma from shared memory, one producer warpgroup and two
 * consumer warpgroups (warp specialised), epilogues written straight from registers.
 *
 * Everything is a device function over one tile, so a persistent megakernel's compute
 * CTAs can run exactly this code for any tile index in a fixed task order:
 *
 *   GemmSched: built once per CTA from expert_offset (gemm_sched_init), maps a tile
 *              index to a TileCoord (gemm_decode_tile); tiles past the rows in use
 *              decode to nothing (index >= gemm_num_tiles).
 *   gemm_tile_produce<KIND, BN>(args, coord, smem, pipe)   one thread of the producer WG
 *   gemm_tile_consume<KIND, BN>(args, coord, smem, pipe, wg) both consumer WGs (wg = 0, 1)
 *   PipeState: the ring position; producer and consumers walk the same tile sequence, so
 *              their positions agree.
 *
 * Tile: BM = 128 rows (consumer warpgroup wg owns rows wg*64 .. +64), BN output columns
 * (128, 192 or 256; gate+up holds BN/2 gate and the same BN/2 up columns, so one thread
 * owns g and u of the same element), BK = 64 (one 128-byte swizzle row of bf16).
 * Shared memory per stage: A 128 x 64 (16 KB) then B BN x 64; K-major operands are one
 * TMA box of 64-element rows, MN-major ones are 64-wide MN chunks of 64 K-rows (8 KB).
 *
 * Row-grouped kinds (forward, dgrad): M = the schedule's rows. The tiles of expert e are
 * ordered n-block major, m-block minor, experts in order, so the CTAs running at one time
 * share the weight block (and the rows) through L2. A tile whose second half lies past
 * the segment end runs on one warpgroup; one warp of the other keeps the ring in step,
 * then that warpgroup meets on named barrier 1 + wg (gemm_tile_consume): a kernel that
 * embeds these tiles leaves barrier ids 1 and 2 to them.
 * Weight-gradient kinds: M x N = the weight's [out, in], K = expert e's rows, reduced in
 * row order inside one tile (no split-K), so results are bitwise reproducible.
 */
#ifndef MOK_GEMM_GROUPED_GEMM_CUH
#define MOK_GEMM_GROUPED_GEMM_CUH

#include <cuda_bf16.h> /* defines: __nv_bfloat162, __float22bfloat162_rn */
#include <stdint.h>

#include "gemm/sm90_primitives.cuh" /* defines: mbarrier_*, tma_load_2d, wgmma_*, setmaxnreg_* */

namespace mok_sm90 {

/* Kinds, numbered as mokGemmKind_t in gemm.h. */
enum { kGateUpFwd = 0, kDownFwd = 1, kDownDgrad = 2, kGateUpDgrad = 3, kWgradGateUp = 4, kWgradDown = 5 };

constexpr int kBM = 128;
constexpr int kBK = 64;
constexpr int kThreads = 384; /* WG0 producer, WG1 and WG2 consumers */
constexpr int kABytes = kBM * kBK * 2;
constexpr int kChunkBytes = 64 * kBK * 2; /* one MN-major box: 64 MN x 64 K */
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;

template <int KIND>
struct KindTraits {
  static constexpr bool kWgrad = KIND == kWgradGateUp || KIND == kWgradDown;
  static constexpr int kAMn = kWgrad ? 1 : 0;                                    /* A MN-major */
  static constexpr int kBMn = (KIND == kDownDgrad || KIND == kGateUpDgrad || kWgrad) ? 1 : 0;
};

template <int BN>
struct TileConfig {
  static constexpr int kStages = BN == 256 ? 4 : BN == 192 ? 5 : 6;
  static constexpr int kBBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kBarOffset = kStages * kStageBytes; /* full[kStages], empty[kStages] */
  static constexpr int kSchedOffset = kBarOffset + 2 * kStages * 8;
  /* bytes of dynamic shared memory for E experts (1024 of slack for alignment). */
  static constexpr int smem_bytes(int experts) { return 1024 + kSchedOffset + 8 * (experts + 1); }
};

/* Everything a tile reads: backend-neutral sizes and pointers plus the sm90 tensor maps
 * (built on the host; the struct is a __grid_constant__ kernel parameter). */
struct GemmTileArgs {
  CUtensorMap tm_a;  /* A operand: rows x K (K-major), or for wgrad rows x M (MN-major) */
  CUtensorMap tm_b0; /* weights (gate / down) or, for wgrad, the rows x N operand */
  CUtensorMap tm_b1; /* W_up: second half of N (gate+up fwd) or of K (gate+up dgrad) */
  const int32_t *expert_offset; /* [E_l + 1] */
  int num_experts;
  int n_out;      /* output columns: I (gate+up fwd, down dgrad), H (down fwd, gate+up dgrad), N_w */
  int k_len;      /* reduction length of row-grouped kinds: H, I, H, 2I */
  int b_rows;     /* rows of one expert in the weight tensor maps: I or H */
  int m_w;        /* wgrad: output rows per expert (2I or H) */
  int m_split;    /* wgrad: rows [0, m_split) go to out0, the rest to out1 */
  int ld_aux;     /* columns of gu / dgu (2I) */
  float limit;    /* SwiGLU clamp, 0 = off */
  int out_fp32;   /* wgrad output dtype */
  void *out0;     /* act / y / dgu / dx / dW_gate / dW_down */
  void *out1;     /* gu (forward, may be NULL) / dW_up */
  const uint16_t *aux_in; /* gu (down dgrad) */
};

struct TileCoord {
  int expert;
  int m0;       /* first row of the tile: schedule row (row-grouped) or weight row (wgrad) */
  int m_end;    /* rows >= m_end are not this tile's (segment end, or m_w) */
  int n0;       /* first output column */
  int k0;       /* wgrad: first schedule row of the expert */
  int k_blocks; /* BK-wide steps of the reduction */
};

struct PipeState {
  int stage;
  uint32_t phase;
};

template <int BN>
__device__ __forceinline__ void pipe_advance(PipeState &p) {
  if (++p.stage == TileConfig<BN>::kStages) {
    p.stage = 0;
    p.phase ^= 1u;
  }
}
/* n pipe_advance steps at once. */
template <int BN>
__device__ __forceinline__ void pipe_advance_by(PipeState &p, int n) {
  const int s = p.stage + n;
  p.phase ^= (uint32_t)(s / TileConfig<BN>::kStages) & 1u;
  p.stage = s % TileConfig<BN>::kStages;
}

/* Per-CTA schedule in shared memory: off[E+1] (copy of expert_offset) and, for the
 * row-grouped kinds, pre[E+1] = first tile index of each expert. */
struct GemmSched {
  int *off;
  int *pre;
  int num_experts;
  int m_tiles_w; /* wgrad: m-blocks per expert */
  int n_tiles;
  int total;
};

template <int KIND, int BN>
__device__ __forceinline__ int tile_out_cols() {
  return KIND == kGateUpFwd ? BN / 2 : BN;
}

/* Builds the schedule; called by every thread of the CTA, followed by __syncthreads()
 * before use. Only warp 0 works: a 32-lane scan over the experts. */
template <int KIND, int BN>
__device__ void gemm_sched_init(const GemmTileArgs &a, int *off, int *pre) {
  if (threadIdx.x >= 32) return;
  const int E = a.num_experts, lane = threadIdx.x;
  const int n_tiles = (a.n_out + tile_out_cols<KIND, BN>() - 1) / tile_out_cols<KIND, BN>();
  const int per = (E + 31) / 32, lo = lane * per, hi = min(E, lo + per);
  int local = 0;
  for (int e = lo; e < hi; ++e) {
    int o0 = __ldg(a.expert_offset + e), o1 = __ldg(a.expert_offset + e + 1);
    off[e] = o0;
    if (e == E - 1) off[E] = o1;
    local += (o1 - o0 + kBM - 1) / kBM * n_tiles;
  }
  int incl = local;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  int run = incl - local;
  for (int e = lo; e < hi; ++e) {
    pre[e] = run;
    int o0 = __ldg(a.expert_offset + e), o1 = __ldg(a.expert_offset + e + 1);
    run += (o1 - o0 + kBM - 1) / kBM * n_tiles;
  }
  if (lane == 31) pre[E] = incl;
}

template <int KIND, int BN>
__device__ __forceinline__ GemmSched gemm_sched_view(const GemmTileArgs &a, int *off, int *pre) {
  GemmSched s;
  s.off = off;
  s.pre = pre;
  s.num_experts = a.num_experts;
  s.n_tiles = (a.n_out + tile_out_cols<KIND, BN>() - 1) / tile_out_cols<KIND, BN>();
  if (KindTraits<KIND>::kWgrad) {
    s.m_tiles_w = (a.m_w + kBM - 1) / kBM;
    s.total = a.num_experts * s.m_tiles_w * s.n_tiles;
  } else {
    s.m_tiles_w = 0;
    s.total = pre[a.num_experts];
  }
  return s;
}

/* Tile index (0 <= t < s.total) -> coordinates. */
template <int KIND, int BN>
__device__ __forceinline__ TileCoord gemm_decode_tile(const GemmTileArgs &a, const GemmSched &s, int t) {
  TileCoord c;
  if (KindTraits<KIND>::kWgrad) {
    const int per_e = s.m_tiles_w * s.n_tiles;
    const int e = t / per_e, r = t - e * per_e;
    const int nb = r / s.m_tiles_w, mb = r - nb * s.m_tiles_w;
    c.expert = e;
    c.m0 = mb * kBM;
    c.m_end = a.m_w;
    c.n0 = nb * BN;
    c.k0 = s.off[e];
    c.k_blocks = (s.off[e + 1] - s.off[e]) / kBK;
  } else {
    int lo = 0, hi = s.num_experts; /* largest e with pre[e] <= t (skips empty experts) */
    while (hi - lo > 1) {
      int mid = (lo + hi) >> 1;
      if (s.pre[mid] <= t) lo = mid;
      else hi = mid;
    }
    const int e = lo, r = t - s.pre[e];
    const int seg = s.off[e + 1] - s.off[e];
    const int mt = (seg + kBM - 1) / kBM;
    const int nb = r / mt, mb = r - nb * mt;
    c.expert = e;
    c.m0 = s.off[e] + mb * kBM;
    c.m_end = s.off[e + 1];
    c.n0 = nb * tile_out_cols<KIND, BN>();
    c.k0 = 0;
    c.k_blocks = a.k_len / kBK;
  }
  return c;
}

/* ---- producer: one thread issues every TMA load of the tile ----------------------- */
template <int KIND, int BN>
__device__ void gemm_tile_produce(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p) {
  using TC = TileConfig<BN>;
  using KT = KindTraits<KIND>;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  for (int kb = 0; kb < c.k_blocks; ++kb) {
    mbarrier_wait_parity(&empty[p.stage], p.phase ^ 1u); /* consumers freed this slot */
    uint64_t *bar = &full[p.stage];
    char *sa = smem + p.stage * TC::kStageBytes;
    char *sb = sa + kABytes;
    mbarrier_arrive_expect_tx(bar, TC::kStageBytes);
    const int kk = kb * kBK;
    if (KT::kAMn) { /* wgrad: A = rows x M, M contiguous: two 64-wide chunks */
      tma_load_2d(sa, &a.tm_a, bar, c.m0, c.k0 + kk);
      tma_load_2d(sa + kChunkBytes, &a.tm_a, bar, c.m0 + 64, c.k0 + kk);
    } else {
      tma_load_2d(sa, &a.tm_a, bar, kk, c.m0);
    }
    if (KIND == kGateUpFwd) { /* [E*I, H] gate rows then up rows of the same columns */
      const int row = c.expert * a.b_rows + c.n0;
      tma_load_2d(sb, &a.tm_b0, bar, kk, row);
      tma_load_2d(sb + (BN / 2) * 128, &a.tm_b1, bar, kk, row);
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
    pipe_advance<BN>(p);
  }
}

/* ---- epilogues ------------------------------------------------------------------------
 * Accumulator d[4j+q] of m64nNk16 holds row warp*16 + lane/4 + 8*(q>>1), column
 * 8*j + 2*(lane%4) + (q&1). Stored as is, a warp writes 8 rows x 16 bytes per
 * instruction: half sectors, which L2 must merge (bf16 weight gradients ran slower than
 * fp32 ones that way). So each quad of lanes (one row) transposes groups of four 8-column
 * groups: lane q ends up with the 8 consecutive columns of group 4*jj + q and stores them
 * as one 16-byte vector; a warp instruction then writes 8 rows x 64 contiguous bytes. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __float22bfloat162_rn(make_float2(lo, hi));
  return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }

/* 4x4 transpose across the quad (lanes 4r .. 4r+3): in[lane q][i] -> out[q][p] = in[p][q].
 * Two xor-shuffle rounds with selects (no run-time register indexing). */
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int q) {
  const bool b2 = q & 2, b1 = q & 1;
  uint32_t s0 = b2 ? v[0] : v[2], s1 = b2 ? v[1] : v[3];
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 2), r1 = __shfl_xor_sync(0xffffffffu, s1, 2);
  if (b2) { v[0] = r0; v[1] = r1; } else { v[2] = r0; v[3] = r1; }
  s0 = b1 ? v[0] : v[1];
  s1 = b1 ? v[2] : v[3];
  r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
  r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
  if (b1) { v[0] = r0; v[2] = r1; } else { v[1] = r0; v[3] = r1; }
}

__device__ __forceinline__ void st_global_16(void *p, const uint32_t (&v)[4]) {
  *reinterpret_cast<uint4 *>(p) = make_uint4(v[0], v[1], v[2], v[3]);
}

template <int KIND, int BN>
__device__ __forceinline__ void gemm_epilogue(const GemmTileArgs &a, const TileCoord &c, int wg,
                                              float (&acc)[BN / 2]) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, q = lane & 3;
  const int row_base = c.m0 + wg * 64 + warp * 16 + (lane >> 2);
  constexpr int NJ = BN / 8;
  const float L = a.limit;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_base + 8 * h;
    /* every lane of a quad has the same row: the shuffles below stay within live quads */
    if (row >= c.m_end) continue;
    if (KIND == kGateUpFwd) {
      uint16_t *act = static_cast<uint16_t *>(a.out0) + (size_t)row * a.n_out;
      uint16_t *gu = a.out1 ? static_cast<uint16_t *>(a.out1) + (size_t)row * a.ld_aux : nullptr;
#pragma unroll
      for (int jj = 0; jj < NJ / 8; ++jj) {
        const int col = c.n0 + 32 * jj + 8 * q; /* after the transpose */
        uint32_t va[4], vg[4], vu[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * jj + i;
          float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
          float u0 = acc[4 * (j + NJ / 2) + 2 * h], u1 = acc[4 * (j + NJ / 2) + 2 * h + 1];
          if (L > 0.f) {
            /* saved context: a value the clamp cuts is saved as +-inf, so the backward's
             * mask is exactly this one (include/mok.h) */
            vg[i] = pack_bf16x2(g0 > L ? INFINITY : g0, g1 > L ? INFINITY : g1);
            vu[i] = pack_bf16x2(u0 > L ? INFINITY : u0 < -L ? -INFINITY : u0,
                                u1 > L ? INFINITY : u1 < -L ? -INFINITY : u1);
            g0 = fminf(g0, L); g1 = fminf(g1, L);
            u0 = fminf(fmaxf(u0, -L), L); u1 = fminf(fmaxf(u1, -L), L);
          } else {
            vg[i] = pack_bf16x2(g0, g1);
            vu[i] = pack_bf16x2(u0, u1);
          }
          va[i] = pack_bf16x2(g0 * sigmoid_f(g0) * u0, g1 * sigmoid_f(g1) * u1);
        }
        quad_transpose(va, q);
        if (col < a.n_out) st_global_16(act + col, va);
        if (gu) {
          quad_transpose(vg, q);
          quad_transpose(vu, q);
          if (col < a.n_out) {
            st_global_16(gu + col, vg);
            st_global_16(gu + a.n_out + col, vu);
          }
        }
      }
    } else if (KIND == kDownDgrad) {
      const uint16_t *gu = a.aux_in + (size_t)row * a.ld_aux;
      uint16_t *dgu = static_cast<uint16_t *>(a.out0) + (size_t)row * a.ld_aux;
#pragma unroll
      for (int jj = 0; jj < NJ / 4; ++jj) {
        const int col = c.n0 + 32 * jj + 8 * q;
        uint32_t d0[4], d1[4]; /* da as raw fp32 bits: even and odd columns */
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          d0[i] = __float_as_uint(acc[4 * (4 * jj + i) + 2 * h]);
          d1[i] = __float_as_uint(acc[4 * (4 * jj + i) + 2 * h + 1]);
        }
        quad_transpose(d0, q);
        quad_transpose(d1, q);
        if (col >= a.n_out) continue;
        const uint4 gv = __ldg(reinterpret_cast<const uint4 *>(gu + col));
        const uint4 uv = __ldg(reinterpret_cast<const uint4 *>(gu + a.n_out + col));
        const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
        uint32_t og[4], ou[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          float dg[2], du[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float g = e ? bf16_hi(gw[p]) : bf16_lo(gw[p]), u = e ? bf16_hi(uw[p]) : bf16_lo(uw[p]);
            const float da = __uint_as_float(e ? d1[p] : d0[p]);
            float gc = g, uc = u, gmask = 1.f, umask = 1.f;
            if (L > 0.f) {
              /* the forward saved a cut value as +-inf: the mask is exactly its */
              if (isinf(g)) { gc = L; gmask = 0.f; }
              if (isinf(u)) { uc = u > 0.f ? L : -L; umask = 0.f; }
            }
            const float sg = sigmoid_f(gc);
            dg[e] = da * uc * (sg * (1.f + gc * (1.f - sg))) * gmask;
            du[e] = da * (gc * sg) * umask;
          }
          og[p] = pack_bf16x2(dg[0], dg[1]);
          ou[p] = pack_bf16x2(du[0], du[1]);
        }
        st_global_16(dgu + col, og);
        st_global_16(dgu + a.n_out + col, ou);
      }
    } else if (KIND == kDownFwd || KIND == kGateUpDgrad) {
      uint16_t *out = static_cast<uint16_t *>(a.out0) + (size_t)row * a.n_out;
#pragma unroll
      for (int jj = 0; jj < NJ / 4; ++jj) {
        const int col = c.n0 + 32 * jj + 8 * q;
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = pack_bf16x2(acc[4 * (4 * jj + i) + 2 * h], acc[4 * (4 * jj + i) + 2 * h + 1]);
        quad_transpose(v, q);
        if (col < a.n_out) st_global_16(out + col, v);
      }
    } else { /* weight gradients: row = weight row of expert c.expert */
      const bool second = row >= a.m_split;
      const int r = second ? row - a.m_split : row;
      const int rows_out = second ? a.m_w - a.m_split : a.m_split;
      const size_t base = ((size_t)c.expert * rows_out + r) * a.n_out;
      void *dst = second ? a.out1 : a.out0;
      if (a.out_fp32) { /* 8 rows x 32 bytes per instruction: full sectors already */
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const int col = c.n0 + 8 * j + 2 * q;
          if (col < a.n_out)
            *reinterpret_cast<float2 *>(static_cast<float *>(dst) + base + col) =
                make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
      } else {
#pragma unroll
        for (int jj = 0; jj < NJ / 4; ++jj) {
          const int col = c.n0 + 32 * jj + 8 * q;
          uint32_t v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i)
            v[i] = pack_bf16x2(acc[4 * (4 * jj + i) + 2 * h], acc[4 * (4 * jj + i) + 2 * h + 1]);
          quad_transpose(v, q);
          if (col < a.n_out) st_global_16(static_cast<uint16_t *>(dst) + base + col, v);
        }
      }
    }
  }
}

/* ---- consumer: one warpgroup, 64 rows x BN columns --------------------------------- */
template <int KIND, int BN>
__device__ void gemm_tile_consume(const GemmTileArgs &a, const TileCoord &c, char *smem, PipeState &p,
                                  int wg) {
  using TC = TileConfig<BN>;
  using KT = KindTraits<KIND>;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  const bool leader = (threadIdx.x & 127) == 0;
  /* Broadcast so ptxas sees a warp-uniform condition around the wgmmas (otherwise it
   * serialises them, warning C7518). */
  const bool active = __shfl_sync(0xffffffffu, (int)(c.m0 + wg * 64 < c.m_end), 0) != 0;

  const int k_blocks = __shfl_sync(0xffffffffu, c.k_blocks, 0); /* uniform trip count */
  if (!active) {
    /* Rows past the segment: keep the ring in step, compute nothing. Only the leader's
     * warp walks the ring. The other three warps are tied to nothing here (no wgmma) and
     * the leader's arrivals let the ring run on without them: a warp still in the
     * previous tile's epilogue (dgrad down loads gu there) could reach full[s] after the
     * stage had been refilled and had landed once more, find the barrier two phases on
     * (same parity, still open), wait for the refill after that, and so run two phases
     * late to the end, where it waits for fills that never come (the kimi Zipf hang).
     * The warpgroup meets at named barrier 1 + wg once the leader's warp has taken the
     * tile's last stage, so all four warps leave the tile at the same ring position. */
    if (((threadIdx.x >> 5) & 3) == 0) {
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbarrier_wait_parity(&full[p.stage], p.phase);
        mbarrier_arrive_if(&empty[p.stage], leader);
        pipe_advance<BN>(p);
      }
    } else {
      pipe_advance_by<BN>(p, k_blocks);
    }
    if (wg == 0) named_barrier_sync<1>(128u);
    else named_barrier_sync<2>(128u);
    return;
  }
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  int prev = 0;
  for (int kb = 0; kb < k_blocks; ++kb) {
    mbarrier_wait_parity(&full[p.stage], p.phase);
    const uint32_t sa = smem_u32(smem + p.stage * TC::kStageBytes) + wg * kChunkBytes;
    const uint32_t sb = smem_u32(smem + p.stage * TC::kStageBytes + kABytes);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) reg_fence(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16) {
      const uint64_t da = KT::kAMn ? wgmma_desc_sw128(sa + k16 * 2048, kChunkBytes, 1024)
                                   : wgmma_desc_sw128(sa + k16 * 32, 16, 1024);
      const uint64_t db = KT::kBMn ? wgmma_desc_sw128(sb + k16 * 2048, kChunkBytes, 1024)
                                   : wgmma_desc_sw128(sb + k16 * 32, 16, 1024);
      wgmma_bf16<BN, KT::kAMn, KT::kBMn>(acc, da, db, 1);
    }
    wgmma_commit_group();
    wgmma_wait_group<1>(); /* the previous stage's MMAs are done: release its slot */
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) reg_fence(acc[i]);
    if (kb > 0) mbarrier_arrive_if(&empty[prev], leader);
    prev = p.stage;
    pipe_advance<BN>(p);
  }
  wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) reg_fence(acc[i]);
  if (k_blocks > 0) mbarrier_arrive_if(&empty[prev], leader);
  gemm_epilogue<KIND, BN>(a, c, wg, acc);
}

/* ---- the standalone persistent kernel: one CTA per SM, static round-robin tiles ---- */
template <int KIND, int BN>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemm_kernel(const __grid_constant__ GemmTileArgs a) {
  using TC = TileConfig<BN>;
  extern __shared__ char smem_raw[];
  char *smem = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + TC::kBarOffset);
  uint64_t *empty = full + TC::kStages;
  int *off = reinterpret_cast<int *>(smem + TC::kSchedOffset);
  int *pre = off + (a.num_experts + 1);

  if (threadIdx.x == 0) {
    for (int s = 0; s < TC::kStages; ++s) {
      mbarrier_init(&full[s], 1);  /* the producer's arrive.expect_tx */
      mbarrier_init(&empty[s], 2); /* one arrive per consumer warpgroup */
    }
    fence_mbarrier_init();
  }
  gemm_sched_init<KIND, BN>(a, off, pre);
  __syncthreads();
  const GemmSched s = gemm_sched_view<KIND, BN>(a, off, pre);

  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0); /* warp-uniform for ptxas */
  PipeState p = {0, 0u};
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(&a.tm_a);
      tma_prefetch_descriptor(&a.tm_b0);
      tma_prefetch_descriptor(&a.tm_b1);
      for (int t = blockIdx.x; t < s.total; t += gridDim.x) {
        const TileCoord c = gemm_decode_tile<KIND, BN>(a, s, t);
        gemm_tile_produce<KIND, BN>(a, c, smem, p);
      }
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    const int total = __shfl_sync(0xffffffffu, s.total, 0); /* uniform loop bound for ptxas */
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      const TileCoord c = gemm_decode_tile<KIND, BN>(a, s, t);
      gemm_tile_consume<KIND, BN>(a, c, smem, p, wg - 1);
    }
  }
}

} /* namespace mok_sm90 */

#endif /* MOK_GEMM_GROUPED_GEMM_CUH */
