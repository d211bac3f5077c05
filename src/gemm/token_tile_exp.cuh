/*
 * token_tile_exp.cuh — EXPERIMENT (branch exp/token-tiles, not for main): the forward
 * down GEMM with tokens as the wgmma N dimension, to measure whether a tile whose token
 * side is fitted to the rows (cuBLAS runs 128x160 at qwen3.5 R320) beats our 128-row
 * tiles with 64-row tails.
 *
 * Tile: 256 weight rows (outputs h) x NT tokens. Consumer warpgroup w owns weight rows
 * 128w .. +128 as two m64 blocks: two wgmma m64nNTk16 per k16 step (acc: NT floats).
 * Stage: weights 256 x 64 (32 KB, one TMA box) then tokens NT x 64 (NT/32 boxes of 32
 * rows, 4 KB each). Epilogue: each 64-row m64 block is written as [tokens x 64 outputs]
 * through stmatrix.trans into one 8 KB staging chunk per warpgroup, 64 tokens at a time,
 * stored by TMA in 32-token boxes. Only layouts whose every segment is a multiple of NT
 * (the bench's qwen3.5 --rows-per-expert 320 with NT = 160). Static round-robin tiles.
 */
#ifndef MOK_GEMM_TOKEN_TILE_EXP_CUH
#define MOK_GEMM_TOKEN_TILE_EXP_CUH

#include "gemm/grouped_gemm.cuh"

