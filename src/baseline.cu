/*
 * baseline.cu — the layer on GPUs, conventional path (issue 4): NCCL all-to-all-v of
 * token rows, cuBLAS expert GEMMs (one call per expert and matrix), and mok's small
 * kernels for permutation, SwiGLU and combine. It is the comparator every benchmark
 * prints beside the megakernel, the GPU cross-check for large shapes, and the path
 * for ranks outside one NVLink domain.
 *
 * Forward on rank r (T tokens, k slots; "route" = (t, j) with topk_idx != -1):
 *   1. host: copy topk_idx down (the one host wait), count routes per global expert,
 *      give every route its send position: send rows are sorted by (expert, t, j), so
 *      each destination rank's rows are contiguous and already in schedule order;
 *   2. all-gather the per-expert counts (+ an error flag, so a rank with a bad id
 *      stops every rank instead of leaving them in NCCL);
 *   3. permute x rows into the send buffer; grouped ncclSend/ncclRecv;
 *   4. gather the received rows into the padded expert-sorted layout of the shared
 *      schedule (schedule.h): segment e holds source ranks in order, each in (t, j)
 *      order — bitwise the CPU reference's row order;
 *   5. per local expert: [G | U] = X W_gate^T, X W_up^T; a = SwiGLU; Y = a W_down^T;
 *   6. scatter Y back to receive order, reverse all-to-all into send order (y_ret);
 *   7. shared expert on the local tokens; out = bf16(shared + sum_j w_tj y_tj).
 * Backward reuses the forward's counts, layout and saved context (X, [g|u], a, y_ret):
 *   d_topk_w = <d_out, y_ret>; dY = bf16(w d_out) rows travel like x; per expert
 *   dA = dY W_down (fp32), SwiGLU backward, dX = dG W_gate + dU W_up (fp32),
 *   dW_down = dY^T a, dW_gate = dG^T X, dW_up = dU^T X; dX rows travel back;
 *   d_x = bf16(shared + sum_j dx_tj).
 *
 * mokImplMega (the megakernel path) is in layer_mega.cu, the layer's creation and public
 * entry points in layer_api.cu; the layer's device state and the helpers the three files
 * call in layer_gpu.h.
 *
 * Row-major GEMMs on column-major cuBLAS: C[M,N] = op(A)[M,K] op(B)[K,N] is computed as
 * C^T = op(B)^T op(A)^T, i.e. cublasGemmEx(opB, opA, N, M, K, B, A, C) — see gemm_rm.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "comm.h"
#include "gemm.h"
#include "internal.h"
#include "kernels_load.h"
#include "schedule_dev.h"
#include "workspace.h"

#include "layer_gpu.h"

/* ---- kernels -------------------------------------------------------------------- */
/* Rows are H bf16 = H/8 uint4 (H is a multiple of 64). One block per row slice. */
__global__ void k_permute_rows(const uint4 *__restrict__ x, const int32_t *__restrict__ pos, int k, int64_t routes,
                               int row_u4, uint4 *__restrict__ dst) {
  for (int64_t q = blockIdx.x; q < routes; q += gridDim.x) {
    int32_t p = pos[q];
    if (p < 0) continue;
    const uint4 *src = x + (q / k) * row_u4;
    uint4 *d = dst + (int64_t)p * row_u4;
    for (int i = threadIdx.x; i < row_u4; i += blockDim.x) d[i] = src[i];
  }
}

/* dst[q] = src[map[q]] (zero where map[q] < 0), rows of row_u4 uint4. */
__global__ void k_gather_rows(const uint4 *__restrict__ src, const int32_t *__restrict__ map, int64_t rows, int row_u4,
                              uint4 *__restrict__ dst) {
  for (int64_t q = blockIdx.x; q < rows; q += gridDim.x) {
    int32_t m = map[q];
    uint4 *d = dst + q * row_u4;
    const uint4 *s = src + (int64_t)(m < 0 ? 0 : m) * row_u4;
    for (int i = threadIdx.x; i < row_u4; i += blockDim.x) d[i] = m < 0 ? make_uint4(0, 0, 0, 0) : s[i];
  }
}

/* dst[map[q]] = bf16(src[q]) for rows in use: padded layout back to receive order. */
template <typename Tin>
__global__ void k_scatter_rows(const Tin *__restrict__ src, const int32_t *__restrict__ map, int64_t rows, int H,
                               uint16_t *__restrict__ dst) {
  for (int64_t q = blockIdx.x; q < rows; q += gridDim.x) {
    int32_t m = map[q];
    if (m < 0) continue;
    const Tin *s = src + q * H;
    uint16_t *d = dst + (int64_t)m * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
      if constexpr (sizeof(Tin) == 4) d[i] = mok_f32_to_bf16((float)s[i]);
      else d[i] = (uint16_t)s[i];
    }
  }
}

__device__ __forceinline__ float ldf(const float *p) { return *p; }
__device__ __forceinline__ float ldf(const uint16_t *p) { return mok_bf16_to_f32(*p); }

/* a = bf16(silu(g) * u) with the optional clamp; saves [g|u] as bf16, +-inf where cut
 * (the backward's clamp mask is then exactly the forward's; see mok.h). With bf16
 * input and no clamp the input already is the saved context (save == NULL). */
template <typename Tin>
__global__ void k_swiglu_fwd(const Tin *__restrict__ gu, int64_t rows, int I, float L, uint16_t *__restrict__ act,
                             uint16_t *__restrict__ save) {
  int64_t n = rows * I;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / I;
    int c = (int)(e % I);
    float g = ldf(gu + r * 2 * I + c), u = ldf(gu + r * 2 * I + I + c);
    float gs = g, us = u;
    if (L > 0.f) {
      if (g > L) gs = INFINITY, g = L;
      if (u > L) us = INFINITY, u = L;
      if (u < -L) us = -INFINITY, u = -L;
    }
    act[e] = mok_f32_to_bf16(g / (1.f + __expf(-g)) * u);
    if (save) {
      save[r * 2 * I + c] = mok_f32_to_bf16(gs);
      save[r * 2 * I + I + c] = mok_f32_to_bf16(us);
    }
  }
}

/* [dG|dU] = SwiGLU backward of da with the saved [g|u]. */
__global__ void k_swiglu_bwd(const float *__restrict__ da, const uint16_t *__restrict__ gu, int64_t rows, int I,
                             float L, uint16_t *__restrict__ dgu) {
  int64_t n = rows * I;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / I;
    int c = (int)(e % I);
    float g = mok_bf16_to_f32(gu[r * 2 * I + c]), u = mok_bf16_to_f32(gu[r * 2 * I + I + c]);
    float gm = 1.f, um = 1.f;
    if (isinf(g)) g = L, gm = 0.f;
    if (isinf(u)) u = u > 0 ? L : -L, um = 0.f;
    float s = 1.f / (1.f + __expf(-g)), d = da[e];
    dgu[r * 2 * I + c] = mok_f32_to_bf16(gm * d * u * s * (1.f + g * (1.f - s)));
    dgu[r * 2 * I + I + c] = mok_f32_to_bf16(um * d * g * s);
  }
}

