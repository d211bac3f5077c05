/*
 * testdata.h — the counter-based test-data hash (DESIGN.md section 2a), as host/device
 * inline functions so the CPU and the GPU generate bit-identical tensors: element i of
 * tensor (kind, sub) under a seed is a pure function of (seed, kind, sub, i).
 */
#ifndef MOK_TESTDATA_H
#define MOK_TESTDATA_H

#include <stdint.h>

#include "bf16.h"

/* splitmix64 finaliser: a bijective 64-bit mixer. */
MOK_HD uint64_t mok_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Per-tensor key; hashing the element index under it gives the element's bits. */
MOK_HD uint64_t mok_tensor_key(uint64_t seed, int kind, int64_t sub) {
  return mok_mix64(mok_mix64(seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(kind + 1))) + (uint64_t)sub);
}
MOK_HD uint64_t mok_element_bits(uint64_t key, int64_t index) { return mok_mix64(key + 0x632be59bd9b4e019ull * (uint64_t)index); }

/* Uniform in [0, 1) with 24 bits. */
MOK_HD float mok_bits_to_unit(uint64_t bits) { return (float)(bits >> 40) * (1.0f / 16777216.0f); }

/* Element of a bf16 test tensor: scale * U(-sqrt(3), sqrt(3)), rounded to bf16.
 * Only exact operations before the two products, so host and device agree bitwise. */
MOK_HD uint16_t mok_gen_bf16(uint64_t key, int64_t index, float scale) {
  float u = mok_bits_to_unit(mok_element_bits(key, index));
  float v = (2.0f * u - 1.0f) * 1.7320508075688772f;
  return mok_f32_to_bf16(v * scale);
}

#endif /* MOK_TESTDATA_H */
