/*
 * bench_stream.cu — `mok bench stream`: how fast one SM pulls a weight-like stream into
 * shared memory through a TMA ring, as the GEMM token tiles do (diagnostics).
 *
 * Each of `active` CTAs (the rest of a 132-CTA grid exits) streams tiles of a row-major
 * bf16 [rows, K] matrix: a tile is `stage_rows` rows x K, walked in k-blocks of 64
 * columns; each k-block is one stage of the ring (stage_rows x 128 bytes, loaded as TMA
 * boxes of box_rows x 64 in the GEMMs' 128-byte swizzle, one mbarrier a stage). One
 * producer thread refills a stage as soon as it is free; one consumer thread waits for
 * each stage to land, holds it `work` SM cycles (what the MMAs would take), gives it
 * back (or, `hold`, once the next stage has landed, as the GEMMs' consumers do). `share`
 * CTAs read the same tiles in step (two token tiles on one weight block);
 * tiles come from `distinct` regions (DRAM: enough to pass L2; L2: a few).
 * A stage may also carry t_rows rows of a second, small matrix (a forward token tile's
 * rows: few distinct tiles, so they stay in L2), loaded after the streamed rows in boxes of
 * t_box rows, as the GEMMs' token-tile stages [weights | rows].
 * Printed per configuration: GB/s per CTA (bytes it received / time), TB/s of the chip
 * (distinct bytes of the streamed matrix / time), and the mean time from a stage's issue
 * to its use.
 */
#include "cli.h"
#include "gemm.h"
#include "gemm/sm90_primitives.cuh"

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace mok_sm90;

#define BS_CHECK(call)                                                                  \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "bench stream: %s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

struct StreamArgs {
  CUtensorMap map;
  CUtensorMap map_t;             /* the second matrix (t_rows > 0) */
  int t_rows, t_box, t_distinct; /* its rows a stage, box rows, distinct tiles */
  int k_blocks, stage_rows, box_rows, stages, tiles, share, active, distinct;
  int hold;                      /* 1: a stage goes back only once the next has landed (the
                                    GEMMs' wgmma.wait_group 1); 0: after its work */
  int stride;                    /* active CTAs: block indices 0, stride, 2 * stride, ... */
  unsigned work;                 /* consumer hold per stage, SM cycles */
  unsigned long long *lat;       /* [2]: sum of issue -> use cycles, stages */
  unsigned long long *clk;       /* mixed runs: [CTA][2] globaltimer at start and end, or NULL */
  int hint;                      /* 1: the streamed matrix's loads L2 evict-first (as the GEMM's cold tiles) */
};

/* tma_load_2d with an L2 cache policy (as grouped_gemm.cuh's one-tile experts' weights). */
__device__ __forceinline__ void tma_load_2d_policy(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                   uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}

/* The ring in shared memory: stages of (stage_rows + t_rows) x 128 bytes from a 1024-aligned
 * base, then full[stages], empty[stages] and the issue stamps. */
struct StreamRing {
  char *smem;
  uint64_t *full, *empty;
  volatile uint32_t *stamp;
  int stage_bytes;
};
__device__ __forceinline__ StreamRing stream_ring(const StreamArgs &a, char *raw) {
  StreamRing q;
  q.smem = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  q.stage_bytes = (a.stage_rows + a.t_rows) * 128;
  q.full = reinterpret_cast<uint64_t *>(q.smem + a.stages * q.stage_bytes);
  q.empty = q.full + a.stages;
  q.stamp = reinterpret_cast<volatile uint32_t *>(q.empty + a.stages);
  return q;
}
/* Thread 0 sets up the ring's barriers (empty: `releases` arrivals a phase); the CTA meets. */
__device__ __forceinline__ void stream_init(const StreamArgs &a, uint64_t *full, uint64_t *empty, int releases) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < a.stages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], (uint32_t)releases);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
}

/* The consumer's part of a stage: waits for it to land, adds its issue -> use time (from
 * the producer's stamp) to sum, holds it `work` SM cycles. */
__device__ __forceinline__ void stream_use(const StreamArgs &a, uint64_t *full, volatile uint32_t &stamp,
                                           uint32_t phase, unsigned long long &sum, unsigned long long &n) {
  while (!mbarrier_try_wait_parity(full, phase)) {
  }
  const uint32_t t = (uint32_t)clock64();
  sum += t - stamp;
  ++n;
  if (a.work)
    while ((uint32_t)clock64() - t < a.work) {
    }
}

