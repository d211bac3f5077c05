/*
 * test_plan_gpu.cu — the megakernel's plan (src/plan.h) built on the device by one thread,
 * as the megakernel will build it, equals the host's build word for word, and so do the
 * backward's orders (mok_plan_bwd_orders), for random routings (the CPU models in
 * test_plan.c check the host's).
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "test.h"
#include "util.h"

enum { kMaxE = 64 };

/* The plan, then the backward's orders into bwd (comm, then compute at bwd + half). */
__global__ void plan_build_kernel(const int32_t *off, const int32_t *count, int E, int32_t mb_rows, int32_t ring_rows,
                                  int32_t max_tiles, int32_t *buf, int32_t *bwd, int32_t half, int32_t *out) {
  mokPlan_t p;
  mok_plan_place(&p, buf, max_tiles);
  out[0] = mok_plan_build(off, count, E, MOK_PLAN_TILE_MAX_UNITS, mb_rows, ring_rows, max_tiles, &p);
  out[1] = p.num_tiles, out[2] = p.num_mb, out[3] = p.num_mac;
  out[4] = out[0] ? -1 : mok_plan_bwd_orders(&p, E, bwd, &out[5], bwd + half, &out[6]);
}

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    CHECK_MSG(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));             \
  } while (0)

MOK_GPU_TEST(plan_device_build_equals_host, 1) {
  rng_t r = {test_seed() ^ 0x91a6};
  const int32_t kMaxRows = kMaxE * 3072, kMaxTiles = kMaxRows / MOK_PLAN_UNIT_ROWS;
  const size_t words = (size_t)mok_plan_words(kMaxTiles);
  int32_t *d_off = NULL, *d_cnt = NULL, *d_buf = NULL, *d_out = NULL;
  CUDA_CHECK(cudaMalloc(&d_off, sizeof(int32_t) * (kMaxE + 1)));
  CUDA_CHECK(cudaMalloc(&d_cnt, sizeof(int32_t) * kMaxE));
  CUDA_CHECK(cudaMalloc(&d_buf, sizeof(int32_t) * words));
  CUDA_CHECK(cudaMalloc(&d_out, sizeof(int32_t) * 8));
  /* the backward's orders: at most 3 tiles + 2 E nmac tasks each (nmac <= tiles) */
  const size_t half = 3 * (size_t)kMaxTiles + 2 * (size_t)kMaxE * kMaxTiles + 1;
  int32_t *d_bwd = NULL;
  CUDA_CHECK(cudaMalloc(&d_bwd, sizeof(int32_t) * 2 * half));
  int32_t *h_bwd = (int32_t *)malloc(sizeof(int32_t) * 2 * half), *g_bwd = (int32_t *)malloc(sizeof(int32_t) * 2 * half);
  CHECK(h_bwd && g_bwd);
  int32_t *h_buf = (int32_t *)malloc(sizeof(int32_t) * words), *g_buf = (int32_t *)malloc(sizeof(int32_t) * words);
  CHECK(h_buf && g_buf);
  for (int iter = 0; iter < 40; iter++) {
    int32_t count[kMaxE], off[kMaxE + 1];
    const int E = 1 + rng_int(&r, kMaxE), mode = rng_int(&r, 3);
    off[0] = 0;
    for (int e = 0; e < E; e++) {
      count[e] = mode == 0 ? rng_int(&r, 700) : mode == 1 ? (e == 0 ? rng_int(&r, 3000) : rng_int(&r, 3)) : 320;
      off[e + 1] = off[e] + (count[e] + 63) / 64 * 64;
    }
    static const int32_t mbs[] = {176, 512, 1024};
    const int32_t mb = mbs[rng_int(&r, 3)], ring = mb * (1 + rng_int(&r, 8));
    const int32_t max_tiles = mok_plan_max_tiles(off[E]);
    mokPlan_t hp;
    memset(h_buf, 0xff, sizeof(int32_t) * words);
    mok_plan_place(&hp, h_buf, max_tiles);
    const int hrc = mok_plan_build(off, count, E, MOK_PLAN_TILE_MAX_UNITS, mb, ring, max_tiles, &hp);
    CHECK_MSG(hrc == 0, "iter %d: host build %d", iter, hrc);
    CUDA_CHECK(cudaMemcpy(d_off, off, sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_cnt, count, sizeof(int32_t) * E, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_buf, 0xff, sizeof(int32_t) * words));
    int32_t hn[2] = {0, 0};
    CHECK(mok_plan_bwd_orders(&hp, E, h_bwd, &hn[0], h_bwd + half, &hn[1]) == 0);
    plan_build_kernel<<<1, 1>>>(d_off, d_cnt, E, mb, ring, max_tiles, d_buf, d_bwd, (int32_t)half, d_out);
    CUDA_CHECK(cudaGetLastError());
    int32_t out[8];
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(g_buf, d_buf, sizeof(int32_t) * words, cudaMemcpyDeviceToHost));
    CHECK_MSG(out[0] == 0 && out[1] == hp.num_tiles && out[2] == hp.num_mb && out[3] == hp.num_mac,
              "iter %d: device %d (%d tiles, %d mb, %d mac), host %d tiles %d mb %d mac", iter, out[0], out[1], out[2],
              out[3], hp.num_tiles, hp.num_mb, hp.num_mac);
    /* every word of every array, unwritten tails included (both filled with 0xff first) */
    const size_t used = (size_t)mok_plan_words(max_tiles);
    size_t bad = used;
    for (size_t i = 0; i < used && bad == used; i++)
      if (h_buf[i] != g_buf[i]) bad = i;
    CHECK_MSG(bad == used, "iter %d (E %d, %d rows, mb %d, ring %d): word %zu differs: host %d, device %d", iter, E,
              off[E], mb, ring, bad, h_buf[bad], g_buf[bad]);
    CHECK_MSG(out[4] == 0 && out[5] == hn[0] && out[6] == hn[1], "iter %d: backward orders %d (%d, %d), host (%d, %d)",
              iter, out[4], out[5], out[6], hn[0], hn[1]);
    CUDA_CHECK(cudaMemcpy(g_bwd, d_bwd, sizeof(int32_t) * 2 * half, cudaMemcpyDeviceToHost));
    CHECK_MSG(memcmp(g_bwd, h_bwd, sizeof(int32_t) * hn[0]) == 0 &&
                  memcmp(g_bwd + half, h_bwd + half, sizeof(int32_t) * hn[1]) == 0,
              "iter %d: the backward's orders differ", iter);
  }
  free(h_buf), free(g_buf), free(h_bwd), free(g_bwd);
  cudaFree(d_off), cudaFree(d_cnt), cudaFree(d_buf), cudaFree(d_out), cudaFree(d_bwd);
}
