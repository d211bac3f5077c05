/*
 * workspace.h — device blocks that grow with the passes that use them (internal; C11).
 *
 * A layer's row buffers are sized by the rows its passes really have, not by the worst
 * case of its config (N * T_max * k rows: 33-48 GiB a layer at EP8, docs/MEGAKERNEL.md
 * "Device memory per layer"). Each pass carves its buffers out of two blocks:
 *   - the layer's saved block (what the backward reads: X, [g|u], a, y), kept between
 *     the forward and its backward;
 *   - the scratch block of the layer's communicator, shared by every layer on it (what
 *     one pass uses and drops: send / receive rows, fp32 partials, [dG|dU]).
 * A block grows when a pass needs more than it holds, in stream order on the pass's
 * stream (cudaFreeAsync of the old block, cudaMallocAsync of the new one, from the
 * device's default pool; cudaFree / cudaMalloc where the device has no pools), with a
 * quarter of headroom after the first size so that passes whose rows vary a little do
 * not grow it each time. It never shrinks before its owner is destroyed.
 *
 * Streams: passes that share a block are ordered by it. A pass on another stream than
 * the block's last user first waits for that user's work (an event), so layers of one
 * communicator never overlap on their scratch, whatever streams they run on.
 *
 * CUDA graphs: a pass captured in a graph keeps the block's address; growing it later
 * retires the old block (freed with the owner) instead of freeing it, and growing during
 * a capture is refused (mokInvalidUsage): run a pass of that size, or mokLayerReserve,
 * before capturing.
 */
#ifndef MOK_WORKSPACE_H
#define MOK_WORKSPACE_H

#include "mok.h"

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mokLayer;
struct mok_retired;

typedef struct mok_devbuf {
  void *ptr;
  size_t bytes;
  int captured;                /* a CUDA graph was captured over ptr */
  struct mok_retired *retired; /* blocks earlier graphs hold: freed with the owner */
  size_t retired_bytes;
  cudaStream_t last;           /* the last stream a pass used it on (valid if ev_live) */
  cudaEvent_t ev;              /* recorded on `last` after that pass */
  int ev_live;
} mok_devbuf;

/* Makes b hold at least `bytes` for a pass on `st` (growing it as above) and orders the
 * pass after the block's last user on another stream. Errors name fn and what:
 * mokOutOfMemory, mokInvalidUsage (growth during a capture), mokCudaError.
 * l: the layer the message is recorded on (may be NULL). */
mokResult_t mok_devbuf_reserve(struct mokLayer *l, mok_devbuf *b, size_t bytes, cudaStream_t st, const char *fn,
                               const char *what);
/* After a pass that reserved b on st: records the event later passes on other streams
 * wait for (nothing while st is capturing). */
void mok_devbuf_done(mok_devbuf *b, cudaStream_t st);
/* Bytes b holds, retired blocks included. */
size_t mok_devbuf_held(const mok_devbuf *b);
/* Frees every block of b; the caller has synchronised the device. */
void mok_devbuf_free(mok_devbuf *b);

#ifdef __cplusplus
}
#endif
#endif /* MOK_WORKSPACE_H */