/* One streaming CTA, number me of a.active: its producer and consumer threads. */
__device__ __forceinline__ void stream_run(const StreamArgs &a, const StreamRing &q, int me) {
  stream_init(a, q.full, q.empty, 1);
  if (a.clk && threadIdx.x == 0) a.clk[2 * blockIdx.x] = globaltimer_u64();
  const int groups = a.active / a.share, grp = me / a.share;
  int stage = 0;
  uint32_t phase = 0;
  if (threadIdx.x == 0) { /* producer */
    for (int j = 0; j < a.tiles; ++j) {
      const int row0 = ((grp + j * groups) % a.distinct) * a.stage_rows;
      const int trow0 = a.t_rows ? ((grp + j * groups) % a.t_distinct) * a.t_rows : 0;
      for (int kb = 0; kb < a.k_blocks; ++kb) {
        while (!mbarrier_try_wait_parity(&q.empty[stage], phase ^ 1u)) {
        }
        q.stamp[stage] = (uint32_t)clock64();
        mbarrier_arrive_expect_tx(&q.full[stage], (uint32_t)q.stage_bytes);
        for (int b = 0; b < a.stage_rows; b += a.box_rows)
          if (a.hint)
            tma_load_2d_policy(q.smem + stage * q.stage_bytes + b * 128, &a.map, &q.full[stage], kb * 64, row0 + b,
                               l2_policy_evict_first());
          else tma_load_2d(q.smem + stage * q.stage_bytes + b * 128, &a.map, &q.full[stage], kb * 64, row0 + b);
        for (int b = 0; b < a.t_rows; b += a.t_box)
          tma_load_2d(q.smem + stage * q.stage_bytes + (a.stage_rows + b) * 128, &a.map_t, &q.full[stage], kb * 64,
                      trow0 + b);
        if (++stage == a.stages) stage = 0, phase ^= 1u;
      }
    }
  } else if (threadIdx.x == 32) { /* consumer */
    unsigned long long sum = 0, n = 0;
    for (int j = 0; j < a.tiles; ++j)
      for (int kb = 0; kb < a.k_blocks; ++kb) {
        stream_use(a, &q.full[stage], q.stamp[stage], phase, sum, n);
        if (!a.hold) mbarrier_arrive(&q.empty[stage]);
        else if (j || kb) mbarrier_arrive(&q.empty[stage ? stage - 1 : a.stages - 1]);
        if (++stage == a.stages) stage = 0, phase ^= 1u;
      }
    if (a.hold) mbarrier_arrive(&q.empty[stage ? stage - 1 : a.stages - 1]);
    atomicAdd(&a.lat[0], sum);
    atomicAdd(&a.lat[1], n);
    if (a.clk) a.clk[2 * blockIdx.x + 1] = globaltimer_u64();
  }
}

__global__ void __launch_bounds__(64, 1) stream_kernel(const __grid_constant__ StreamArgs a) {
  extern __shared__ char raw[];
  if ((int)blockIdx.x % a.stride || (int)blockIdx.x / a.stride >= a.active) return;
  stream_run(a, stream_ring(a, raw), (int)blockIdx.x / a.stride);
}

/* Two classes at once (`mixed`): CTAs 0, stride, 2 * stride, ... (cold.active of them)
 * stream as `cold` says (a one-tile expert's weight block from DRAM), every other CTA of the
 * grid (hot.active) as `hot` says (a many-tile expert's tiles: weights mostly from L2, MMA
 * time a stage); each CTA stamps its start and end for per-class rates. */
struct MixedArgs {
  StreamArgs cold, hot;
  int stride;
};
__global__ void __launch_bounds__(64, 1) stream_mixed_kernel(const __grid_constant__ MixedArgs m) {
  extern __shared__ char raw[];
  const int b = (int)blockIdx.x;
  const bool is_cold = b % m.stride == 0 && b / m.stride < m.cold.active;
  if (is_cold) {
    stream_run(m.cold, stream_ring(m.cold, raw), b / m.stride);
  } else if (m.hot.active) {
    const int cold_before = b / m.stride + 1 < m.cold.active ? b / m.stride + 1 : m.cold.active;
    stream_run(m.hot, stream_ring(m.hot, raw), b - cold_before);
  }
}

/* Token-tile stages as cuBLAS's 2-CTA clusters load them (`tokpr`): CTA rank r of cluster
 * c streams 128-row weight tiles (the half r of a 256-row block that clusters c and c ^ 1
 * both read: two CTAs a weight tile, as the GEMM's two token tiles) and loads half of its
 * cluster's t_rows token rows into both CTAs (multicast, t_box = t_rows / 2 a box); a
 * stage goes back to both producers (each multicasts into both CTAs' stage). */
