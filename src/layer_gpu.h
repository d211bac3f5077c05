/*
 * layer_gpu.h — the layer on GPUs, shared by its three files (internal; CUDA C++ only):
 * layer_api.cu (create / free, the checks of a pass, the public entry points), baseline.cu
 * (the NCCL paths mokImplNccl and mokImplBaseline, the row buffers, the shared expert) and
 * layer_mega.cu (mokImplMega: one GPU, and stage A at N > 1). The layer's device state, and
 * the helpers its files call (mok_lg_*).
 */
#ifndef MOK_LAYER_GPU_H
#define MOK_LAYER_GPU_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemm.h"
#include "internal.h"
#include "mok.h"
#include "workspace.h"

#define NUM_GKINDS 9
/* The forward's count exchange: E route counts, then CNT_BAD (error flag), CNT_TOKENS,
 * CNT_SAVED_MIB, CNT_SCRATCH_MIB (what the rank's row blocks hold: layout_saved). */
enum { CNT_BAD, CNT_TOKENS, CNT_SAVED_MIB, CNT_SCRATCH_MIB, CNT_EXTRA };
static_assert(CNT_EXTRA == 4, "mok_layer_fixed_bytes (workspace.c) counts E + 4 ints an exchange");

struct mok_gpu_layer {
  int device;
  cublasHandle_t cublas;   /* shared expert GEMMs and per-expert loops */
  /* One handle per grouped expert GEMM kind: cuBLAS's grouped call prepares each new set
   * of problem shapes on the host, and with one handle a forward + backward alternates
   * nine sets, so every call paid that preparation (measured: qwen3.5 T=2048 forward
   * GEMMs 2.7 ms alone, 10.7 ms between backwards). A handle per kind keeps its set. */
  cublasHandle_t cublas_kind[NUM_GKINDS];
  int64_t cap;           /* padded rows of the last forward (R: the row buffers' capacity) */
  /* host, pinned */
  int32_t *h_idx;        /* [T_max*k] */
  int32_t *h_pos;        /* [T_max*k] send row of each route, -1 for an empty slot */
  int32_t *h_cnt;        /* [E + CNT_EXTRA] this rank's routes per global expert, then the error flag,
                            its tokens and the MiB its saved and scratch blocks hold */
  int32_t *h_cnt_all;    /* [N, E + CNT_EXTRA] every rank's */
  int32_t *h_flags;      /* [1 + N] exchange_refusals: this rank's flag, then every rank's */
  int32_t *h_map;        /* [cap] receive row of each padded row, -1 on padding */
  /* device */
  int32_t *d_cnt, *d_cnt_all, *d_pos, *d_map, *d_flags; /* (d_flags: [1 + N], as h_flags) */
  /* The row buffers of a pass, carved from two growing blocks (workspace.h; layout_saved,
   * layout_scratch): R = the forward's padded rows (g->cap), Q = its routes T*k, T64 = its
   * tokens rounded up to 64. Saved (the layer's block `saved`, kept for the backward): */
  mok_devbuf saved;
  mokBf16 *xg;           /* [R, H] gathered X */
  mokBf16 *gu;           /* [R, 2I] [g|u] (bf16, +-inf where clamped) */
  mokBf16 *act;          /* [R, I] a */
  mokBf16 *yret;         /* [Q, H] y_tj in send order (NCCL paths) */
  mokBf16 *s_gu, *s_act; /* [T64, 2 I_s], [T64, I_s] */
  /* Scratch (the communicator's block, dead between passes); mokImplMega keeps yp saved: */
  mokBf16 *yp;           /* [R, H] expert outputs, then dY (padded layout) */
  mokBf16 *send;         /* [Q, H]: x rows, then dY rows; finally dX partials (send order) */
  mokBf16 *recv;         /* [rows received, H] */
  float *gu32;           /* [R, 2I] fp32 [g|u] when the clamp is on (cuBLAS) */
  float *f32;            /* cuBLAS: [R, max(I, H)] fp32 dA, then dX; mok's GEMMs: [R, H] bf16 dX */
  mokBf16 *dgu;          /* [R, 2I] [dG|dU] */
  float *s_gu32;         /* [T64, 2 I_s] when the clamp is on (cuBLAS) */
  mokBf16 *s_y;          /* [T64, H] */
  float *s_f32;          /* [T64, max(I_s, H)]; mokImplMega's backward: the shared dX rows
                            (bf16) of mok_gemm_shared_backward */
  mokBf16 *s_dgu;        /* [T64, 2 I_s] */
  int64_t fwd_recv, fwd_routes; /* rows the last forward received (NCCL paths), its routes */
  size_t fixed_bytes;    /* device bytes of the index arrays made at create (mokLayerMemoryInfo) */
  /* grouped GEMM arguments: host arrays [E_l]; pointer arrays in SLOTS rotating slots
   * (pinned host -> device), so a call never overwrites pointers a pending copy reads */
  int *gm, *gn, *gk, *glda, *gldb, *gldc, *gsize;
  float *galpha, *gbeta;
  cublasOperation_t *gta, *gtb;
  const void **h_ptrs, **d_ptrs; /* [MOK_LG_SLOTS][3][E_l] */
  const void **ops;              /* [3][E_l] host scratch: A, B, C of the groups of one call */
  int32_t *cursor;               /* [E + 1] host scratch: next send row of each expert */
  int slot;
  int grouped_ok;                /* cublasGemmGroupedBatchedEx usable (else a loop of GEMMs) */
  unsigned grouped_mask;         /* ~0: choose per call; else bit k: kind k grouped (MOK_BASELINE_GROUPED) */
  /* The implementation of the last forward (resolve_impl; the backward runs the same):
   * its expert GEMMs are cuBLAS (mokImplBaseline) or mok's grouped Hopper GEMMs
   * (mokImplNccl; src/gemm.cu), which read the segment offsets from the device, so one
   * launch covers every expert whatever its rows. */
  mokImpl_t fwd_impl;
  int sm90;              /* the device is Hopper: mokImplAuto resolves to mokImplNccl */
  /* mokImplMega (one GPU): the device schedule's arrays (its backward needs no host copy) */
  int32_t *d_route_row, *d_row_tok, *d_bad, *d_sched_scratch;
  int32_t *d_shared_seg; /* [3] the shared expert as the megakernel's one-expert problem */
  int mega_comm_ctas;    /* MOK_MEGA_COMM_CTAS, else the default */
  int mega_ctas;         /* MOK_MEGA_CTAS (diagnostics): the megakernel's CTAs, else 0 (mega_ctas' rule) */
  int mega_shared;       /* the shared expert as tiles of the launch where it can (MOK_MEGA_SHARED=0: cuBLAS) */
  int mega_combine;      /* one GPU: the combine in the forward megakernel (MOK_MEGA_COMBINE=0: its own launch) */
  int mega_push;         /* N > 1: the y rows pushed to their sources inside the megakernel (MOK_MEGA_PUSH=1;
                            off by default until timed on two GPUs) */
  int fwd_shared_in;     /* the last forward (mokImplMega) ran the shared expert as tiles of its launch:
                            the backward runs it on mok's GEMMs too, with no host wait */
  /* mokImplMega at N > 1 (stage A, mega_ep_forward): the send order's schedule over the E
   * global experts (its scratch, its row tokens [T_max k]) and the sources' x table [N] */
  int32_t *d_ep_scratch, *d_ep_rowtok;
  const mokBf16 **d_xsrc;
  const mokBf16 *xsrc[MOK_GEMM_MAX_SOURCES]; /* what d_xsrc holds (written when the window moved) */
  int xsrc_n;                                /* its entries; 0 = not written yet */
  unsigned long long *d_status; /* N > 1: [2] the first refusal of a pass no host saw (device-only
                                   mode; mokLayerGetAsyncError takes it into [1] and clears it) */
  int ep_barriers;       /* cross-rank barriers the current pass at N > 1 launched (mok_lg_mega_ep_complete) */
  int64_t ep_recv_cap;   /* mokLayerSetRecvCapacity: 0, or the rows the row buffers hold (the
                            routes plus every expert's padding): no host read, no host exchange */
  int32_t *d_seg;        /* [2 E_l + 1] the last forward's routed rows of each expert, then its
                            segment offsets (device; the layout of seg_cnt / seg_off) */
  /* MOK_BASELINE_PROFILE=1: per-phase times of every pass on stderr (measurements only) */
  int prof, nev;
  cudaEvent_t ev[32];
  const char *evname[32];
  /* the last forward (host) */
  int fwd_valid, fwd_tokens;
  int64_t *send_cnt, *send_base, *recv_cnt, *recv_base; /* [N] rows */
  int32_t *seg_cnt, *seg_off;                           /* [E_l], [E_l + 1] */
};

