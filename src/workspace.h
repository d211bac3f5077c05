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
#include <stdint.h>

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
/* Frees b's block in stream order on st, after its last user (mokLayerTrim): returns the
 * bytes freed; a block a captured CUDA graph uses is kept (0), and so is one whose free
 * failed (*err). The next reserve allocates again. The caller has checked that st is not
 * capturing. */
size_t mok_devbuf_trim(mok_devbuf *b, cudaStream_t st, cudaError_t *err);
/* Bytes b holds, retired blocks included. */
size_t mok_devbuf_held(const mok_devbuf *b);
/* Frees every block of b; the caller has synchronised the device. */
void mok_devbuf_free(mok_devbuf *b);

/* ---- the layouts (host only; used by the layer and by mokLayerMemoryEstimate) ---------- */
/* What a pass's row buffers depend on. */
typedef struct mok_pass_shape {
  int64_t rows;    /* padded rows R of the forward (>= row_pad) */
  int64_t recv;    /* rows received (NCCL paths) */
  int64_t routes;  /* rows in send order (NCCL paths: the routes that are not -1) */
  int64_t tokens;  /* T */
  mokImpl_t impl;  /* resolved: mokImplMega, mokImplNccl or mokImplBaseline */
  int shared_in;   /* mokImplMega runs the shared expert as tiles of its launch */
} mok_pass_shape;

/* The saved block's buffers, then the scratch block's, in carve order (each 256-byte
 * aligned); an offset MOK_LAYOUT_NONE = the pass has no such buffer. */
enum { MOK_SV_XG, MOK_SV_GU, MOK_SV_ACT, MOK_SV_YP, MOK_SV_YRET, MOK_SV_SGU, MOK_SV_SACT, MOK_SV_NUM };
enum {
  MOK_SC_SEND, MOK_SC_RECV, MOK_SC_YP, MOK_SC_GU32, MOK_SC_SY, MOK_SC_SGU32, MOK_SC_F32, MOK_SC_DGU, MOK_SC_SF32,
  MOK_SC_SDGU, MOK_SC_NUM
};
#define MOK_LAYOUT_NONE ((size_t)-1)

/* Bytes of the saved block of pass p (config c: validated); off (or NULL) gets the offsets. */
size_t mok_layout_saved(const mokConfig_t *c, const mok_pass_shape *p, size_t off[MOK_SV_NUM]);
/* Bytes of the scratch a forward (backward = 0) or backward of p uses; off as above. */
size_t mok_layout_scratch(const mokConfig_t *c, const mok_pass_shape *p, int backward, size_t off[MOK_SC_NUM]);
/* The scratch a forward reserves: its own and its backward's (a backward never grows it). */
size_t mok_scratch_need(const mokConfig_t *c, const mok_pass_shape *p);
/* Shapes: mokImplMega's forward of T tokens on one rank (its rows bound: T k + E_l (P - 1));
 * a pass of `impl` where this rank receives `recv` routes spread evenly over its E_l experts
 * (balanced: recv = T k; the worst routing: recv = N T k, in one expert's segment or not,
 * the padding bound is the same). */
mok_pass_shape mok_shape_mega(const mokConfig_t *c, int64_t tokens, int shared_in);
mok_pass_shape mok_shape_spread(const mokConfig_t *c, mokImpl_t impl, int64_t tokens, int64_t recv, int worst);
/* mokImplMega at N > 1 (stage A): what peers read or write in the communicator's symmetric
 * workspace (baseline.cu, layer_mega.cu): first BAD [1] and FLAG [1] int32 at offsets that do
 * not depend on the config (0 and 256: a peer may read FLAG after a pass's second barrier,
 * when this rank may already write the next layer's regions, whatever that layer's shape):
 * BAD this rank's refusal of its pass, FLAG the forward's pass flag as its schedule left it;
 * then CNT [E], OFF [E + 1] int32 (the send order's counts and first positions), ORD
 * [T_max k] int32 (the send order), X [T_max, H] bf16 (tokens; the backward's d_out), W and
 * DW [T_max k] f32 (topk_w, d_topk_w), COMB [T_max k, H] bf16 (y or dX of each route, slot
 * t k + j); each 256-byte aligned. Returns the bytes; off (or NULL) gets the offsets. */
enum { MOK_EP_BAD, MOK_EP_FLAG, MOK_EP_CNT, MOK_EP_OFF, MOK_EP_ORD, MOK_EP_X, MOK_EP_W, MOK_EP_DW, MOK_EP_COMB,
       MOK_EP_NUM };
size_t mok_layout_ep_window(const mokConfig_t *c, size_t off[MOK_EP_NUM]);
/* mokImplMega's forward at N > 1 that received `rows` padded rows (shape of its buffers). */
mok_pass_shape mok_shape_mega_rows(const mokConfig_t *c, int64_t tokens, int shared_in, int64_t rows);
/* Device bytes of a layer's index arrays (made at create; the layer's fixed part). */
size_t mok_layer_fixed_bytes(const mokConfig_t *c);

#ifdef __cplusplus
}
#endif
#endif /* MOK_WORKSPACE_H */