__global__ void __launch_bounds__(64, 1) stream_pair_kernel(const __grid_constant__ StreamArgs a) {
  extern __shared__ char raw[];
  const StreamRing q = stream_ring(a, raw);
  const int me = (int)blockIdx.x, c = me / 2, r = (int)cluster_ctarank();
  stream_init(a, q.full, q.empty, 2); /* q.empty: this CTA's consumer and the other's */
  cluster_sync();
  const int pairs = (int)gridDim.x / 4; /* weight blocks read at once */
  int stage = 0;
  uint32_t phase = 0;
  if (threadIdx.x == 0) { /* producer */
    for (int j = 0; j < a.tiles; ++j) {
      const int row0 = (((c / 2 + j * pairs) % (a.distinct / 2)) * 2 + r) * a.stage_rows;
      const int trow0 = ((c + j) % a.t_distinct) * a.t_rows + r * (a.t_rows / 2);
      for (int kb = 0; kb < a.k_blocks; ++kb) {
        while (!mbarrier_try_wait_parity(&q.empty[stage], phase ^ 1u)) {
        }
        q.stamp[stage] = (uint32_t)clock64();
        char *st = q.smem + stage * q.stage_bytes;
        mbarrier_arrive_expect_tx(&q.full[stage], (uint32_t)q.stage_bytes);
        tma_load_2d(st, &a.map, &q.full[stage], kb * 64, row0);
        tma_load_2d_multicast(st + (a.stage_rows + r * (a.t_rows / 2)) * 128, &a.map_t, &q.full[stage], kb * 64, trow0,
                              3);
        if (++stage == a.stages) stage = 0, phase ^= 1u;
      }
    }
  } else if (threadIdx.x == 32) { /* consumer */
    unsigned long long sum = 0, n = 0;
    int prev = -1;
    for (int j = 0; j < a.tiles; ++j)
      for (int kb = 0; kb < a.k_blocks; ++kb) {
        stream_use(a, &q.full[stage], q.stamp[stage], phase, sum, n);
        const int rel = a.hold ? prev : stage;
        if (rel >= 0) {
          mbarrier_arrive(&q.empty[rel]);
          mbarrier_arrive_remote_if(&q.empty[rel], (uint32_t)(r ^ 1), 1);
        }
        prev = stage;
        if (++stage == a.stages) stage = 0, phase ^= 1u;
      }
    if (a.hold) {
      mbarrier_arrive(&q.empty[prev]);
      mbarrier_arrive_remote_if(&q.empty[prev], (uint32_t)(r ^ 1), 1);
    }
    atomicAdd(&a.lat[0], sum);
    atomicAdd(&a.lat[1], n);
  }
  cluster_sync(); /* no CTA leaves while the other may still arrive on its barriers */
}

typedef struct cfg {
  const char *what;
  int active, stages, stage_rows, box_rows, share, l2;
  unsigned work;
  int hold, stride;
  int t_rows, t_box; /* rows of the second (L2-resident) matrix a stage; 0: none */
  int pair;          /* 1: 2-CTA clusters multicasting the token rows (stream_pair_kernel) */
} cfg;

/* The sweep: load (CTAs streaming at once), ring shape (stages x stage bytes), box
 * shape, reads in step, L2 against DRAM, and the GEMMs' own stage shapes with MMA time. */
static const cfg kSweep[] = {
    {"load", 1, 4, 256, 64, 1, 0, 0},      {"load", 16, 4, 256, 64, 1, 0, 0},
    {"load", 33, 4, 256, 64, 1, 0, 0},     {"load", 66, 4, 256, 64, 1, 0, 0},
    {"load", 132, 4, 256, 64, 1, 0, 0},    {"ring", 33, 2, 256, 64, 1, 0, 0},
    {"ring", 33, 3, 256, 64, 1, 0, 0},     {"ring", 33, 5, 256, 64, 1, 0, 0},
    {"ring", 33, 6, 256, 64, 1, 0, 0},     {"ring", 33, 4, 320, 64, 1, 0, 0},
    {"ring", 33, 5, 320, 64, 1, 0, 0},     {"ring", 33, 4, 416, 32, 1, 0, 0},
    {"ring", 33, 8, 128, 64, 1, 0, 0},     {"ring", 33, 12, 128, 64, 1, 0, 0},
    {"ring", 33, 16, 96, 32, 1, 0, 0},     {"ring", 132, 2, 256, 64, 1, 0, 0},
    {"ring", 132, 6, 256, 64, 1, 0, 0},    {"ring", 132, 12, 128, 64, 1, 0, 0},
    {"box", 33, 4, 256, 32, 1, 0, 0},      {"box", 33, 4, 256, 128, 1, 0, 0},
    {"box", 33, 4, 256, 256, 1, 0, 0},     {"box", 132, 4, 256, 256, 1, 0, 0},
    {"share", 132, 4, 256, 64, 2, 0, 0},   {"share", 132, 6, 256, 64, 2, 0, 0},
    {"l2", 1, 4, 256, 64, 1, 1, 0},        {"l2", 33, 4, 256, 64, 1, 1, 0},
    {"l2", 132, 4, 256, 64, 1, 1, 0},      {"l2", 132, 6, 256, 64, 1, 1, 0},
    {"l2", 132, 12, 128, 64, 1, 1, 0},
    /* down, qwen3.5 R320: 52 KB stages (256 weight + 160 token rows) of 0.88 us of MMAs,
     * 4 of them, two CTAs on each weight block; cuBLAS: 5 x 36 KB stages of 0.44 us */
    {"gemm", 132, 4, 416, 32, 2, 0, 1740}, {"gemm", 132, 5, 288, 32, 2, 0, 870},
    {"gemm", 132, 6, 288, 32, 2, 0, 870},  {"gemm", 132, 4, 416, 32, 2, 0, 0},
    {"gemm", 132, 4, 416, 32, 2, 0, 1740, 1},
    /* one-tile experts' weight streams on a third of the SMs: 40 KB stages (256 weight
     * rows + 64 token rows), the GEMMs' hold or not, CTAs 0 .. 32 or every fourth */
    {"single", 33, 4, 320, 64, 1, 0, 500, 1}, {"single", 33, 4, 320, 64, 1, 0, 500, 0},
    {"single", 33, 5, 320, 64, 1, 0, 500, 0}, {"single", 33, 4, 320, 64, 1, 0, 500, 0, 4},
    {"single", 33, 5, 320, 64, 1, 0, 500, 0, 4}, {"single", 16, 4, 320, 64, 1, 0, 500, 0, 8},
    /* token-tile stages as the GEMMs load them (run with --k 1024 for qwen3.5 down): weights
     * from DRAM, two CTAs a weight block, + 160 L2-resident token rows; the GEMMs' hold;
     * work = the MMA time of a stage at cuBLAS's speed (0.94 us for 256 x 160, 0.47 us for
     * 128 x 160 at ~1.85 GHz). cooperative 256-row tiles: 4 x 52 KB, rows in 32-row boxes or
     * one 160-row box; 128-row tiles: 5 x 36 KB; and each without work (the loads alone) */
    {"tok256", 132, 4, 256, 256, 2, 0, 1740, 1, 1, 160, 32}, {"tok256", 132, 4, 256, 256, 2, 0, 1740, 1, 1, 160, 160},
    {"tok256", 132, 4, 256, 256, 2, 0, 0, 0, 1, 160, 32},    {"tok128", 132, 5, 128, 128, 2, 0, 870, 1, 1, 160, 32},
    {"tok128", 132, 5, 128, 128, 2, 0, 870, 1, 1, 160, 160}, {"tok128", 132, 5, 128, 128, 2, 0, 0, 0, 1, 160, 32},
    {"tok128", 132, 5, 128, 128, 2, 0, 870, 0, 1, 160, 160}, {"tok256", 132, 4, 256, 256, 2, 0, 1740, 0, 1, 160, 160},
    /* cuBLAS's: 128-row weight tiles in 2-CTA clusters, each CTA multicasting 80 of the 160
     * token rows into both (share: two clusters a weight block; the hold, or none; loads alone) */
    {"tokpr", 132, 5, 128, 128, 2, 0, 870, 1, 1, 160, 80, 1}, {"tokpr", 132, 5, 128, 128, 2, 0, 870, 0, 1, 160, 80, 1},
    {"tokpr", 132, 5, 128, 128, 2, 0, 0, 0, 1, 160, 80, 1},   {"tokpr", 132, 6, 128, 128, 2, 0, 870, 1, 1, 160, 80, 1},
};