/* mokImplMega: comm CTAs of the forward megakernel (they dispatch, then join the down tiles).
 * T=8192, 1x H200 (docs/PERF.md): 8 / 16 / 32 / 48 gave qwen3.5 6.55 / 5.62 / 5.49 / 5.55 ms,
 * glm-5.2 10.49 / 10.53 / 10.55 / 10.54. */
#define MEGA_COMM_CTAS 32

typedef mok_pass_shape pass_shape;

/* Blocks for n items at per_block each (1 .. 65535). */
static inline unsigned grid_for(int64_t n, int64_t per_block) {
  int64_t b = (n + per_block - 1) / per_block;
  return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
/* The shape of a mokImplMega forward of T tokens on one rank (its rows bound). */
static inline pass_shape mega_shape(mokLayer_t l, int T, int shared_in) {
  return mok_shape_mega(&l->cfg, T, shared_in);
}

/* A cuBLAS call's failure, returned as mokCudaError with the call's text. */
#define CUBLAS_CHECK(l, call)                                                                         \
  do {                                                                                                \
    cublasStatus_t s_ = (call);                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                  \
      return mok_error((l), mokCudaError, "%s:%d: %s failed: cuBLAS status %d", __FILE__, __LINE__, #call, \
                       (int)s_);                                                                      \
  } while (0)
/* Grouped-GEMM pointer arrays: slots used in turn (h_ptrs / d_ptrs hold 3 x El a slot). */
#define MOK_LG_SLOTS 32

/* ---- baseline.cu ---------------------------------------------------------------------- */
/* The GEMMs' rows: El experts, cap rows, seg = [expert_count[El] | expert_offset[El + 1]]
 * (device), the comm's error word. */
mokResult_t mok_lg_gemm_rows(mokLayer_t l, int El, int64_t cap, const int32_t *seg, mokGemmRows_t *r);
/* MOK_BASELINE_PROFILE=1: an event named `name` on st; the pass's times on stderr. */
void mok_lg_prof_mark(struct mok_gpu_layer *g, const char *name, cudaStream_t st);
void mok_lg_prof_report(struct mok_gpu_layer *g, const char *pass, int rank);
/* Makes the blocks hold pass p's buffers and carves them (workspace.h). */
mokResult_t mok_lg_pass_buffers(mokLayer_t l, const pass_shape *p, int backward, cudaStream_t st, const char *fn);
/* The shared expert on cuBLAS: forward (s_gu, s_act saved, s_y), backward (dX fp32 in s_f32). */
mokResult_t mok_lg_shared_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, cudaStream_t st);
mokResult_t mok_lg_shared_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                   const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st);
/* mok's four backward GEMMs over the forward's rows (dY in yp): dX rows bf16 into dxb. */
mokResult_t mok_lg_expert_backward(mokLayer_t l, const mokRankWeights_t *w, const mokRankGrads_t *gr, mokBf16 *dxb,
                                   const int32_t *skip, cudaStream_t st);
