/*
 * gemm_ffn.cu — the fused forward launch (gemm/ffn_fwd.cuh), compiled apart from gemm.cu
 * (which builds its arguments: mok_gemm_ffn_fwd) so that the two kernels' files build in
 * parallel.
 */
#include "gemm.h"

#include <cuda_runtime.h>
#include <string.h>

#include "gemm/ffn_fwd.cuh" /* defines: mok_sm90::ffn_fwd_kernel, FfnArgs */
#include "internal.h"       /* defines: mok_error, CUDA_CHECK */
#include "kernels_load.h"

using namespace mok_sm90;

/* The ready counters (and ticket counters) of the fused launches: a ring of slots, one per launch in turn, zero
 * between launches (the launch's last role zeroes its slot), as the scheduler's slots
 * (gemm.cu): a launch fills every SM, so two running launches never share one. */
constexpr int kFfnRing = 16;
__device__ uint32_t g_ffn_ready[kFfnRing][MOK_GEMM_MAX_EXPERTS + kFfnCounters];
static unsigned g_ffn_next; /* __atomic_* */

/* The current device can run a kernel of `smem` bytes of shared memory a CTA (Hopper, the
 * opt-in size): its SM count in *sms; else mokNotSupported naming `what`. */
static mokResult_t ffn_device(const char *what, int smem, int *sms) {
  int dev = 0, major = 0, optin = 0;
  CUDA_CHECK(NULL, cudaGetDevice(&dev));
  CUDA_CHECK(NULL, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9)
    return mok_error(NULL, mokNotSupported, "%s: needs a Hopper GPU (sm_90a), device %d is sm_%d", what, dev, major * 10);
  CUDA_CHECK(NULL, cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(NULL, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > optin)
    return mok_error(NULL, mokNotSupported, "%s: needs %d bytes of shared memory per block, device has %d", what, smem,
                     optin);
  return mokSuccess;
}

/* A launch's arguments: both kinds' tiles and the next slot of a counter ring (`words` a
 * slot, slot index from *next). */
static FfnArgs ffn_args(const GemmTileArgs &gu, const GemmTileArgs &dn, void *ring, size_t words, unsigned *next) {
  FfnArgs f;
  memset(&f, 0, sizeof f);
  f.gu = gu;
  f.dn = dn;
  f.ready = static_cast<uint32_t *>(ring) + words * (__atomic_fetch_add(next, 1u, __ATOMIC_RELAXED) % kFfnRing);
  return f;
}

mokResult_t mok_gemm_ffn_launch(const GemmTileArgs &gu, const GemmTileArgs &dn, int ring128, int64_t max_tiles,
                                cudaStream_t stream) {
  int sms = 0;
  const int smem = ring128 ? FfnRing<kTokRing128>::kSmemBytes : FfnRing<kTokMaxUnits>::kSmemBytes;
  MOK_CHECK(ffn_device("fused expert forward", smem, &sms));
  void (*kernel)(FfnArgs) = ring128 ? ffn_fwd_kernel<kTokRing128> : ffn_fwd_kernel<kTokMaxUnits>;
  CUDA_CHECK(NULL, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  void *ready = nullptr;
  CUDA_CHECK(NULL, cudaGetSymbolAddress(&ready, g_ffn_ready));
  const FfnArgs f = ffn_args(gu, dn, ready, MOK_GEMM_MAX_EXPERTS + kFfnCounters, &g_ffn_next);
  const int64_t grid = max_tiles < 1 ? 1 : max_tiles < sms ? max_tiles : sms;
  kernel<<<(unsigned)grid, kThreads, (size_t)smem, stream>>>(f);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

/* The megakernel's counters: the fused launch's, then x_ready[E], its tickets and done[E + 1]
 * (ffn_fwd.cuh: mega_ctr, mega_aux, mega_done), a ring of slots as above. */
constexpr int kMegaWords = ffn_counter_words(MOK_GEMM_MAX_EXPERTS, true);
__device__ uint32_t g_mega_ready[kFfnRing][kMegaWords];
static unsigned g_mega_next; /* __atomic_* */

mokResult_t mok_gemm_ffn_mega_launch(const GemmTileArgs &gu, const GemmTileArgs &dn, const GemmTileArgs *sgu,
                                     const GemmTileArgs *sdn, const mokFfnMega_t *mega, mokBf16 *xg, const mokBf16 *y,
                                     int hidden, cudaStream_t stream) {
  int sms = 0;
  const int smem = FfnRing<kTokMaxUnits>::kSmemBytes;
  MOK_CHECK(ffn_device("forward megakernel", smem, &sms));
  if (mega->ctas > sms)
    return mok_error(NULL, mokInvalidArgument, "forward megakernel: ctas %d > %d SMs (a CTA an SM, all resident)",
                     mega->ctas, sms);
  if (mega->ctas > 0) sms = mega->ctas;
  if (mega->comm_ctas >= sms)
    return mok_error(NULL, mokInvalidArgument, "forward megakernel: comm_ctas %d leaves no CTA for the tiles (%d CTAs)",
                     mega->comm_ctas, sms);
  void (*kernel)(FfnMegaArgs) = ffn_fwd_kernel<kTokMaxUnits, true>;
  CUDA_CHECK(NULL, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  void *ready = nullptr;
  CUDA_CHECK(NULL, cudaGetSymbolAddress(&ready, g_mega_ready));
  FfnMegaArgs f;
  memset(&f, 0, sizeof f);
  static_cast<FfnArgs &>(f) = ffn_args(gu, dn, ready, kMegaWords, &g_mega_next);
  if (sgu && sdn) f.s.gu = *sgu, f.s.dn = *sdn, f.s.on = 1;
  f.m.src = reinterpret_cast<const uint4 *>(mega->x);
  f.m.xg = reinterpret_cast<uint4 *>(xg);
  f.m.row_tok = mega->row_tok;
  f.m.row_route = mega->row_route;
  f.m.x_src = reinterpret_cast<const uint4 *const *>(mega->x_src);
  f.m.t_max = mega->t_max;
  f.m.topk = mega->topk;
  f.m.bad = mega->bad;
  f.m.row_u4 = hidden / 8;
  f.m.comm_ctas = mega->comm_ctas;
  if (mega->push) { /* the push in the launch (mok_gemm_ffn_mega checked it) */
    f.m.push = 1;
    f.m.push_off = mega->push_off;
    f.m.y = reinterpret_cast<const uint4 *>(y);
  }
  if (mega->out && mega->tokens > 0) { /* the combine in the launch (mok_gemm_ffn_mega checked it) */
    f.m.route_row = mega->route_row;
    f.m.topk_w = mega->topk_w;
    f.m.topk = mega->topk;
    f.m.y = reinterpret_cast<const uint4 *>(y);
    f.m.cbase = reinterpret_cast<const uint4 *>(mega->base);
    f.m.out = reinterpret_cast<uint4 *>(mega->out);
    f.m.tokens = mega->tokens;
    f.m.cbase_wait = mega->base && f.s.on && mega->base == mega->s_y;
  }
  kernel<<<(unsigned)sms, kThreads, (size_t)smem, stream>>>(f);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
extern "C" mokKernelAnchor mok_anchor_gemm_ffn(void) {
  mokKernelAnchor a = {"src/gemm_ffn.cu", (const void *)ffn_fwd_kernel<kTokRing128>,
                       {(const void *)g_ffn_ready, (const void *)g_mega_ready, NULL}};
  return a;
}
