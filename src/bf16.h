/*
 * bf16.h — bf16 <-> fp32 conversion usable from host C and device CUDA code alike,
 * bit-exact with the GPU's cvt.rn.bf16.f32 (round to nearest even, NaN kept quiet).
 */
#ifndef MOK_BF16_H
#define MOK_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define MOK_HD __host__ __device__ __forceinline__
#else
#define MOK_HD static inline
#endif

MOK_HD float mok_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

MOK_HD uint16_t mok_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Round a double as the GPU would: fp32 accumulator, then bf16 store. */
MOK_HD double mok_round_bf16(double v) { return (double)mok_bf16_to_f32(mok_f32_to_bf16((float)v)); }

#endif /* MOK_BF16_H */