/* Mixed runs: a cold class on `cold_ctas` CTAs (block indices 0, stride, ...) beside a hot
 * class on every other CTA (hot.active 0: the cold class alone, the others idle). Cold:
 * one-tile experts' tiles, 256 weight rows from DRAM (each tile once) + 64 L2-resident
 * token rows a stage, 500 cycles of MMAs a stage, freed at once (as the GEMM's tiles of
 * <= 96 rows). Hot: a many-tile expert's 176-row tiles, 256 weight rows from L2 (4
 * distinct blocks) or DRAM read by two CTAs in step + 176 token rows, ~1 us of MMAs a
 * stage, held until the next lands (qwen3.5 Zipf gate+up's two classes). */
typedef struct mixed_cfg {
  const char *what;
  int cold_ctas, stride, cold_stages;
  int hot_l2;            /* hot weights: 1 L2-resident, 0 DRAM read by hot_share CTAs in step, -1 no hot class */
  unsigned hot_work;     /* hot class's hold a stage, cycles */
  int hot_stages, hot_rows;
  int cold_hint;         /* cold weights evict-first */
  int cold_tdram;        /* cold token rows from DRAM (each tile's its own) instead of L2 */
  int hot_share;         /* hot_l2 0: CTAs reading one weight tile in step (0: 2) */
  int cold_trows;        /* cold token rows a stage (0: 64) */
  unsigned cold_work;    /* cold MMA hold a stage, cycles (0: 500) */
} mixed_cfg;
static const mixed_cfg kMixed[] = {
    {"alone", 33, 1, 4, -1, 0, 4, 176},      {"alone", 33, 4, 4, -1, 0, 4, 176},
    {"mixed", 33, 1, 4, 1, 1920, 4, 176},    {"mixed", 33, 4, 4, 1, 1920, 4, 176},
    {"mixed", 33, 1, 5, 1, 1920, 4, 176},    {"mixed", 33, 1, 4, 0, 1920, 4, 176},
    {"mixed", 33, 1, 4, 1, 0, 4, 176},       {"mixed", 33, 1, 4, 1, 1920, 4, 64},
    {"mixed", 33, 1, 4, 1, 3840, 4, 176},    {"mixed", 66, 2, 4, 1, 1920, 4, 176},
    {"hotonly", 0, 1, 4, 1, 1920, 4, 176},
    {"hint", 33, 1, 4, -1, 0, 4, 176, 1, 0},   {"hint", 33, 1, 4, 1, 1920, 4, 176, 1, 0},
    {"tdram", 33, 1, 4, 1, 1920, 4, 176, 0, 1}, {"both", 33, 1, 4, 1, 1920, 4, 176, 1, 1},
    {"both", 33, 4, 4, 1, 1920, 4, 176, 1, 1},
    {"g48", 33, 1, 4, 1, 1920, 4, 176, 1, 0, 0, 48, 580}, {"g48", 33, 1, 4, 0, 1920, 4, 176, 1, 0, 4, 48, 580},
    {"g48", 33, 1, 4, 0, 1920, 4, 176, 1, 0, 8, 48, 580}, {"g96", 33, 1, 4, 0, 1920, 4, 176, 1, 0, 8, 96, 1160},
    {"g48", 33, 1, 4, 0, 1920, 4, 176, 1, 1, 8, 48, 580},
};