/* out[t] = bf16(base[t] + sum_j w[t,j] * rows[pos[t,j]]), fp32, fixed order j = 0..k-1.
 * base: bf16 (forward: shared y; mokImplMega's backward: shared dX) or fp32 (backward:
 * shared dX) or NULL; w NULL = 1. Nothing when bad && *bad (a forward the device refused). */
template <typename Tb>
__global__ void k_combine(const Tb *__restrict__ base, const uint16_t *__restrict__ rows, const int32_t *__restrict__ pos,
                          const float *__restrict__ w, int T, int k, int H, const int32_t *bad,
                          uint16_t *__restrict__ out) {
  if (bad && *(const volatile int32_t *)bad) return;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x)
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      float acc = base ? ldf(base + t * H + h) : 0.f;
      for (int j = 0; j < k; j++) {
        int32_t p = pos[t * k + j];
        if (p < 0) continue;
        float v = mok_bf16_to_f32(rows[(int64_t)p * H + h]);
        acc += w ? w[t * k + j] * v : v;
      }
      out[t * H + h] = mok_f32_to_bf16(acc);
    }
}

void mok_lg_combine_f32(const float *base, const mokBf16 *rows, const int32_t *pos, int T, int k, int H,
                        const int32_t *bad, mokBf16 *out, cudaStream_t st) {
  k_combine<float><<<grid_for(T, 1), 256, 0, st>>>(base, rows, pos, NULL, T, k, H, bad, out);
}

/* d_topk_w[q] = <d_out[t], y_ret[pos[q]]>: one warp per route, fixed reduction order. */
__global__ void k_dtopk(const uint16_t *__restrict__ dout, const uint16_t *__restrict__ yret,
                        const int32_t *__restrict__ pos, int64_t routes, int k, int H, float *__restrict__ dw) {
  int lane = threadIdx.x & 31;
  for (int64_t q = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; q < routes;
       q += ((int64_t)gridDim.x * blockDim.x) >> 5) {
    int32_t p = pos[q];
    float s = 0.f;
    if (p >= 0)
      for (int h = lane; h < H; h += 32)
        s += mok_bf16_to_f32(dout[(q / k) * H + h]) * mok_bf16_to_f32(yret[(int64_t)p * H + h]);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) dw[q] = s;
  }
}

/* send[pos[q]] = bf16(w[q] * d_out[t]). */
__global__ void k_dy_rows(const uint16_t *__restrict__ dout, const float *__restrict__ w, const int32_t *__restrict__ pos,
                          int64_t routes, int k, int H, uint16_t *__restrict__ dst) {
  for (int64_t q = blockIdx.x; q < routes; q += gridDim.x) {
    int32_t p = pos[q];
    if (p < 0) continue;
    float wt = w[q];
    for (int h = threadIdx.x; h < H; h += blockDim.x)
      dst[(int64_t)p * H + h] = mok_f32_to_bf16(wt * mok_bf16_to_f32(dout[(q / k) * H + h]));
  }
}

/* ---- helpers ---------------------------------------------------------------------- */


/* Row-major C[M,N] = op(A)[M,K] op(B)[K,N] (+ beta C); ta/tb: the operand is stored
 * transposed (A as [K,M], B as [N,K]). fp32 accumulation. */
