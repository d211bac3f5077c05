/* A kernel whose wgmmas ptxas must serialise (a wgmma in a function left out of line: its
 * pipeline crosses the call, ptxas C7510). Not part of any binary: `make check-wgmma-guard`
 * compiles it through the .cu rule and passes only if that rule fails the compile, so that
 * a ptxas whose notes the rule no longer recognises shows up as a failed test. */
#include "gemm/sm90_primitives.cuh"

using namespace mok_sm90;

__device__ __noinline__ void guard_mma(float (&acc)[16], uint64_t da, uint64_t db) {
  wgmma_fence();
  wgmma_m64n32k16_bf16<0, 0>(acc, da, db, 1);
  wgmma_commit_group();
}

__global__ void guard_kernel(float *out, const float *in, uint64_t da, uint64_t db) {
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = in[threadIdx.x + 128 * i];
  guard_mma(acc, da, db);
  guard_mma(acc, da + 2, db + 2);
  wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < 16; ++i) out[threadIdx.x + 128 * i] = acc[i];
}