/* Fills a's streamed-matrix map and ring fields for `active` CTAs; rows of the second matrix
 * from the end of buf (8 tiles of t_rows, L2-resident). dram_off: where its DRAM tiles begin. */
static int stream_setup(StreamArgs *a, void *buf, size_t dram_bytes, size_t dram_off, int K, int active,
                        int stages, int stage_rows, int box_rows, int share, int l2, unsigned work, int hold,
                        int t_rows, int t_box, int tiles) {
  memset(a, 0, sizeof *a);
  const size_t tile_bytes = (size_t)stage_rows * K * 2;
  int distinct = l2 ? 4 : (int)((dram_bytes / 2) / tile_bytes);
  const int groups = active / share > 0 ? active / share : 1;
  if (!l2 && distinct > groups * tiles) distinct = groups * tiles;
  if (mok_gemm_tma_map(&a->map, (char *)buf + dram_off, (uint64_t)K, (uint64_t)distinct * stage_rows,
                       (uint32_t)box_rows) != mokSuccess ||
      (t_rows && mok_gemm_tma_map(&a->map_t, (char *)buf + dram_bytes - (size_t)8 * t_rows * K * 2, (uint64_t)K,
                                  (uint64_t)8 * t_rows, (uint32_t)t_box) != mokSuccess)) {
    fprintf(stderr, "bench stream: %s\n", mokGetLastError());
    return 1;
  }
  a->k_blocks = K / 64, a->stage_rows = stage_rows, a->box_rows = box_rows, a->stages = stages;
  a->tiles = tiles, a->share = share, a->active = active, a->distinct = distinct, a->work = work;
  a->hold = hold, a->stride = 1, a->t_rows = t_rows, a->t_box = t_box, a->t_distinct = 8;
  return 0;
}