static cublasStatus_t gemm_rm(cublasHandle_t h, int ta, int tb, int M, int N, int K, const void *A, cudaDataType at,
                              int lda, const void *B, cudaDataType bt, int ldb, void *C, cudaDataType ct, int ldc,
                              float beta) {
  const float one = 1.f;
  return cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &one, B, bt, ldb, A,
                      at, lda, &beta, C, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
#define BF CUDA_R_16BF
#define F32 CUDA_R_32F

/* One grouped GEMM over the experts e with m[e] > 0 (count of them: n_groups), row-major
 * like gemm_rm; A/B/C: the per-expert operand pointers. One cuBLAS call when the grouped
 * API takes these types, else one GEMM per expert. */
static mokResult_t grouped_rm(mokLayer_t l, int kind, int ta, int tb, int n_groups, const void **A, cudaDataType at,
                              const void **B, cudaDataType bt, void **C, cudaDataType ct, float beta,
                              cudaStream_t st) {
  struct mok_gpu_layer *g = l->gpu;
  if (!n_groups) return mokSuccess;
  if (g->grouped_ok) {
    cublasHandle_t h = g->cublas_kind[kind];
    if (!h) {
      if (cublasCreate(&g->cublas_kind[kind]) != CUBLAS_STATUS_SUCCESS)
        return mok_error(l, mokCudaError, "cublasCreate failed");
      h = g->cublas_kind[kind];
    }
    if (cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS) return mok_error(l, mokCudaError, "cublasSetStream failed");
    const int El = l->local_experts;
    const void **hp = g->h_ptrs + (size_t)g->slot * 3 * El, **dp = g->d_ptrs + (size_t)g->slot * 3 * El;
    g->slot = (g->slot + 1) % MOK_LG_SLOTS;
    /* column-major view: C^T = op(B)^T op(A)^T, so B goes first */
    for (int q = 0; q < n_groups; q++) {
      hp[q] = B[q], hp[El + q] = A[q], hp[2 * El + q] = C[q];
      g->gta[q] = tb ? CUBLAS_OP_T : CUBLAS_OP_N, g->gtb[q] = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
      g->galpha[q] = 1.f, g->gbeta[q] = beta, g->gsize[q] = 1;
    }
    CUDA_CHECK(l, cudaMemcpyAsync(dp, hp, sizeof(void *) * 3 * El, cudaMemcpyHostToDevice, st));
    cublasStatus_t s = cublasGemmGroupedBatchedEx(h, g->gta, g->gtb, g->gn, g->gm, g->gk, g->galpha, dp, bt,
                                                  g->gldb, dp + El, at, g->glda, g->gbeta, (void *const *)(dp + 2 * El),
                                                  ct, g->gldc, n_groups, g->gsize, CUBLAS_COMPUTE_32F);
    if (s == CUBLAS_STATUS_SUCCESS) return mokSuccess;
    if (s != CUBLAS_STATUS_NOT_SUPPORTED && s != CUBLAS_STATUS_INVALID_VALUE)
      return mok_error(l, mokCudaError, "cublasGemmGroupedBatchedEx failed: cuBLAS status %d", (int)s);
    g->grouped_ok = 0; /* this cuBLAS does not take these types: per-expert GEMMs from now on */
  }
  for (int q = 0; q < n_groups; q++) {
    cublasStatus_t s = gemm_rm(g->cublas, ta, tb, g->gm[q], g->gn[q], g->gk[q], A[q], at, g->glda[q], B[q], bt,
                               g->gldb[q], C[q], ct, g->gldc[q], beta);
    if (s != CUBLAS_STATUS_SUCCESS) return mok_error(l, mokCudaError, "cublasGemmEx failed: cuBLAS status %d", (int)s);
  }
  return mokSuccess;
}

/* Fills the shape arrays of group q. */
static inline void gset(struct mok_gpu_layer *g, int q, int M, int N, int K, int lda, int ldb, int ldc) {
  g->gm[q] = M, g->gn[q] = N, g->gk[q] = K, g->glda[q] = lda, g->gldb[q] = ldb, g->gldc[q] = ldc;
}

/* Grouped ncclSend/ncclRecv of rows (row_bytes each): all-to-all-v. */
/* The rows of mok's grouped GEMMs; a wait that runs out in them is recorded in the
 * communicator's error word, so mokCommGetAsyncError reports it like a comm timeout. */
mokResult_t mok_lg_gemm_rows(mokLayer_t l, int El, int64_t cap, const int32_t *seg, mokGemmRows_t *r) {
  mokCommDev dev;
  MOK_CHECK(mok_comm_device_view(l->comm, &dev));
  memset(r, 0, sizeof *r);
  r->num_experts = El;
  r->capacity = cap;
  r->expert_count = seg;
  r->expert_offset = seg + El;
  r->error_word = &((mokCommCtrl *)dev.peer_base[dev.rank])->error;
  r->rank = dev.rank;
  return mokSuccess;
}

static mokResult_t all_to_all_rows(mokLayer_t l, ncclComm_t nc, const void *send, const int64_t *scnt,
                                   const int64_t *sbase, void *recv, const int64_t *rcnt, const int64_t *rbase,
                                   size_t row_bytes, cudaStream_t st) {
  int N = l->cfg.num_ranks;
  NCCL_CHECK(l, ncclGroupStart());
  for (int p = 0; p < N; p++) {
    if (scnt[p]) {
      ncclResult_t r = ncclSend((const char *)send + sbase[p] * row_bytes, scnt[p] * row_bytes, ncclUint8, p, nc, st);
      if (r != ncclSuccess) { ncclGroupEnd(); return mok_error(l, mokNcclError, "ncclSend failed: %s", ncclGetErrorString(r)); }
    }
    if (rcnt[p]) {
      ncclResult_t r = ncclRecv((char *)recv + rbase[p] * row_bytes, rcnt[p] * row_bytes, ncclUint8, p, nc, st);
      if (r != ncclSuccess) { ncclGroupEnd(); return mok_error(l, mokNcclError, "ncclRecv failed: %s", ncclGetErrorString(r)); }
    }
  }
  NCCL_CHECK(l, ncclGroupEnd());
  return mokSuccess;
}

/* Phase marks for MOK_BASELINE_PROFILE (printing only when that variable asks). */
void mok_lg_prof_mark(struct mok_gpu_layer *g, const char *name, cudaStream_t st) {
  if (!g->prof || g->nev >= 32) return;
  if (!g->ev[g->nev]) cudaEventCreate(&g->ev[g->nev]);
  cudaEventRecord(g->ev[g->nev], st);
  g->evname[g->nev++] = name;
}
void mok_lg_prof_report(struct mok_gpu_layer *g, const char *pass, int rank) {
  if (!g->prof || g->nev < 2) { g->nev = 0; return; }
  cudaEventSynchronize(g->ev[g->nev - 1]);
  char line[1024];
  int n = snprintf(line, sizeof line, "mok baseline %s rank %d:", pass, rank);
  for (int i = 1; i < g->nev && n < (int)sizeof line - 40; i++) {
    float ms = 0;
    cudaEventElapsedTime(&ms, g->ev[i - 1], g->ev[i]);
    n += snprintf(line + n, sizeof line - (size_t)n, " %s %.3f", g->evname[i], ms);
  }
  fprintf(stderr, "%s\n", line);
  g->nev = 0;
}

/* The expert GEMMs of a pass, each one grouped call over the experts with rows.
 * Row-major shapes (m = the expert's rows, X/dY [m,H], A [m,I], [g|u] and [dG|dU] [m,2I]):
 *   GATE/UP  [g|u] half [m,I] = X W^T        DOWN  Y [m,H] = A W_down^T
 *   DA       dA [m,I] = dY W_down (fp32)     DXG/DXU  dX [m,H] (+)= dG W_gate, dU W_up (fp32)
 *   DWD      dW_down [H,I] = dY^T A          DWG/DWU  dW [I,H] = dG^T X, dU^T X */
enum gkind { G_GATE, G_UP, G_DOWN, G_DA, G_DXG, G_DXU, G_DWD, G_DWG, G_DWU };

static mokResult_t expert_gemm(mokLayer_t l, enum gkind kind, const mokRankWeights_t *w, const mokRankGrads_t *gr,
                               cudaStream_t st) {
  struct mok_gpu_layer *g = l->gpu;
  const int El = l->local_experts, H = l->cfg.hidden, I = l->cfg.inter;
  const int clamp = l->cfg.swiglu_limit > 0;
  const size_t gs = l->cfg.grad_dtype == mokDtypeBF16 ? 2 : 4;
  const cudaDataType gt = l->cfg.grad_dtype == mokDtypeBF16 ? BF : F32;
  const void **A = g->ops;
  const void **B = A + El;
  void **C = (void **)(A + 2 * El);
  int n = 0, ta = 0, tb = 0;
  cudaDataType at = BF, bt = BF, ct = BF;
  float beta = 0.f;
  for (int e = 0; e < El; e++) {
    int m = g->seg_cnt[e];
    if (!m) continue;
    int64_t r0 = g->seg_off[e];
    const size_t ew = (size_t)e * I * H;
    switch (kind) {
      case G_GATE: case G_UP:
        tb = 1, ct = clamp ? F32 : BF;
        A[n] = g->xg + r0 * H, B[n] = (kind == G_GATE ? w->w_gate : w->w_up) + ew;
        C[n] = clamp ? (void *)(g->gu32 + r0 * 2 * I + (kind == G_UP) * I) : (void *)(g->gu + r0 * 2 * I + (kind == G_UP) * I);
        gset(g, n, m, I, H, H, H, 2 * I);
        break;
      case G_DOWN:
        tb = 1;
        A[n] = g->act + r0 * I, B[n] = w->w_down + ew, C[n] = g->yp + r0 * H;
        gset(g, n, m, H, I, I, I, H);
        break;
      case G_DA:
        ct = F32;
        A[n] = g->yp + r0 * H, B[n] = w->w_down + ew, C[n] = g->f32 + r0 * I;
        gset(g, n, m, I, H, H, I, I);
        break;
      case G_DXG: case G_DXU:
        ct = F32, beta = kind == G_DXU ? 1.f : 0.f;
        A[n] = g->dgu + r0 * 2 * I + (kind == G_DXU) * I, B[n] = (kind == G_DXG ? w->w_gate : w->w_up) + ew;
        C[n] = g->f32 + r0 * H;
        gset(g, n, m, H, I, 2 * I, H, H);
        break;
      case G_DWD:
        ta = 1, ct = gt, beta = gr->accumulate ? 1.f : 0.f;
        A[n] = g->yp + r0 * H, B[n] = g->act + r0 * I, C[n] = (char *)gr->d_w_down + gs * ew;
        gset(g, n, H, I, m, H, I, I);
        break;
      case G_DWG: case G_DWU:
        ta = 1, ct = gt, beta = gr->accumulate ? 1.f : 0.f;
        A[n] = g->dgu + r0 * 2 * I + (kind == G_DWU) * I, B[n] = g->xg + r0 * H;
        C[n] = (char *)(kind == G_DWG ? gr->d_w_gate : gr->d_w_up) + gs * ew;
        gset(g, n, I, H, m, 2 * I, H, H);
        break;
    }
    n++;
  }
  /* One grouped call or a call per expert? Measured on 2x H200 (docs/PERF.md, baseline
   * section): the grouped call wins where experts have few rows (launch-bound loop:
   * qwen3.5 at 80 rows/expert, 13.3 -> 4.4 ms forward) and loses badly on the forward
   * GEMMs at 512 rows/expert (glm-5.2 15.7 -> 24.9 ms); the backward GEMMs time the same
   * either way. So: forward kinds grouped below 128 rows per expert, backward always.
   * MOK_BASELINE_GROUPED (bit = enum gkind) overrides, for measurements. */
  int use_grouped;
  if (g->grouped_mask != ~0u) {
    use_grouped = (g->grouped_mask >> kind) & 1u;
  } else if (kind == G_GATE || kind == G_UP || kind == G_DOWN) {
    int64_t total = 0;
    for (int e = 0; e < El; e++) total += g->seg_cnt[e];
    use_grouped = n > 0 && total < (int64_t)128 * n;
  } else {
    use_grouped = 1;
  }
  int saved = g->grouped_ok;
  if (!use_grouped) g->grouped_ok = 0;
  mokResult_t rc = grouped_rm(l, (int)kind, ta, tb, n, A, at, B, bt, C, ct, beta, st);
  if (!use_grouped) g->grouped_ok = saved;
  return rc;
}

/* ---- forward ------------------------------------------------------------------------- */
/* ---- the row buffers of a pass (workspace.h) ------------------------------------------ */

static void *at_off(void *base, size_t off) { return off == MOK_LAYOUT_NONE ? NULL : (char *)base + off; }

/* The layer's saved block (what the backward reads): sizes, and with base the pointers. */
size_t mok_lg_layout_saved(mokLayer_t l, const pass_shape *p, void *base) {
  struct mok_gpu_layer *g = l->gpu;
  size_t o[MOK_SV_NUM];
  const size_t bytes = mok_layout_saved(&l->cfg, p, o);
  if (base) {
    g->xg = (mokBf16 *)at_off(base, o[MOK_SV_XG]), g->gu = (mokBf16 *)at_off(base, o[MOK_SV_GU]);
    g->act = (mokBf16 *)at_off(base, o[MOK_SV_ACT]), g->yret = (mokBf16 *)at_off(base, o[MOK_SV_YRET]);
    g->s_gu = (mokBf16 *)at_off(base, o[MOK_SV_SGU]), g->s_act = (mokBf16 *)at_off(base, o[MOK_SV_SACT]);
    if (p->impl == mokImplMega) g->yp = (mokBf16 *)at_off(base, o[MOK_SV_YP]);
  }
  return bytes;
}

/* The communicator's scratch block: what one forward (backward = 0) or backward uses. */
static size_t layout_scratch(mokLayer_t l, const pass_shape *p, int backward, void *base) {
  struct mok_gpu_layer *g = l->gpu;
  size_t o[MOK_SC_NUM];
  const size_t bytes = mok_layout_scratch(&l->cfg, p, backward, o);
  if (base) {
    g->send = (mokBf16 *)at_off(base, o[MOK_SC_SEND]), g->recv = (mokBf16 *)at_off(base, o[MOK_SC_RECV]);
    g->gu32 = (float *)at_off(base, o[MOK_SC_GU32]), g->s_y = (mokBf16 *)at_off(base, o[MOK_SC_SY]);
    g->s_gu32 = (float *)at_off(base, o[MOK_SC_SGU32]), g->f32 = (float *)at_off(base, o[MOK_SC_F32]);
    g->dgu = (mokBf16 *)at_off(base, o[MOK_SC_DGU]), g->s_f32 = (float *)at_off(base, o[MOK_SC_SF32]);
    g->s_dgu = (mokBf16 *)at_off(base, o[MOK_SC_SDGU]);
    if (p->impl != mokImplMega) g->yp = (mokBf16 *)at_off(base, o[MOK_SC_YP]);
  }
  return bytes;
}

size_t mok_lg_scratch_need(mokLayer_t l, const pass_shape *p) { return mok_scratch_need(&l->cfg, p); }

/* The shape of rank s's forward (NCCL paths), from the exchanged counts every rank holds. */
static pass_shape rank_shape(mokLayer_t l, int s, mokImpl_t impl) {
  struct mok_gpu_layer *g = l->gpu;
  const int N = l->cfg.num_ranks, E = l->cfg.num_experts, El = l->local_experts, P = l->cfg.row_pad;
  const int64_t cs = E + CNT_EXTRA;
  pass_shape p;
  memset(&p, 0, sizeof p);
  p.impl = impl;
  for (int e = 0; e < E; e++) p.routes += g->h_cnt_all[(int64_t)s * cs + e];
  p.tokens = g->h_cnt_all[(int64_t)s * cs + E + CNT_TOKENS];
  for (int e = 0; e < El; e++) {
    int64_t n = 0;
    for (int r = 0; r < N; r++) n += g->h_cnt_all[(int64_t)r * cs + (int64_t)s * El + e];
    p.recv += n;
    p.rows += (n + P - 1) / P * P;
  }
  if (p.rows < P) p.rows = P; /* (never an empty tensor) */
  return p;
}


/* Makes the blocks hold pass p's buffers and carves them: a forward (backward = 0) the
 * saved block and the scratch of both passes; a backward the scratch it uses. */
mokResult_t mok_lg_pass_buffers(mokLayer_t l, const pass_shape *p, int backward, cudaStream_t st, const char *fn) {
  struct mok_gpu_layer *g = l->gpu;
  mok_devbuf *scr = mok_comm_scratch(l->comm);
  if (!backward) {
    MOK_CHECK(mok_devbuf_reserve(l, &g->saved, mok_lg_layout_saved(l, p, NULL), st, fn, "layer's saved rows"));
    mok_lg_layout_saved(l, p, (char *)g->saved.ptr);
    g->cap = p->rows, g->fwd_recv = p->recv, g->fwd_routes = p->routes;
  }
  MOK_CHECK(mok_devbuf_reserve(l, scr, backward ? layout_scratch(l, p, 1, NULL) : mok_lg_scratch_need(l, p), st, fn,
                               "communicator's scratch rows"));
  layout_scratch(l, p, backward, (char *)scr->ptr);
  return mokSuccess;
}

/* The shape of the last forward (its backward carves the same buffers). */
pass_shape mok_lg_fwd_shape(mokLayer_t l) {
  struct mok_gpu_layer *g = l->gpu;
  pass_shape p;
  memset(&p, 0, sizeof p);
  p.rows = g->cap, p.recv = g->fwd_recv, p.routes = g->fwd_routes, p.tokens = g->fwd_tokens;
  p.impl = g->fwd_impl, p.shared_in = g->fwd_shared_in;
  return p;
}

/* After a pass: later passes on other streams wait for it before they reuse the blocks. */
void mok_lg_pass_done(mokLayer_t l, cudaStream_t st) {
  mok_devbuf_done(&l->gpu->saved, st);
  mok_devbuf_done(mok_comm_scratch(l->comm), st);
}

mokResult_t mok_lg_exchange_refusals(mokLayer_t l, int bad, int *first_bad, cudaStream_t st);
mokResult_t mok_lg_agree_step(mokLayer_t l, mokResult_t rc, mokResult_t status, const char *fn, const char *what,
                              cudaStream_t st);

/* The shared expert's forward (cuBLAS): s_gu, s_act (saved) and s_y. */
mokResult_t mok_lg_shared_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int H = c->hidden, Is = c->shared_inter, T = in->num_tokens;
  const float L = c->swiglu_limit;
  if (!Is || !T) return mokSuccess;
  cublasHandle_t cb = g->cublas;
  CUBLAS_CHECK(l, cublasSetStream(cb, st));
  if (L > 0) {
    CUBLAS_CHECK(l, gemm_rm(cb, 0, 1, T, Is, H, in->x, BF, H, w->s_gate, BF, H, g->s_gu32, F32, 2 * Is, 0.f));
    CUBLAS_CHECK(l, gemm_rm(cb, 0, 1, T, Is, H, in->x, BF, H, w->s_up, BF, H, g->s_gu32 + Is, F32, 2 * Is, 0.f));
    k_swiglu_fwd<float><<<grid_for((int64_t)T * Is, 256), 256, 0, st>>>(g->s_gu32, T, Is, L, g->s_act, g->s_gu);
  } else {
    CUBLAS_CHECK(l, gemm_rm(cb, 0, 1, T, Is, H, in->x, BF, H, w->s_gate, BF, H, g->s_gu, BF, 2 * Is, 0.f));
    CUBLAS_CHECK(l, gemm_rm(cb, 0, 1, T, Is, H, in->x, BF, H, w->s_up, BF, H, g->s_gu + Is, BF, 2 * Is, 0.f));
    k_swiglu_fwd<uint16_t><<<grid_for((int64_t)T * Is, 256), 256, 0, st>>>(g->s_gu, T, Is, 0.f, g->s_act, NULL);
  }
  CUBLAS_CHECK(l, gemm_rm(cb, 0, 1, T, H, Is, g->s_act, BF, Is, w->s_down, BF, Is, g->s_y, BF, H, 0.f));
  return mokSuccess;
}