mokDtype_t mok_lg_wgrad_dtype(mokLayer_t l, const mokRankGrads_t *gr);
/* Every rank's refusal flag (host collective): *first_bad = the lowest rank that refused, or -1. */
mokResult_t mok_lg_exchange_refusals(mokLayer_t l, int bad, int *first_bad, cudaStream_t st);
/* After a step that can fail on one rank alone: rc kept, else `status` naming the first
 * rank that failed ("rank r <what>; nothing was written"), else mokSuccess. */
mokResult_t mok_lg_agree_step(mokLayer_t l, mokResult_t rc, mokResult_t status, const char *fn, const char *what,
                              cudaStream_t st);
/* out[t] = bf16(base[t] + sum_j rows[pos[t k + j]]) (k_combine<float>; base NULL = 0). */
void mok_lg_combine_f32(const float *base, const mokBf16 *rows, const int32_t *pos, int T, int k, int H,
                        const int32_t *bad, mokBf16 *out, cudaStream_t st);

/* The conventional and mokImplNccl passes (mokLayerForward / mokLayerBackward, layer_api.cu,
 * call them after check_pass). A forward of a rank that refused its input still takes part
 * in the count exchange (mok_lg_refuse_forward). */
mokResult_t mok_lg_baseline_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, mokBf16 *out,
                                    cudaStream_t st);
mokResult_t mok_lg_baseline_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                     const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st);
mokResult_t mok_lg_refuse_forward(mokLayer_t l, mokResult_t rc, cudaStream_t st);
/* The row buffers (workspace.h): the saved block's size (with base: its pointers carved),
 * the scratch a pass needs, the last forward's shape; after a pass, later passes on other
 * streams wait for it before they reuse the blocks (mok_lg_pass_done). */
size_t mok_lg_layout_saved(mokLayer_t l, const pass_shape *p, void *base);
size_t mok_lg_scratch_need(mokLayer_t l, const pass_shape *p);
pass_shape mok_lg_fwd_shape(mokLayer_t l);
void mok_lg_pass_done(mokLayer_t l, cudaStream_t st);

/* ---- layer_mega.cu: mokImplMega's passes (one GPU; N > 1: stage A) ---------------------- */
mokResult_t mok_lg_mega_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, mokBf16 *out,
                                cudaStream_t st);
mokResult_t mok_lg_mega_ep_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, mokBf16 *out,
                                   cudaStream_t st);
mokResult_t mok_lg_mega_backward_check(mokLayer_t l, cudaStream_t st);
mokResult_t mok_lg_mega_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                 const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st);
/* mokLayerSetRecvCapacity's refusal: this rank's BAD flag set and the pass's two barriers
 * run (its peers write nothing and record mokDeviceError); returns rc, its message kept. */
mokResult_t mok_lg_mega_ep_refuse(mokLayer_t l, mokResult_t rc, cudaStream_t st);
/* After an error inside a pass at N > 1 with a receive capacity: the barriers this rank's
 * peers still expect, so theirs stay in step (none launched: mok_lg_mega_ep_refuse; one: this
 * rank's FLAG set, the second launched; its peers then write nothing). Returns rc, message
 * kept. Stage A (no capacity): rc as it is (its host exchanges, or a barrier's timeout that
 * the communicator reports, stop the peers). */
mokResult_t mok_lg_mega_ep_complete(mokLayer_t l, mokResult_t rc, cudaStream_t st);
mokResult_t mok_lg_mega_ep_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                    const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st);

#endif /* MOK_LAYER_GPU_H */