static int run_mixed(void *buf, size_t dram_bytes, int K, int sms, int reps, double clock_mhz,
                     unsigned long long *lat, unsigned long long *clk) {
  printf("\nmixed: a cold class (one-tile experts' weight streams from DRAM) beside a hot class\n"
         "(176-row tiles, weights from L2 or DRAM in pairs); per class: GB/s per CTA over each CTA's own\n"
         "span (mean), issue->use us, span us (first start .. last end)\n");
  printf("%-7s %5s %6s %6s %6s %6s %5s %4s %5s | %9s %9s %8s | %5s %9s %9s %8s\n", "what", "cold", "stride",
         "stages", "hot", "work", "rows", "hint", "tdram", "cold GB/s", "iss->use", "span", "hot", "hot GB/s", "iss->use",
         "span");
  for (size_t c = 0; c < sizeof kMixed / sizeof kMixed[0]; ++c) {
    const mixed_cfg f = kMixed[c];
    const int stride = f.stride > 1 ? f.stride : 1;
    const int cold = f.cold_ctas * stride <= sms ? f.cold_ctas : sms / stride;
    const int hot = f.hot_l2 < 0 ? 0 : sms - cold;
    MixedArgs m;
    memset(&m, 0, sizeof m);
    m.stride = stride;
    /* cold: 8 tiles of 256 x K a CTA (16 MB at K = 4096), DRAM first half; hot: 2x their time */
    const int ctr = f.cold_trows ? f.cold_trows : 64;
    if (stream_setup(&m.cold, buf, dram_bytes, 0, K, cold, f.cold_stages, 256, 256, 1, 0,
                     f.cold_work ? f.cold_work : 500, 0, ctr, ctr, 8))
      return 1;
    m.cold.hint = f.cold_hint;
    if (f.cold_tdram) { /* each cold tile its own 64 token rows, from the first half's end (past L2) */
      const uint64_t trows = (uint64_t)cold * 8 * ctr;
      if (mok_gemm_tma_map(&m.cold.map_t, (char *)buf + dram_bytes / 2 - trows * K * 2, (uint64_t)K, trows,
                           (uint32_t)ctr) != mokSuccess) {
        fprintf(stderr, "bench stream: %s\n", mokGetLastError());
        return 1;
      }
      m.cold.t_distinct = (int)(trows / ctr);
    }
    const int hot_tiles = f.hot_work ? 16 : 48;
    if (hot && stream_setup(&m.hot, buf, dram_bytes, dram_bytes / 2, K, hot, f.hot_stages, 256, 256,
                            f.hot_l2 ? 1 : f.hot_share ? f.hot_share : 2, f.hot_l2, f.hot_work, 1, f.hot_rows, f.hot_rows > 128 ? 88 : f.hot_rows,
                            hot_tiles))
      return 1;
    m.cold.lat = lat, m.hot.lat = lat + 2, m.cold.clk = clk, m.hot.clk = clk;
    const size_t ring_c = (size_t)f.cold_stages * (256 + ctr) * 128 + (size_t)f.cold_stages * 20;
    const size_t ring_h = hot ? (size_t)f.hot_stages * (256 + f.hot_rows) * 128 + (size_t)f.hot_stages * 20 : 0;
    const size_t smem = 1024 + 64 + (ring_c > ring_h ? ring_c : ring_h);
    if (smem > 232448) {
      fprintf(stderr, "bench stream: mixed config %zu needs %zu bytes of shared memory\n", c, smem);
      return 1;
    }
    BS_CHECK(cudaFuncSetAttribute(stream_mixed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    double cold_gbs = 0, hot_gbs = 0, cold_span = 0, hot_span = 0, cold_lat = 0, hot_lat = 0;
    const int n = reps < 16 ? reps : 16;
    unsigned long long h[4], *t = (unsigned long long *)malloc((size_t)sms * 2 * sizeof *t);
    if (!t) return 1;
    for (int r = -1; r < n; ++r) {
      BS_CHECK(cudaMemset(lat, 0, 4 * sizeof *lat));
      BS_CHECK(cudaMemset(clk, 0, (size_t)sms * 2 * sizeof *clk));
      stream_mixed_kernel<<<sms, 64, smem>>>(m);
      BS_CHECK(cudaDeviceSynchronize());
      BS_CHECK(cudaGetLastError());
      if (r < 0) continue;
      BS_CHECK(cudaMemcpy(h, lat, sizeof h, cudaMemcpyDeviceToHost));
      BS_CHECK(cudaMemcpy(t, clk, (size_t)sms * 2 * sizeof *t, cudaMemcpyDeviceToHost));
      const double cold_bytes = 8.0 * ((size_t)256 + ctr) * K * 2;
      const double hot_bytes = (double)hot_tiles * ((size_t)256 + f.hot_rows) * K * 2;
      unsigned long long c0 = ~0ull, c1 = 0, h0 = ~0ull, h1 = 0;
      double cg = 0, hg = 0;
      for (int b = 0; b < sms; ++b) {
        if (!t[2 * b + 1]) continue; /* idle CTA */
        const bool is_cold = b % stride == 0 && b / stride < cold;
        const double span = (double)(t[2 * b + 1] - t[2 * b]);
        if (is_cold) cg += cold_bytes / span, c0 = t[2 * b] < c0 ? t[2 * b] : c0, c1 = t[2 * b + 1] > c1 ? t[2 * b + 1] : c1;
        else hg += hot_bytes / span, h0 = t[2 * b] < h0 ? t[2 * b] : h0, h1 = t[2 * b + 1] > h1 ? t[2 * b + 1] : h1;
      }
      cold_gbs += cg / cold / n, cold_span += (c1 - c0) * 1e-3 / n;
      cold_lat += (h[1] ? (double)h[0] / h[1] / clock_mhz : 0) / n;
      if (hot) {
        hot_gbs += hg / hot / n, hot_span += (h1 - h0) * 1e-3 / n;
        hot_lat += (h[3] ? (double)h[2] / h[3] / clock_mhz : 0) / n;
      }
    }
    free(t);
    printf("%-7s %5d %6d %6d %6s %6u %5d %4d %5d | %9.1f %9.2f %8.1f | %5d %9.1f %9.2f %8.1f\n", f.what, cold,
           stride, f.cold_stages, f.hot_l2 < 0 ? "-" : f.hot_l2 ? "L2" : f.hot_share == 8 ? "DRAM8" : f.hot_share == 4 ? "DRAM4" : "DRAM2", f.hot_work, f.hot_rows, f.cold_hint,
           f.cold_tdram, cold_gbs, cold_lat, cold_span, hot, hot_gbs, hot_lat, hot_span);
  }
  return 0;
}

/* ---- --two-streams: do two launches on two streams run at once? ------------------------
 * Launch A (a GEMM-like CTA: 384 threads, ~227 KB of shared memory, on `a_ctas` CTAs) and,
 * after it, launch B (32 threads, 40 KB, on `b_ctas` CTAs, so none fits beside an A CTA)
 * on another stream. Every CTA of each adds 1 to its launch's counter, then waits (up to
 * 100 ms) until the other launch's counter holds all of its CTAs. Both see each other only
 * if both launches had all their CTAs resident at once: the premise of a second launch
 * beside a persistent kernel (the L2 warmer of session 31) and of several ranks' persistent
 * kernels on one GPU (a loopback communicator for tests). */
__global__ void __launch_bounds__(384, 1) meet_kernel(unsigned *mine, const unsigned *other, unsigned need,
                                                      int *met, unsigned long long budget_ns) {
  if (threadIdx.x != 0) return;
  atomicAdd(mine, 1u);
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    if (*(const volatile unsigned *)other >= need) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > budget_ns) {
      atomicExch(met, 0);
      return;
    }
    __nanosleep(1000);
  }
}

/* One probe: A on stream sa (0: the legacy default stream), B on sb. 1 = they met. */
static int meet_once(int a_ctas, int b_ctas, int big_b, cudaStream_t sa, cudaStream_t sb, unsigned *ctr, int *met,
                     int *out) {
  BS_CHECK(cudaMemset(ctr, 0, 2 * sizeof(unsigned)));
  const int one = 1;
  BS_CHECK(cudaMemcpy(met, &one, sizeof one, cudaMemcpyHostToDevice));
  BS_CHECK(cudaDeviceSynchronize());
  meet_kernel<<<a_ctas, 384, 227 << 10, sa>>>(ctr, ctr + 1, (unsigned)b_ctas, met, 100000000ull);
  if (big_b) meet_kernel<<<b_ctas, 384, 227 << 10, sb>>>(ctr + 1, ctr, (unsigned)a_ctas, met, 100000000ull);
  else meet_kernel<<<b_ctas, 32, 40 << 10, sb>>>(ctr + 1, ctr, (unsigned)a_ctas, met, 100000000ull);
  BS_CHECK(cudaGetLastError());
  BS_CHECK(cudaDeviceSynchronize());
  BS_CHECK(cudaMemcpy(out, met, sizeof *out, cudaMemcpyDeviceToHost));
  return 0;
}