mokResult_t mok_lg_baseline_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, mokBf16 *out,
                                    cudaStream_t st) {
  static const char fn[] = "mokLayerForward";
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int N = c->num_ranks, E = c->num_experts, El = l->local_experts, H = c->hidden, I = c->inter;
  const int Is = c->shared_inter, k = c->topk, T = in->num_tokens, P = c->row_pad;
  const int64_t routes = (int64_t)T * k;
  const float L = c->swiglu_limit;
  int rank = 0;
  mokCommRankInfo(l->comm, &rank, NULL, NULL);
  ncclComm_t nc;
  MOK_CHECK(mokCommGetNccl(l->comm, &nc));
  g->fwd_valid = 0;
  g->fwd_shared_in = 0;

  mok_lg_prof_mark(g, "start", st);
  /* 1. routing to the host (the baseline's one wait), counts and send positions */
  if (routes) CUDA_CHECK(l, cudaMemcpyAsync(g->h_idx, in->topk_idx, 4 * routes, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(l, cudaStreamSynchronize(st));
  const int64_t cs = E + CNT_EXTRA; /* (the exchange's stride) */
  memset(g->h_cnt, 0, sizeof(int32_t) * cs);
  int64_t bad = -1;
  for (int64_t q = 0; q < routes; q++) {
    int32_t e = g->h_idx[q];
    if (e < -1 || e >= E) { bad = q; break; }
    if (e >= 0) g->h_cnt[e]++;
  }
  if (bad >= 0) g->h_cnt[E + CNT_BAD] = 1;
  g->h_cnt[E + CNT_TOKENS] = T;
  g->h_cnt[E + CNT_SAVED_MIB] = (int32_t)(g->saved.bytes >> 20);
  g->h_cnt[E + CNT_SCRATCH_MIB] = (int32_t)(mok_comm_scratch(l->comm)->bytes >> 20);
  /* 2. every rank's counts (and error flag, tokens, blocks) */
  CUDA_CHECK(l, cudaMemcpyAsync(g->d_cnt, g->h_cnt, 4 * (size_t)cs, cudaMemcpyHostToDevice, st));
  NCCL_CHECK(l, ncclAllGather(g->d_cnt, g->d_cnt_all, (size_t)cs, ncclInt32, nc, st));
  CUDA_CHECK(l, cudaMemcpyAsync(g->h_cnt_all, g->d_cnt_all, 4 * (size_t)N * cs, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(l, cudaStreamSynchronize(st));
  if (bad >= 0)
    return mok_error(l, mokInvalidArgument, "%s: rank %d: topk_idx[%lld, %lld] = %d is not an expert id in [0, %d) "
                     "or -1; nothing was written", fn, rank, (long long)(bad / k), (long long)(bad % k),
                     (int)g->h_idx[bad], E);
  for (int s = 0; s < N; s++)
    if (g->h_cnt_all[(int64_t)s * cs + E + CNT_BAD])
      return mok_error(l, mokInvalidArgument, "%s: rank %d refused its forward input (a bad expert id or argument); nothing was "
                       "written", fn, s);
  /* 2b. the row buffers, sized by these counts: every rank computes every rank's needs
   * from the exchange, so where one rank's blocks grow all of them exchange whether the
   * growth succeeded (a rank that could not allocate must not leave its peers in NCCL) */
  int grow_any = 0;
  for (int s = 0; s < N && !grow_any; s++) {
    const pass_shape ps = rank_shape(l, s, g->fwd_impl);
    const int32_t *ex = g->h_cnt_all + (int64_t)s * cs + E;
    grow_any = mok_lg_layout_saved(l, &ps, NULL) > ((size_t)ex[CNT_SAVED_MIB] << 20) ||
               mok_lg_scratch_need(l, &ps) > ((size_t)ex[CNT_SCRATCH_MIB] << 20);
  }
  const pass_shape me = rank_shape(l, rank, g->fwd_impl);
  mokResult_t ar = mok_lg_pass_buffers(l, &me, 0, st, fn);
  if (grow_any)
    MOK_CHECK(mok_lg_agree_step(l, ar, mokOutOfMemory, fn, "could not grow its row buffers for this forward (its "
                         "mokGetLastError says why)", st));
  MOK_CHECK(ar);
  /* send order: sorted by global expert, then (t, j) */
  int32_t *cursor = g->cursor;
  cursor[0] = 0;
  for (int e = 0; e < E; e++) cursor[e + 1] = cursor[e] + g->h_cnt[e];
  for (int p = 0; p < N; p++) {
    g->send_base[p] = cursor[p * El];
    g->send_cnt[p] = cursor[(p + 1) * El] - cursor[p * El];
  }
  for (int64_t q = 0; q < routes; q++) {
    int32_t e = g->h_idx[q];
    g->h_pos[q] = e < 0 ? -1 : cursor[e]++;
  }
  /* receive side: rows from s to my experts, and the padded schedule */
  int64_t rb = 0;
  for (int s = 0; s < N; s++) {
    const int32_t *cn = g->h_cnt_all + (int64_t)s * cs + (int64_t)rank * El;
    int64_t n = 0;
    for (int e = 0; e < El; e++) n += cn[e];
    g->recv_cnt[s] = n, g->recv_base[s] = rb, rb += n;
  }
  g->seg_off[0] = 0;
  for (int e = 0; e < El; e++) {
    int32_t n = 0;
    for (int s = 0; s < N; s++) n += g->h_cnt_all[(int64_t)s * cs + (int64_t)rank * El + e];
    g->seg_cnt[e] = n;
    g->seg_off[e + 1] = g->seg_off[e] + (n + P - 1) / P * P;
  }
  const int64_t rows = g->seg_off[El];
  for (int e = 0; e < El; e++) {
    int64_t q = g->seg_off[e];
    for (int s = 0; s < N; s++) {
      const int32_t *cn = g->h_cnt_all + (int64_t)s * cs + (int64_t)rank * El;
      int64_t src = g->recv_base[s];
      for (int e2 = 0; e2 < e; e2++) src += cn[e2];
      for (int32_t i = 0; i < cn[e]; i++) g->h_map[q++] = (int32_t)(src + i);
    }
    while (q < g->seg_off[e + 1]) g->h_map[q++] = -1;
  }
  if (routes) CUDA_CHECK(l, cudaMemcpyAsync(g->d_pos, g->h_pos, 4 * routes, cudaMemcpyHostToDevice, st));
  if (rows) CUDA_CHECK(l, cudaMemcpyAsync(g->d_map, g->h_map, 4 * rows, cudaMemcpyHostToDevice, st));

  mok_lg_prof_mark(g, "routing", st);
  /* 3. dispatch */
  const int row_u4 = H / 8;
  if (routes) k_permute_rows<<<grid_for(routes, 1), 128, 0, st>>>((const uint4 *)in->x, g->d_pos, k, routes, row_u4,
                                                                  (uint4 *)g->send);
  mok_lg_prof_mark(g, "permute", st);
  MOK_CHECK(all_to_all_rows(l, nc, g->send, g->send_cnt, g->send_base, g->recv, g->recv_cnt, g->recv_base,
                            2 * (size_t)H, st));
  mok_lg_prof_mark(g, "a2a", st);
  /* 4. padded expert-sorted layout */
  if (rows) k_gather_rows<<<grid_for(rows, 1), 128, 0, st>>>((const uint4 *)g->recv, g->d_map, rows, row_u4,
                                                             (uint4 *)g->xg);
  mok_lg_prof_mark(g, "gather", st);
  /* 5. experts */
  cublasHandle_t cb = g->cublas;
  CUBLAS_CHECK(l, cublasSetStream(cb, st));
  mokGemmRows_t grows;
  MOK_CHECK(mok_lg_gemm_rows(l, El, g->cap, g->d_seg, &grows));
  grows.expert_count_host = g->seg_cnt; /* the counts, on the host since the routing wait */
  if (g->fwd_impl == mokImplNccl) {
    CUDA_CHECK(l, cudaMemcpyAsync(g->d_seg, g->seg_cnt, sizeof(int32_t) * (size_t)(2 * El + 1), cudaMemcpyHostToDevice, st));
    /* gate+up (SwiGLU) and down: one fused launch where its rule picks it (gemm.h) */
    MOK_CHECK(mok_gemm_ffn_fwd(&grows, H, I, L, g->xg, w->w_gate, w->w_up, w->w_down, g->act, g->gu, g->yp, st));
    mok_lg_prof_mark(g, "gateup+swiglu+down", st);
  } else {
    MOK_CHECK(expert_gemm(l, G_GATE, w, NULL, st));
    MOK_CHECK(expert_gemm(l, G_UP, w, NULL, st));
    mok_lg_prof_mark(g, "gateup", st);
    if (rows) {
      if (L > 0)
        k_swiglu_fwd<float><<<grid_for(rows * I, 256), 256, 0, st>>>(g->gu32, rows, I, L, g->act, g->gu);
      else
        k_swiglu_fwd<uint16_t><<<grid_for(rows * I, 256), 256, 0, st>>>(g->gu, rows, I, 0.f, g->act, NULL);
    }
    mok_lg_prof_mark(g, "swiglu", st);
    MOK_CHECK(expert_gemm(l, G_DOWN, w, NULL, st));
    mok_lg_prof_mark(g, "down", st);
  }
  /* 6. back to the source ranks, into send order */
  if (rows) k_scatter_rows<uint16_t><<<grid_for(rows, 1), 256, 0, st>>>(g->yp, g->d_map, rows, H, g->recv);
  MOK_CHECK(all_to_all_rows(l, nc, g->recv, g->recv_cnt, g->recv_base, g->yret, g->send_cnt, g->send_base,
                            2 * (size_t)H, st));
  mok_lg_prof_mark(g, "scatter+a2a", st);
  /* 7. shared expert and combine */
  MOK_CHECK(mok_lg_shared_forward(l, in, w, st));
  if (T)
    k_combine<uint16_t><<<grid_for(T, 1), 256, 0, st>>>(Is ? g->s_y : NULL, g->yret, g->d_pos, in->topk_w, T, k, H, NULL,
                                                        out);
  CUDA_CHECK(l, cudaGetLastError());
  mok_lg_prof_mark(g, "shared+combine", st);
  mok_lg_prof_report(g, "fwd", rank);
  g->fwd_valid = 1;
  g->fwd_tokens = T;
  return mokSuccess;
}

/* ---- backward ------------------------------------------------------------------------ */
static mokResult_t zero_grad(mokLayer_t l, void *p, int64_t elems, cudaStream_t st) {
  size_t es = l->cfg.grad_dtype == mokDtypeBF16 ? 2 : 4;
  CUDA_CHECK(l, cudaMemsetAsync(p, 0, es * (size_t)elems, st));
  return mokSuccess;
}

/* The shared expert's backward (cuBLAS): its weight gradients, and its dX (fp32) in s_f32. */
mokResult_t mok_lg_shared_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                   const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int H = c->hidden, Is = c->shared_inter, T = in->num_tokens;
  const float L = c->swiglu_limit;
  const cudaDataType gt = c->grad_dtype == mokDtypeBF16 ? BF : F32;
  const float gb = gr->accumulate ? 1.f : 0.f; /* (weight gradients added to the buffers) */
  if (!Is || (!T && gr->accumulate)) return mokSuccess;
  if (!T) {
    MOK_CHECK(zero_grad(l, gr->d_s_gate, (int64_t)Is * H, st));
    MOK_CHECK(zero_grad(l, gr->d_s_up, (int64_t)Is * H, st));
    return zero_grad(l, gr->d_s_down, (int64_t)H * Is, st);
  }
  cublasHandle_t cb = g->cublas;
  CUBLAS_CHECK(l, cublasSetStream(cb, st));
  CUBLAS_CHECK(l, gemm_rm(cb, 0, 0, T, Is, H, dout, BF, H, w->s_down, BF, Is, g->s_f32, F32, Is, 0.f));
  k_swiglu_bwd<<<grid_for((int64_t)T * Is, 256), 256, 0, st>>>(g->s_f32, g->s_gu, T, Is, L, g->s_dgu);
  CUBLAS_CHECK(l, gemm_rm(cb, 1, 0, H, Is, T, dout, BF, H, g->s_act, BF, Is, gr->d_s_down, gt, Is, gb));
  CUBLAS_CHECK(l, gemm_rm(cb, 1, 0, Is, H, T, g->s_dgu, BF, 2 * Is, in->x, BF, H, gr->d_s_gate, gt, H, gb));
  CUBLAS_CHECK(l, gemm_rm(cb, 1, 0, Is, H, T, g->s_dgu + Is, BF, 2 * Is, in->x, BF, H, gr->d_s_up, gt, H, gb));
  /* s_f32 now holds the shared dX (dA was consumed by the SwiGLU backward) */
  CUBLAS_CHECK(l, gemm_rm(cb, 0, 0, T, H, Is, g->s_dgu, BF, 2 * Is, w->s_gate, BF, H, g->s_f32, F32, H, 0.f));
  CUBLAS_CHECK(l, gemm_rm(cb, 0, 0, T, H, Is, g->s_dgu + Is, BF, 2 * Is, w->s_up, BF, H, g->s_f32, F32, H, 1.f));
  return mokSuccess;
}

/* The weight gradients' dtype argument of mok's GEMMs: grad_dtype, and MOK_GEMM_ACCUMULATE
 * where the caller asks them added to its buffers. */
mokDtype_t mok_lg_wgrad_dtype(mokLayer_t l, const mokRankGrads_t *gr) {
  return (mokDtype_t)((int)l->cfg.grad_dtype | (gr->accumulate ? MOK_GEMM_ACCUMULATE : 0));
}

/* The routed experts' backward with mok's GEMMs on the padded rows (dY in yp): dgu, the dX
 * partials (bf16, into dxb: [cap, H] fits in the fp32 scratch) and every weight gradient. */
mokResult_t mok_lg_expert_backward(mokLayer_t l, const mokRankWeights_t *w, const mokRankGrads_t *gr, mokBf16 *dxb,
                                       const int32_t *skip, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int H = c->hidden, I = c->inter;
  const float L = c->swiglu_limit;
  mokGemmRows_t grows;
  MOK_CHECK(mok_lg_gemm_rows(l, l->local_experts, g->cap, g->d_seg, &grows));
  grows.skip = skip;
  MOK_CHECK(mok_gemm_down_dgrad(&grows, H, I, L, g->yp, w->w_down, g->gu, g->dgu, st));
  mok_lg_prof_mark(g, "dA+swiglu'", st);
  MOK_CHECK(mok_gemm_gateup_dgrad(&grows, H, I, g->dgu, w->w_gate, w->w_up, dxb, st));
  mok_lg_prof_mark(g, "dX", st);
  MOK_CHECK(mok_gemm_wgrad_down(&grows, H, I, g->yp, g->act, mok_lg_wgrad_dtype(l, gr), gr->d_w_down, st));
  mok_lg_prof_mark(g, "dWdown", st);
  MOK_CHECK(mok_gemm_wgrad_gateup(&grows, H, I, g->dgu, g->xg, mok_lg_wgrad_dtype(l, gr), gr->d_w_gate, gr->d_w_up, st));
  mok_lg_prof_mark(g, "dWgateup", st);
  return mokSuccess;
}

mokResult_t mok_lg_baseline_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                     const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int El = l->local_experts, H = c->hidden, I = c->inter, Is = c->shared_inter, k = c->topk;
  const int T = in->num_tokens;
  const int64_t routes = (int64_t)T * k, rows = g->seg_off[El];
  const float L = c->swiglu_limit;
  const size_t gsz = c->grad_dtype == mokDtypeBF16 ? 2 : 4;
  ncclComm_t nc;
  MOK_CHECK(mokCommGetNccl(l->comm, &nc));
  cublasHandle_t cb = g->cublas;
  CUBLAS_CHECK(l, cublasSetStream(cb, st));

  mok_lg_prof_mark(g, "start", st);
  if (routes) {
    k_dtopk<<<grid_for(routes * 32, 256), 256, 0, st>>>(dout, g->yret, g->d_pos, routes, k, H, gr->d_topk_w);
    k_dy_rows<<<grid_for(routes, 1), 256, 0, st>>>(dout, in->topk_w, g->d_pos, routes, k, H, g->send);
  }
  MOK_CHECK(all_to_all_rows(l, nc, g->send, g->send_cnt, g->send_base, g->recv, g->recv_cnt, g->recv_base,
                            2 * (size_t)H, st));
  if (rows) k_gather_rows<<<grid_for(rows, 1), 128, 0, st>>>((const uint4 *)g->recv, g->d_map, rows, H / 8,
                                                             (uint4 *)g->yp);
  mok_lg_prof_mark(g, "dtopk+dy+a2a+gather", st);
  if (g->fwd_impl == mokImplNccl) { /* mok's GEMMs */
    mokBf16 *dxb = (mokBf16 *)g->f32;
    MOK_CHECK(mok_lg_expert_backward(l, w, gr, dxb, NULL, st));
    if (rows) k_scatter_rows<uint16_t><<<grid_for(rows, 1), 256, 0, st>>>(dxb, g->d_map, rows, H, g->recv);
  } else {
    MOK_CHECK(expert_gemm(l, G_DA, w, gr, st));
    mok_lg_prof_mark(g, "dA", st);
    if (rows) k_swiglu_bwd<<<grid_for(rows * I, 256), 256, 0, st>>>(g->f32, g->gu, rows, I, L, g->dgu);
    for (int e = 0; e < El && !gr->accumulate; e++) { /* overwritten: an expert with no rows gets zeros */
      if (g->seg_cnt[e]) continue;
      MOK_CHECK(zero_grad(l, (char *)gr->d_w_gate + gsz * (size_t)e * I * H, (int64_t)I * H, st));
      MOK_CHECK(zero_grad(l, (char *)gr->d_w_up + gsz * (size_t)e * I * H, (int64_t)I * H, st));
      MOK_CHECK(zero_grad(l, (char *)gr->d_w_down + gsz * (size_t)e * H * I, (int64_t)H * I, st));
    }
    mok_lg_prof_mark(g, "swiglu'", st);
    MOK_CHECK(expert_gemm(l, G_DXG, w, gr, st));
    MOK_CHECK(expert_gemm(l, G_DXU, w, gr, st));
    mok_lg_prof_mark(g, "dX", st);
    MOK_CHECK(expert_gemm(l, G_DWD, w, gr, st));
    mok_lg_prof_mark(g, "dWdown", st);
    MOK_CHECK(expert_gemm(l, G_DWG, w, gr, st));
    MOK_CHECK(expert_gemm(l, G_DWU, w, gr, st));
    mok_lg_prof_mark(g, "dWgateup", st);
    if (rows) k_scatter_rows<float><<<grid_for(rows, 1), 256, 0, st>>>(g->f32, g->d_map, rows, H, g->recv);
  }
  MOK_CHECK(all_to_all_rows(l, nc, g->recv, g->recv_cnt, g->recv_base, g->send, g->send_cnt, g->send_base,
                            2 * (size_t)H, st));
  mok_lg_prof_mark(g, "scatter+a2a", st);
  MOK_CHECK(mok_lg_shared_backward(l, in, w, dout, gr, st));
  if (T)
    k_combine<float><<<grid_for(T, 1), 256, 0, st>>>(Is ? g->s_f32 : NULL, g->send, g->d_pos, NULL, T, k, H, NULL,
                                                      gr->d_x);
  mok_lg_prof_mark(g, "shared+combine", st);
  {
    int rank = 0;
    mokCommRankInfo(l->comm, &rank, NULL, NULL);
    mok_lg_prof_report(g, "bwd", rank);
  }
  CUDA_CHECK(l, cudaGetLastError());
  return mokSuccess;
}

/* Every pass starts with one exchange in which each rank says whether it refused its
 * input: a rank that returns early would otherwise leave its peers waiting inside NCCL.
 * [IN] bad: this rank refuses  [OUT] *first_bad: the lowest rank that refused, or -1.
 * The NCCL paths' forward folds this flag into its routing-count exchange; the backward,
 * and mokImplMega's forward at N > 1, call this. */
mokResult_t mok_lg_exchange_refusals(mokLayer_t l, int bad, int *first_bad, cudaStream_t st) {
  struct mok_gpu_layer *g = l->gpu;
  const int N = l->cfg.num_ranks;
  g->h_flags[0] = bad; /* (arrays of its own: the forward's counts stay readable) */
  *first_bad = -1;
  if (mok_comm_is_loopback(l->comm)) { /* (no NCCL: the ranks' threads meet on the host) */
    MOK_CHECK(mok_comm_host_allgather(l->comm, g->h_flags, sizeof(int32_t), g->h_flags + 1));
    for (int s = N - 1; s >= 0; s--)
      if (g->h_flags[1 + s]) *first_bad = s;
    return mokSuccess;
  }
  ncclComm_t nc;
  MOK_CHECK(mokCommGetNccl(l->comm, &nc));
  CUDA_CHECK(l, cudaMemcpyAsync(g->d_flags, g->h_flags, sizeof(int32_t), cudaMemcpyHostToDevice, st));
  NCCL_CHECK(l, ncclAllGather(g->d_flags, g->d_flags + 1, 1, ncclInt32, nc, st));
  CUDA_CHECK(l, cudaMemcpyAsync(g->h_flags + 1, g->d_flags + 1, sizeof(int32_t) * (size_t)N, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(l, cudaStreamSynchronize(st));
  *first_bad = -1;
  for (int s = N - 1; s >= 0; s--)
    if (g->h_flags[1 + s]) *first_bad = s;
  return mokSuccess;
}

/* After a step that can fail on one rank alone (rc: this rank's result, mokGetLastError its
 * message): every rank learns whether all got through. Returns rc with its message kept,
 * else `status` naming the lowest rank that failed ("rank r <what>; nothing was written"),
 * else mokSuccess. */
mokResult_t mok_lg_agree_step(mokLayer_t l, mokResult_t rc, mokResult_t status, const char *fn, const char *what,
                              cudaStream_t st) {
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  int first_bad = -1;
  const mokResult_t xr = mok_lg_exchange_refusals(l, rc != mokSuccess, &first_bad, st);
  if (rc != mokSuccess) return mok_error(l, rc, "%s", msg);
  if (xr != mokSuccess) return xr;
  if (first_bad >= 0) return mok_error(l, status, "%s: rank %d %s; nothing was written", fn, first_bad, what);
  return mokSuccess;
}

/* A rank that refuses its forward input still takes part in the forward's count
 * exchange, with its error flag set, so the peers return too. Keeps the message. */
mokResult_t mok_lg_refuse_forward(mokLayer_t l, mokResult_t rc, cudaStream_t st) {
  struct mok_gpu_layer *g = l->gpu;
  const int N = l->cfg.num_ranks, E = l->cfg.num_experts;
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  ncclComm_t nc;
  g->fwd_valid = 0;
  if (mokCommGetNccl(l->comm, &nc) == mokSuccess) {
    const size_t cs = (size_t)(E + CNT_EXTRA);
    memset(g->h_cnt, 0, sizeof(int32_t) * cs);
    g->h_cnt[E + CNT_BAD] = 1;
    if (cudaMemcpyAsync(g->d_cnt, g->h_cnt, 4 * cs, cudaMemcpyHostToDevice, st) == cudaSuccess &&
        ncclAllGather(g->d_cnt, g->d_cnt_all, cs, ncclInt32, nc, st) == ncclSuccess)
      cudaMemcpyAsync(g->h_cnt_all, g->d_cnt_all, 4 * (size_t)N * cs, cudaMemcpyDeviceToHost, st);
    cudaStreamSynchronize(st);
    cudaGetLastError();
  }
  return mok_error(l, rc, "%s", msg);
}

__global__ void k_take_status(unsigned long long *status) { status[1] = atomicExch(status, 0ull); }

extern "C" mokResult_t mokLayerGetAsyncError(mokLayer_t l, mokResult_t *status) {
  static const char fn[] = "mokLayerGetAsyncError";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  if (!status) return mok_error(l, mokInvalidArgument, "%s: status is NULL", fn);
  *status = mokSuccess;
  if (!l->gpu || !l->gpu->d_status) return mokSuccess; /* (host only, or one rank: nothing is recorded here) */
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(l->gpu->device);
  /* (a stream of its own: neither the legacy stream nor the caller's waits for it or it for them) */
  cudaStream_t own = NULL;
  unsigned long long w = 0;
  cudaError_t e = cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
  if (e == cudaSuccess) { /* read and clear in one atomic step: a record landing meanwhile is not lost */
    k_take_status<<<1, 1, 0, own>>>(l->gpu->d_status);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(&w, l->gpu->d_status + 1, sizeof w, cudaMemcpyDeviceToHost, own);
  if (e == cudaSuccess) e = cudaStreamSynchronize(own);
  if (own) cudaStreamDestroy(own);
  if (prev >= 0) cudaSetDevice(prev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokCudaError, "%s: reading the layer's status word failed: %s", fn, cudaGetErrorString(e));
  }
  if (w) {
    char text[MOK_ERRMSG_LEN];
    mok_errword_text(w, text, sizeof text);
    *status = mokDeviceError;
    mok_error(l, mokDeviceError, "%s: a pass was refused on the device and wrote nothing: %s", fn, text);
    mok_clear_error(); /* (the call itself succeeded; the layer's last error keeps the text) */
  }
  return mokSuccess;
}

extern "C" mokKernelAnchor mok_anchor_baseline(void) {
  mokKernelAnchor a = {"src/baseline.cu", (const void *)k_take_status, {NULL}};
  return a;
}
