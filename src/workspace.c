/* workspace.c — device blocks that grow with their passes (see workspace.h). */
#include "workspace.h"

#include "schedule_dev.h" /* defines: mok_schedule_local_scratch */

#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

struct mok_retired {
  void *ptr;
  struct mok_retired *next;
};

#define DEVBUF_ALIGN ((size_t)64 << 10) /* (the pool maps 2 MiB pages; blocks share them) */

static int pools_supported(void) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

static cudaError_t block_free(void *p, cudaStream_t st, int pools) {
  if (!p) return cudaSuccess;
  return pools ? cudaFreeAsync(p, st) : cudaFree(p); /* (cudaFree waits for the device) */
}

mokResult_t mok_devbuf_reserve(struct mokLayer *l, mok_devbuf *b, size_t bytes, cudaStream_t st, const char *fn,
                               const char *what) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaError_t qe = cudaStreamIsCapturing(st, &cs);
  if (qe != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, qe == cudaErrorStreamCaptureImplicit ? mokInvalidUsage : mokInvalidArgument,
                     "%s: cannot ask the stream whether it captures a CUDA graph: %s%s", fn, cudaGetErrorString(qe),
                     qe == cudaErrorStreamCaptureImplicit ? " (another thread captures in global mode: pass a "
                     "stream of your own, not the legacy default stream)" : "");
  }
  const int capturing = cs != cudaStreamCaptureStatusNone;
  if (!capturing && b->ev_live && b->last != st && cudaStreamWaitEvent(st, b->ev, 0) != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokCudaError, "%s: cannot order the pass after the last user of the %s", fn, what);
  }
  if (bytes <= b->bytes) {
    if (capturing) b->captured = 1;
    return mokSuccess;
  }
  if (capturing)
    return mok_error(l, mokInvalidUsage, "%s: the %s needs %.1f MiB but holds %.1f MiB, and the stream is capturing a "
                     "CUDA graph (a block cannot grow inside a capture): run one pass of this size before capturing, "
                     "or call mokLayerReserve", fn, what, bytes / 1048576.0, b->bytes / 1048576.0);
  size_t want = b->bytes ? b->bytes + b->bytes / 4 : 0;
  if (want < bytes) want = bytes;
  want = (want + DEVBUF_ALIGN - 1) / DEVBUF_ALIGN * DEVBUF_ALIGN;
  const int pools = pools_supported();
  if (b->ptr) {
    if (b->captured) { /* a graph holds it: keep it until the owner goes */
      struct mok_retired *r = (struct mok_retired *)malloc(sizeof *r);
      if (!r) return mok_error(l, mokOutOfMemory, "%s: out of host memory", fn);
      r->ptr = b->ptr, r->next = b->retired;
      b->retired = r;
      b->retired_bytes += b->bytes;
    } else {
      block_free(b->ptr, st, pools);
    }
    b->ptr = NULL, b->bytes = 0, b->captured = 0;
  }
  void *p = NULL;
  cudaError_t e = pools ? cudaMallocAsync(&p, want, st) : cudaMalloc(&p, want);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, e == cudaErrorMemoryAllocation ? mokOutOfMemory : mokCudaError,
                     "%s: cannot allocate %.2f GiB of device memory for the %s (%.2f GiB needed): %s", fn,
                     want / 1073741824.0, what, bytes / 1073741824.0, cudaGetErrorString(e));
  }
  b->ptr = p, b->bytes = want;
  return mokSuccess;
}

void mok_devbuf_done(mok_devbuf *b, cudaStream_t st) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return;
  }
  if (!b->ev && cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    b->ev = NULL;
    return;
  }
  if (cudaEventRecord(b->ev, st) == cudaSuccess) b->last = st, b->ev_live = 1;
  else cudaGetLastError();
}

size_t mok_devbuf_trim(mok_devbuf *b, cudaStream_t st, cudaError_t *err) {
  *err = cudaSuccess;
  if (!b->ptr || b->captured) return 0;
  if (b->ev_live && b->last != st && cudaStreamWaitEvent(st, b->ev, 0) != cudaSuccess) {
    cudaGetLastError();
    cudaStreamSynchronize(b->last); /* (ordered the slow way) */
    cudaGetLastError();
  }
  const size_t had = b->bytes;
  *err = block_free(b->ptr, st, pools_supported());
  if (*err != cudaSuccess) {
    cudaGetLastError();
    return 0; /* (kept: it may still be in use) */
  }
  b->ptr = NULL, b->bytes = 0;
  return had;
}

size_t mok_devbuf_held(const mok_devbuf *b) { return b->bytes + b->retired_bytes; }

void mok_devbuf_free(mok_devbuf *b) {
  if (b->ptr) cudaFree(b->ptr);
  while (b->retired) {
    struct mok_retired *r = b->retired;
    b->retired = r->next;
    cudaFree(r->ptr);
    free(r);
  }
  if (b->ev) cudaEventDestroy(b->ev);
  b->ptr = NULL, b->bytes = 0, b->retired_bytes = 0, b->ev = NULL, b->ev_live = 0, b->captured = 0;
}

/* ---- layouts ------------------------------------------------------------------------- */
static size_t take(size_t *off, int q, size_t *at, int64_t elems, size_t esz) {
  const size_t bytes = elems > 0 ? (size_t)elems * esz : 0;
  if (off) off[q] = bytes ? *at : MOK_LAYOUT_NONE;
  *at += (bytes + 255) & ~(size_t)255;
  return bytes;
}

