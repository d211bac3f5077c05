/*
 * route_rows.cuh — device steps on one route's row that more than one kernel runs and that
 * must give the same bits everywhere (the EP1 backward in baseline.cu, the expert-parallel
 * one in ep_dev.cu).
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

#endif /* MOK_ROUTE_ROWS_CUH */
