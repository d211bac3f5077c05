/*
 * route_rows.cuh — device steps on one route's row that more than one kernel runs and that
 * must give the same bits everywhere (the EP1 backward in baseline.cu, the expert-parallel
 * one in ep_dev.cu; the combine's sums in layer_mega.cu's k_combine_rows and inside the
 * forward megakernel, gemm/ffn_fwd.cuh).
 */
#ifndef MOK_ROUTE_ROWS_CUH
#define MOK_ROUTE_ROWS_CUH

#include <stdint.h>

#include "bf16.h" /* defines: mok_bf16_to_f32, mok_f32_to_bf16 */

/* A warp on one route: d = its token's d_out row [H], y = its forward y row [H], which
 * becomes its dY row bf16(wt * d); returns <d, y> (fp32: each lane's sum over h = lane,
 * lane + 32, ..., then an xor tree; every lane gets it). Warp-uniform call. */
__device__ __forceinline__ float mok_dtopk_dy_row(const uint16_t *d, uint16_t *y, float wt, int H, int lane) {
  float s = 0.f;
  for (int h = lane; h < H; h += 32) {
    const float dv = mok_bf16_to_f32(d[h]);
    s += dv * mok_bf16_to_f32(y[h]);
    y[h] = mok_f32_to_bf16(wt * dv);
  }
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

/* The combine's arithmetic on 8 columns (one uint4 of bf16): acc starts from the base row's
 * values (or zeros), each route adds wt * its row's values in route order, and the sums go
 * back to bf16. Every combine (k_combine_rows, the megakernel's) runs these three steps, so
 * their outputs agree bit for bit. */
__device__ __forceinline__ void mok_comb_init(float acc[8], const uint4 *b) {
  if (b) {
    const uint32_t bw[4] = {b->x, b->y, b->z, b->w};
    for (int q = 0; q < 4; q++)
      acc[2 * q] = mok_bf16_to_f32((uint16_t)(bw[q] & 0xffffu)), acc[2 * q + 1] = mok_bf16_to_f32((uint16_t)(bw[q] >> 16));
  } else {
    for (int q = 0; q < 8; q++) acc[q] = 0.f;
  }
}
__device__ __forceinline__ void mok_comb_add(float acc[8], uint4 v, float wt) {
  const uint32_t vw[4] = {v.x, v.y, v.z, v.w};
  for (int q = 0; q < 4; q++) {
    acc[2 * q] += wt * mok_bf16_to_f32((uint16_t)(vw[q] & 0xffffu));
    acc[2 * q + 1] += wt * mok_bf16_to_f32((uint16_t)(vw[q] >> 16));
  }
}
__device__ __forceinline__ uint4 mok_comb_pack(const float acc[8]) {
  uint32_t ow[4];
  for (int q = 0; q < 4; q++)
    ow[q] = (uint32_t)mok_f32_to_bf16(acc[2 * q]) | (uint32_t)mok_f32_to_bf16(acc[2 * q + 1]) << 16;
  return make_uint4(ow[0], ow[1], ow[2], ow[3]);
}

#endif /* MOK_ROUTE_ROWS_CUH */