size_t mok_layout_saved(const mokConfig_t *c, const mok_pass_shape *p, size_t off[MOK_SV_NUM]) {
  const int64_t H = c->hidden, I = c->inter, Is = c->shared_inter, R = p->rows, T64 = (p->tokens + 63) / 64 * 64;
  const int mega = p->impl == mokImplMega;
  size_t at = 0;
  take(off, MOK_SV_XG, &at, R * H, 2);
  take(off, MOK_SV_GU, &at, R * 2 * I, 2);
  take(off, MOK_SV_ACT, &at, R * I, 2);
  take(off, MOK_SV_YP, &at, mega ? R * H : 0, 2);            /* (y: its backward reads it in place) */
  take(off, MOK_SV_YRET, &at, mega ? 0 : p->routes * H, 2);  /* (y in send order) */
  take(off, MOK_SV_SGU, &at, T64 * 2 * Is, 2);
  take(off, MOK_SV_SACT, &at, T64 * Is, 2);
  return at;
}

size_t mok_layout_scratch(const mokConfig_t *c, const mok_pass_shape *p, int backward, size_t off[MOK_SC_NUM]) {
  const int64_t H = c->hidden, I = c->inter, Is = c->shared_inter, R = p->rows, T64 = (p->tokens + 63) / 64 * 64;
  const int64_t swide = Is > H ? Is : H;
  const int clamp = c->swiglu_limit > 0, mega = p->impl == mokImplMega, cublas = p->impl == mokImplBaseline;
  const int fwd = !backward, bwd = backward;
  size_t at = 0;
  take(off, MOK_SC_SEND, &at, mega ? 0 : p->routes * H, 2);
  take(off, MOK_SC_RECV, &at, mega ? 0 : p->recv * H, 2);
  take(off, MOK_SC_YP, &at, mega ? 0 : R * H, 2);
  take(off, MOK_SC_GU32, &at, fwd && cublas && clamp ? R * 2 * I : 0, 4);
  take(off, MOK_SC_SY, &at, fwd ? T64 * H * (Is > 0) : 0, 2);
  take(off, MOK_SC_SGU32, &at, fwd && Is && clamp && !p->shared_in ? T64 * 2 * Is : 0, 4);
  /* dA then dX in fp32 (cuBLAS), or mok's bf16 dX rows */
  take(off, MOK_SC_F32, &at, !bwd ? 0 : cublas ? R * (I > H ? I : H) : (R * H + 1) / 2, 4);
  take(off, MOK_SC_DGU, &at, bwd ? R * 2 * I : 0, 2);
  take(off, MOK_SC_SF32, &at, bwd && Is ? T64 * swide : 0, 4);
  take(off, MOK_SC_SDGU, &at, bwd && Is ? T64 * 2 * Is : 0, 2);
  return at;
}

size_t mok_scratch_need(const mokConfig_t *c, const mok_pass_shape *p) {
  const size_t f = mok_layout_scratch(c, p, 0, NULL), b = mok_layout_scratch(c, p, 1, NULL);
  return f > b ? f : b;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

mok_pass_shape mok_shape_mega(const mokConfig_t *c, int64_t tokens, int shared_in) {
  const int64_t P = c->row_pad, El = c->num_experts / c->num_ranks;
  mok_pass_shape p = {0, 0, 0, 0, mokImplMega, 0};
  p.shared_in = shared_in, p.tokens = tokens, p.routes = tokens * c->topk;
  p.rows = round_up(p.routes + El * (P - 1), P);
  if (p.rows < P) p.rows = P;
  return p;
}

mok_pass_shape mok_shape_mega_rows(const mokConfig_t *c, int64_t tokens, int shared_in, int64_t rows) {
  mok_pass_shape p = mok_shape_mega(c, tokens, shared_in);
  p.rows = rows < c->row_pad ? c->row_pad : rows;
  return p;
}

size_t mok_layout_ep_window(const mokConfig_t *c, size_t off[MOK_EP_NUM]) {
  const size_t E = (size_t)c->num_experts, Q = (size_t)c->max_tokens * c->topk, H = (size_t)c->hidden;
  const size_t bytes[MOK_EP_NUM] = {4, 4, 4 * E, 4 * (E + 1), 4 * Q, 2 * (size_t)c->max_tokens * H, 4 * Q, 4 * Q,
                                    2 * Q * H};
  size_t o = 0;
  for (int i = 0; i < MOK_EP_NUM; i++) {
    if (off) off[i] = o;
    o += (bytes[i] + 255) / 256 * 256;
  }
  return o;
}

mok_pass_shape mok_shape_spread(const mokConfig_t *c, mokImpl_t impl, int64_t tokens, int64_t recv, int worst) {
  const int64_t P = c->row_pad, El = c->num_experts / c->num_ranks;
  mok_pass_shape p = {0, 0, 0, 0, impl, 0};
  p.tokens = tokens, p.routes = tokens * c->topk, p.recv = recv;
  p.rows = worst ? round_up(recv + El * (P - 1), P) : El * round_up((recv + El - 1) / El, P);
  if (p.rows < P) p.rows = P;
  return p;
}

size_t mok_layer_fixed_bytes(const mokConfig_t *c) {
  const int64_t N = c->num_ranks, E = c->num_experts, El = E / N, T = c->max_tokens, k = c->topk, P = c->row_pad;
  const int64_t cap = round_up(N * T * k + El * (P - 1), P); /* (the schedule's capacity) */
  /* counts and their exchange, send positions, row map, refusal flags, route rows, row
   * tokens, segments (see gpu_alloc) */
  const size_t base = 4 * (size_t)((E + 4) * (N + 1) + T * k + cap + (N + 1) + (T * k + 1) + cap + (2 * El + 1));
  /* N > 1: mokImplMega's send-order schedule over E experts (its scratch, row tokens) and
   * the sources' x table */
  return base + (N > 1 ? 4 * (size_t)(mok_schedule_local_scratch((int)E) + T * k + 1) + 8 * (size_t)N : 0);
}
