/* workspace.c — device blocks that grow with their passes (see workspace.h). */
#include "workspace.h"

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

static void block_free(void *p, cudaStream_t st, int pools) {
  if (!p) return;
  if (pools) cudaFreeAsync(p, st);
  else cudaFree(p); /* (waits for the device) */
}

mokResult_t mok_devbuf_reserve(struct mokLayer *l, mok_devbuf *b, size_t bytes, cudaStream_t st, const char *fn,
                               const char *what) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokInvalidArgument, "%s: the stream is not a valid CUDA stream", fn);
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