static int run_two_streams(int sms) {
  const char *conn = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  printf("mok bench stream --two-streams: %d SMs, CUDA_DEVICE_MAX_CONNECTIONS=%s\n", sms, conn ? conn : "(unset)");
  BS_CHECK(cudaFuncSetAttribute(meet_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 << 10));
  unsigned *ctr = NULL;
  int *met = NULL;
  BS_CHECK(cudaMalloc(&ctr, 2 * sizeof(unsigned)));
  BS_CHECK(cudaMalloc(&met, sizeof(int)));
  cudaStream_t nb[2];
  for (int i = 0; i < 2; ++i) BS_CHECK(cudaStreamCreateWithFlags(&nb[i], cudaStreamNonBlocking));
  static const struct { int a_minus, b, legacy, big_b; const char *what; } cases[] = {
      {8, 8, 1, 0, "A on the legacy stream, B on a non-blocking one, A + B = all SMs"},
      {8, 8, 0, 0, "both on non-blocking streams, A + B = all SMs"},
      {-1, 0, 0, 1, "two ranks' halves: A and B each on half the SMs, B as large a CTA as A"},
      {4, 4, 0, 0, "A + B = all SMs - 4"},
      {0, 8, 0, 0, "A on every SM (B cannot fit: expected not to meet)"},
  };
  printf("| case | A CTAs | B CTAs | met |\n|---|---|---|---|\n");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    int a = sms - cases[i].a_minus, b = cases[i].b, out = -1;
    if (cases[i].a_minus == -1) a = sms / 2, b = sms - sms / 2;
    if (meet_once(a, b, cases[i].big_b, cases[i].legacy ? (cudaStream_t)0 : nb[0], nb[1], ctr, met, &out)) return 1;
    printf("| %s | %d | %d | %s |\n", cases[i].what, a, b, out == 1 ? "yes" : "no (100 ms)");
  }
  for (int i = 0; i < 2; ++i) cudaStreamDestroy(nb[i]);
  cudaFree(ctr);
  cudaFree(met);
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: mok bench stream [--k K] [--reps N] [--mixed | --two-streams]\n"
          "  TMA streams into shared memory, one SM each, over a sweep of loads, ring shapes,\n"
          "  box shapes, reads in step, L2 vs DRAM and the GEMMs' token-tile stages (weights\n"
          "  streamed + L2-resident rows, alone or in 2-CTA clusters multicasting the rows)\n"
          "  (diagnostics; tools/bench_stream.cu).\n"
          "  --k: columns of the streamed matrix (a tile's k-blocks = K / 64; default 4096)\n"
          "  --mixed: instead, one-tile experts' streams beside many-tile experts' tiles (run_mixed)\n"
          "  --two-streams: instead, whether two launches on two streams are resident at once\n"
          "  (run_two_streams: a persistent launch and a second one beside it)\n");
}

