/*
 * testdata.cu — device twin of the counter-based generator (testdata.h): the same
 * inline functions, so every element is bit-identical to mokGenerateBf16's.
 */
#include <cuda_runtime.h>

#include "internal.h"
#include "kernels_load.h"
#include "testdata.h"

__global__ void k_generate_bf16(uint64_t key, int64_t first, int64_t count, float scale, uint16_t *dst) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = mok_gen_bf16(key, first + i, scale);
}

extern "C" mokResult_t mokGenerateBf16Device(uint64_t seed, mokTensorKind_t kind, int64_t sub, int64_t first,
                                             int64_t count, float scale, mokBf16 *dst, cudaStream_t stream) {
  mok_clear_error();
  if (count < 0 || first < 0)
    return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16Device: first (%lld) and count (%lld) must be >= 0",
                     (long long)first, (long long)count);
  if ((int)kind < mokTensorX || (int)kind > mokTensorRouting)
    return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16Device: unknown tensor kind %d", (int)kind);
  if (count == 0) return mokSuccess;
  if (!dst) return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16Device: dst is NULL");
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, dst) != cudaSuccess || attr.type == cudaMemoryTypeHost ||
      attr.type == cudaMemoryTypeUnregistered) {
    cudaGetLastError();
    return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16Device: dst is not device memory");
  }
  int64_t blocks = (count + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  k_generate_bf16<<<(unsigned)blocks, 256, 0, stream>>>(mok_tensor_key(seed, (int)kind, sub), first, count, scale, dst);
  CUDA_CHECK(NULL, cudaGetLastError());
  return mokSuccess;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
extern "C" mokKernelAnchor mok_anchor_testdata(void) {
  mokKernelAnchor a = {"src/testdata.cu", (const void *)k_generate_bf16, {NULL}};
  return a;
}