namespace mok_sm90 {

struct TokArgs {
  CUtensorMap tm_w;   /* W_down [E*H, I], box 256 rows x 64 */
  CUtensorMap tm_act; /* act [cap, I], box 32 rows x 64 */
  CUtensorMap tm_y;   /* y [cap, H], box 32 rows x 64 (store) */
  const int32_t *expert_offset;
  int num_experts, H, I;
};

template <int NT>
struct TokCfg {
  static constexpr int kWBytes = 256 * 128;
  static constexpr int kTBytes = NT * 128;
  static constexpr int kStage = kWBytes + kTBytes;
  static constexpr int kEpi = 2 * kStgBytes; /* one chunk per consumer warpgroup */
  static constexpr int kFit = (kSmemLimit - 1024 - kEpi - 256) / kStage;
  static constexpr int kStages = kFit > 6 ? 6 : kFit;
  static constexpr int kEpiOff = kStages * kStage;
  static constexpr int kBarOff = kEpiOff + kEpi;
  static constexpr int kSmem = 1024 + kBarOff + 256;
  static_assert(kStage % 1024 == 0, "stage alignment");
  static_assert(kStages >= 3, "stages");
};

/* tile t -> (expert, first output h0, first token row r0); false past the last tile.
 * Order: expert, weight block, token block (token blocks of one weight block adjacent). */
template <int NT>
__device__ __forceinline__ bool tok_decode(const TokArgs &a, GemmCursor &cu, int t, int &h0, int &r0, int &e) {
  const int nw = a.H / 256;
  if (t < cu.first) gemm_cursor_init(a.expert_offset, cu);
  for (;;) {
    if (cu.e >= a.num_experts) return false;
    const int tiles = (cu.o1 - cu.o0) / NT * nw;
    if (t < cu.first + tiles) break;
    cu.first += tiles;
    if (++cu.e < a.num_experts) {
      cu.o0 = cu.o1;
      cu.o1 = sched_ld(a.expert_offset + cu.e + 1);
    }
  }
  const int r = t - cu.first, nt = (cu.o1 - cu.o0) / NT;
  e = cu.e;
  h0 = (r / nt) * 256;
  r0 = cu.o0 + (r % nt) * NT;
  return true;
}

template <int NT>
__global__ void __launch_bounds__(kThreads, 1) tok_down_kernel(const __grid_constant__ TokArgs a) {
  using C = TokCfg<NT>;
  extern __shared__ char smem_raw[];
  char *smem = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + C::kBarOff);
  uint64_t *empty = full + C::kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 2);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
  const int k_blocks = a.I / kBK;
  PipeState p = {0, 0u};
  GemmCursor cu;
  int h0, r0, e;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    gemm_cursor_init(a.expert_offset, cu);
    for (int t = blockIdx.x; tok_decode<NT>(a, cu, t, h0, r0, e); t += gridDim.x) {
      for (int kb = 0; kb < k_blocks; ++kb) {
        while (!mbarrier_try_wait_parity(&empty[p.stage], p.phase ^ 1u)) {
        }
        uint64_t *bar = &full[p.stage];
        char *sw = smem + p.stage * C::kStage;
        char *st = sw + C::kWBytes;
        mbarrier_arrive_expect_tx(bar, C::kStage);
        const int kk = kb * kBK;
        tma_load_2d(sw, &a.tm_w, bar, kk, e * a.H + h0);
#pragma unroll
        for (int b = 0; b < NT / 32; ++b) tma_load_2d(st + b * 4096, &a.tm_act, bar, kk, r0 + 32 * b);
        pipe_advance<C::kStages>(p);
      }
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const int w = wg - 1;
  const bool leader = (threadIdx.x & 127) == 0;
  const uint32_t chunk = smem_u32(smem + C::kEpiOff + w * kStgBytes);
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  gemm_cursor_init(a.expert_offset, cu);
  for (int t = blockIdx.x;; t += gridDim.x) {
    if (!__shfl_sync(0xffffffffu, (int)tok_decode<NT>(a, cu, t, h0, r0, e), 0)) break;
    float acc0[NT / 2], acc1[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc0[i] = acc1[i] = 0.f;
    int prev = 0;
    for (int kb = 0; kb < k_blocks; ++kb) {
      while (!mbarrier_try_wait_parity(&full[p.stage], p.phase)) {
      }
      const uint32_t sw = smem_u32(smem + p.stage * C::kStage) + w * 128 * 128;
      const uint32_t st = smem_u32(smem + p.stage * C::kStage + C::kWBytes);
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) { reg_fence(acc0[i]); reg_fence(acc1[i]); }
      wgmma_fence();
#pragma unroll
      for (int k16 = 0; k16 < kBK / 16; ++k16) {
        const uint64_t db = wgmma_desc_sw128(st + k16 * 32, 16, 1024);
        wgmma_bf16<NT, 0, 0>(acc0, wgmma_desc_sw128(sw + k16 * 32, 16, 1024), db, 1);
        wgmma_bf16<NT, 0, 0>(acc1, wgmma_desc_sw128(sw + 64 * 128 + k16 * 32, 16, 1024), db, 1);
      }
      wgmma_commit_group();
      wgmma_wait_group<1>();
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) { reg_fence(acc0[i]); reg_fence(acc1[i]); }
      if (kb > 0) mbarrier_arrive_if(&empty[prev], leader);
      prev = p.stage;
      pipe_advance<C::kStages>(p);
    }
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) { reg_fence(acc0[i]); reg_fence(acc1[i]); }
    if (k_blocks > 0) mbarrier_arrive_if(&empty[prev], leader);
    /* epilogue: block i (weight rows 64i of this warpgroup's 128) as [tokens x 64 outputs] */
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float(&acc)[NT / 2] = i ? acc1 : acc0;
#pragma unroll
      for (int p0 = 0; p0 < NT; p0 += 64) {
        if (leader) bulk_wait_group_read<0>();
        wg_sync(w);
        /* matrices (h, j): weight rows warp*16 + 8h + 0..7, tokens 8j .. 8j+7 */
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          const int j = p0 / 8 + 2 * jp;
          if (j >= NT / 8) break;
          const int s = lane >> 3, k = lane & 7;
          const int tl = 8 * (2 * jp + (s >> 1)) + k; /* token row within the 64-token piece */
          const uint32_t addr = stg_addr(chunk, tl, 2 * warp + (s & 1));
          stmatrix_x4_trans(addr, pack_bf16x2(acc[4 * j], acc[4 * j + 1]), pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]),
                            pack_bf16x2(acc[4 * (j + 1)], acc[4 * (j + 1) + 1]),
                            pack_bf16x2(acc[4 * (j + 1) + 2], acc[4 * (j + 1) + 3]));
        }
        fence_proxy_async_shared();
        wg_sync(w);
        if (leader) {
          const int col = h0 + 128 * w + 64 * i;
          tma_store_2d(&a.tm_y, chunk, col, r0 + p0);
          if (p0 + 32 < NT) tma_store_2d(&a.tm_y, chunk + 32 * 128, col, r0 + p0 + 32);
          bulk_commit_group();
        }
      }
    }
  }
  gemm_consumer_finish();
}

} /* namespace mok_sm90 */

#endif /* MOK_GEMM_TOKEN_TILE_EXP_CUH */