extern "C" int mok_bench_stream_main(int argc, char **argv) {
  int K = 4096, reps = 5, mixed = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--mixed")) { mixed = 1; continue; }
    if (!strcmp(argv[i], "--two-streams")) { mixed = 2; continue; }
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || i + 1 >= argc) { usage(); return 2; }
    if (!strcmp(argv[i], "--k")) K = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    else { fprintf(stderr, "bench stream: unknown option %s\n", argv[i]); usage(); return 2; }
  }
  if (K < 64 || K % 64 || reps < 1) { fprintf(stderr, "bench stream: --k a multiple of 64, --reps >= 1\n"); return 2; }
  int sms = 0, clock_khz = 0;
  BS_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  BS_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  if (mixed == 2) return run_two_streams(sms);
  const size_t dram_bytes = (size_t)3 << 30; /* past any L2 */
  void *buf = NULL;
  unsigned long long *lat = NULL;
  BS_CHECK(cudaMalloc(&buf, dram_bytes));
  BS_CHECK(cudaMemset(buf, 0x3c, dram_bytes));
  BS_CHECK(cudaMalloc(&lat, 4 * sizeof *lat));
  if (mixed) {
    unsigned long long *clk = NULL;
    BS_CHECK(cudaMalloc(&clk, (size_t)sms * 2 * sizeof *clk));
    printf("mok bench stream --mixed: K %d, %d SMs, clock %.0f MHz, %d reps (mean)\n", K, sms, clock_khz / 1e3, reps);
    const int rc = run_mixed(buf, dram_bytes, K, sms, reps, clock_khz * 1e-3, lat, clk);
    cudaFree(clk);
    cudaFree(buf);
    cudaFree(lat);
    return rc;
  }
  BS_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
  BS_CHECK(cudaFuncSetAttribute(stream_pair_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
  cudaEvent_t e0, e1;
  BS_CHECK(cudaEventCreate(&e0));
  BS_CHECK(cudaEventCreate(&e1));
  printf("mok bench stream: K %d, %d SMs, clock %.0f MHz, %d reps (median)\n", K, sms, clock_khz / 1e3, reps);
  printf("%-6s %6s %6s %6s %8s %5s %5s %4s %6s %4s %10s %9s %9s %12s %9s %5s\n", "what", "CTAs", "stride", "stages",
         "stage KB", "box", "share", "src", "work", "hold", "time us", "GB/s/CTA", "TB/s", "issue->use us", "us/stage",
         "tbox");
  for (size_t c = 0; c < sizeof kSweep / sizeof kSweep[0]; ++c) {
    const cfg f = kSweep[c];
    const int stride = f.stride > 1 ? f.stride : 1;
    const int active = f.active * stride <= sms ? f.active : sms / stride;
    const size_t tile_bytes = (size_t)f.stage_rows * K * 2;
    const int tiles = (int)((64ull << 20) / tile_bytes) > 0 ? (int)((64ull << 20) / tile_bytes) : 1; /* ~64 MB a CTA */
    const int groups = active / f.share;
    int distinct = f.l2 ? 4 : (int)(dram_bytes / tile_bytes);
    if (!f.l2 && distinct > groups * tiles) distinct = groups * tiles;
    StreamArgs a;
    memset(&a, 0, sizeof a);
    if (mok_gemm_tma_map(&a.map, buf, (uint64_t)K, (uint64_t)distinct * f.stage_rows, (uint32_t)f.box_rows) !=
        mokSuccess) {
      fprintf(stderr, "bench stream: %s\n", mokGetLastError());
      return 1;
    }
    a.k_blocks = K / 64, a.stage_rows = f.stage_rows, a.box_rows = f.box_rows, a.stages = f.stages;
    a.tiles = tiles, a.share = f.share, a.active = active, a.distinct = distinct, a.work = f.work, a.lat = lat;
    a.hold = f.hold, a.stride = stride;
    if (f.t_rows) { /* a small second matrix: 8 tiles of t_rows rows (in L2 after first use) */
      a.t_rows = f.t_rows, a.t_box = f.t_box, a.t_distinct = 8;
      if (mok_gemm_tma_map(&a.map_t, (char *)buf + dram_bytes - (size_t)8 * f.t_rows * K * 2, (uint64_t)K,
                           (uint64_t)8 * f.t_rows, (uint32_t)f.t_box) != mokSuccess) {
        fprintf(stderr, "bench stream: %s\n", mokGetLastError());
        return 1;
      }
    }
    const size_t smem = 1024 + (size_t)f.stages * (f.stage_rows + f.t_rows) * 128 + (size_t)f.stages * (16 + 4) + 64;
    if (smem > 232448) {
      fprintf(stderr, "bench stream: config %zu needs %zu bytes of shared memory\n", c, smem);
      return 1;
    }
    float ms[16];
    const int n = reps < 16 ? reps : 16;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t pc = {};
    pc.gridDim = dim3((unsigned)(active & ~3)); /* whole pairs of clusters */
    pc.blockDim = dim3(64);
    pc.dynamicSmemBytes = smem;
    pc.attrs = attr;
    pc.numAttrs = 1;
    if (f.pair) {
      int clusters = 0;
      BS_CHECK(cudaOccupancyMaxActiveClusters(&clusters, stream_pair_kernel, &pc));
      if (clusters * 2 < (int)pc.gridDim.x)
        printf("(only %d clusters of 2 fit at once: the next row runs in waves)\n", clusters);
    }
    for (int r = -1; r < n; ++r) {
      BS_CHECK(cudaMemset(lat, 0, 2 * sizeof *lat));
      BS_CHECK(cudaEventRecord(e0));
      if (f.pair) BS_CHECK(cudaLaunchKernelEx(&pc, stream_pair_kernel, a));
      else stream_kernel<<<sms, 64, smem>>>(a);
      BS_CHECK(cudaEventRecord(e1));
      BS_CHECK(cudaEventSynchronize(e1));
      BS_CHECK(cudaGetLastError());
      if (r >= 0) BS_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    for (int i = 1; i < n; ++i) /* insertion sort: median */
      for (int j = i; j > 0 && ms[j] < ms[j - 1]; --j) { const float t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t; }
    const double t = ms[n / 2] * 1e-3;
    unsigned long long h[2];
    BS_CHECK(cudaMemcpy(h, lat, sizeof h, cudaMemcpyDeviceToHost));
    const double per_cta = (double)tiles * (tile_bytes + (size_t)f.t_rows * K * 2);
    printf("%-6s %6d %6d %6d %8.1f %5d %5d %4s %6u %4d %10.1f %9.1f %9.2f %12.2f %9.3f %5d\n", f.what, active, stride,
           f.stages, (f.stage_rows + f.t_rows) * 128 / 1024.0, f.box_rows, f.share, f.l2 ? "L2" : "DRAM", f.work, f.hold,
           t * 1e6, per_cta / t / 1e9, (double)tiles * tile_bytes * groups / t / 1e12,
           h[1] ? (double)h[0] / h[1] / (clock_khz * 1e-3) : 0.0, t * 1e6 / ((double)tiles * (K / 64)), f.t_box);
  }
  cudaFree(buf);
  cudaFree(lat);
  return 0;
}
