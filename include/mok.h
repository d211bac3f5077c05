/*
 * mok.h — the public C API of mok: expert-parallel Mixture-of-Experts layers for
 * NVLink scale-up domains (the Mixture-of-Kittens design: one persistent megakernel
 * per pass that fuses dispatch, shared and routed SwiGLU experts and combine).
 *
 * This header is the whole public surface. It compiles alone as C11 or C++ and
 * includes no CUDA or NCCL header: cudaStream_t and ncclComm_t are declared here
 * exactly as CUDA and NCCL declare them, so the two agree when both are included.
 *
 * Conventions (binding for every entry point; DESIGN.md section 2a):
 *  - Every call returns a mokResult_t. Outputs go through pointers. A failing call
 *    writes nothing to its outputs, sets the calling thread's last-error message
 *    (mokGetLastError) and, when it has a handle, that handle's message too.
 *  - Tensors are row-major and contiguous. bf16 values travel as raw 16-bit
 *    patterns (mokBf16). Shapes are written [rows, cols].
 *  - Per-rank tensors: x [T_r, H] bf16; topk_idx [T_r, k] int32 (global expert id in
 *    [0, E) or -1 for an empty slot); topk_w [T_r, k] fp32; out [T_r, H] bf16.
 *    Routed weights of the E_l = E / N local experts of a rank, stacked:
 *    w_gate, w_up [E_l, I, H]; w_down [E_l, H, I]. Shared expert (replicated):
 *    s_gate, s_up [I_s, H]; s_down [H, I_s]; I_s = 0 means no shared expert.
 *    Rank r owns global experts [r*E_l, (r+1)*E_l).
 *  - Gradients: d_x [T_r, H] bf16; d_topk_w [T_r, k] fp32; every dW in its weight's
 *    shape with the dtype chosen in the config; overwritten, never accumulated.
 *
 * Thread safety: distinct handles may be used from distinct threads at once; one
 * handle must not be used by two threads at the same time.
 */
#ifndef MOK_H
#define MOK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version ------------------------------------------------------------------ */
#define MOK_VERSION_MAJOR 0
#define MOK_VERSION_MINOR 1
#define MOK_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH. Within one MAJOR the ABI only grows: structs
 * carry a size field, so fields are appended, never moved. */
#define MOK_VERSION_CODE (MOK_VERSION_MAJOR * 10000 + MOK_VERSION_MINOR * 100 + MOK_VERSION_PATCH)

/* The same types CUDA and NCCL declare (identical typedefs are legal in C11 and C++). */
typedef struct CUstream_st *cudaStream_t;
typedef struct ncclComm *ncclComm_t;

/* Raw bf16 bit pattern (the upper 16 bits of an IEEE fp32). */
typedef uint16_t mokBf16;

/* ---- status ------------------------------------------------------------------- */
/* X(name, value, description): the one list the enum, the names and the strings
 * are generated from. */
#define MOK_RESULT_LIST(X)                                                              \
  X(mokSuccess, 0, "no error")                                                          \
  X(mokInvalidArgument, 1, "invalid argument: a value, size or pointer breaks a documented rule") \
  X(mokInvalidUsage, 2, "invalid usage: the call is not allowed in this state")         \
  X(mokOutOfMemory, 3, "out of memory")                                                 \
  X(mokCudaError, 4, "a CUDA call failed")                                              \
  X(mokNcclError, 5, "an NCCL call failed")                                             \
  X(mokNotSupported, 6, "not supported by this build, device or configuration")        \
  X(mokTimeout, 7, "timed out waiting for a peer or the device")                        \
  X(mokDeviceError, 8, "a kernel detected bad device-resident input or a failed peer") \
  X(mokInternalError, 9, "internal error in mok")

#define MOK_RESULT_ENUM_(name, value, text) name = value,
typedef enum mokResult { MOK_RESULT_LIST(MOK_RESULT_ENUM_) mokNumResults } mokResult_t;
#undef MOK_RESULT_ENUM_

/* Name of the status ("mokInvalidArgument"); "mokUnknownResult" for a value not in the list. */
const char *mokGetErrorName(mokResult_t result);
/* One-line description of the status; never NULL. */
const char *mokGetErrorString(mokResult_t result);
/* The message of the last failing mok call made by the calling thread (handle or not),
 * naming the argument or field and the rule broken; "" when none failed yet.
 * The pointer stays valid until the thread's next mok call. */
const char *mokGetLastError(void);

/* [OUT] version: MOK_VERSION_CODE of the loaded library. */
mokResult_t mokGetVersion(int *version);

/* ---- configuration ------------------------------------------------------------ */
typedef enum mokDtype { mokDtypeBF16 = 0, mokDtypeFP32 = 1 } mokDtype_t;

#define MOK_CONFIG_MAGIC 0x6d6f6b43u /* "mokC" */

/* The layer description. Every rank must pass the same values. Fields left 0 by the
 * initializer marked (required) must be set; the others have working defaults.
 * Rules (checked by mokLayerCreate, each failure names the field):
 *   num_experts E >= 1, divisible by num_ranks; hidden H, inter I >= 64 and multiples
 *   of 64; shared_inter I_s = 0 or a multiple of 64; 1 <= topk k <= 32 and k <= E;
 *   num_ranks N >= 1; max_tokens T_max >= 1; row_pad P = 0 (library default) or a
 *   multiple of 64; swiglu_limit >= 0 and finite; and the schedule must fit int32:
 *   N * T_max * k + E_l * P < 2^31. */
typedef struct mokConfig {
  size_t size;       /* sizeof(mokConfig_t) of the caller's header */
  uint32_t magic;    /* MOK_CONFIG_MAGIC */
  uint32_t version;  /* MOK_VERSION_CODE of the caller's header */
  int num_experts;   /* E, global routed experts (required) */
  int hidden;        /* H, model width (required) */
  int inter;         /* I, routed expert intermediate width (required) */
  int topk;          /* k, routes per token (required) */
  int shared_inter;  /* I_s, shared expert width; 0 = no shared expert */
  int num_ranks;     /* N, expert-parallel ranks (default 1) */
  int max_tokens;    /* T_max, the most tokens any rank passes in one call (required) */
  mokDtype_t grad_dtype; /* dtype of every weight gradient (default bf16) */
  float swiglu_limit;    /* L: g <- min(g, L), u <- clamp(u, -L, L); 0 = off */
  int row_pad;           /* P, rows each expert segment is padded to; 0 = default (MOK_DEFAULT_ROW_PAD) */
} mokConfig_t;

#define MOK_DEFAULT_ROW_PAD 64

#define MOK_CONFIG_INITIALIZER                                                          \
  { sizeof(mokConfig_t), MOK_CONFIG_MAGIC, MOK_VERSION_CODE, 0, 0, 0, 0, 0, 1, 0, mokDtypeBF16, 0.0f, 0 }

/* [OUT] config: set to MOK_CONFIG_INITIALIZER. */
mokResult_t mokConfigInit(mokConfig_t *config);

/* The MoE layer shapes of DESIGN.md section 6 by name ("deepseek-v3", "glm-5.2", ...).
 * Sets num_experts, hidden, inter, topk and shared_inter of an initialised config and
 * leaves every other field as it was. [IN/OUT] config  [IN] name */
mokResult_t mokConfigSetModel(mokConfig_t *config, const char *name);
/* [OUT] name: the i-th model name for i in [0, count), NULL past the end. [OUT] count (may be NULL). */
mokResult_t mokModelName(int i, const char **name, int *count);

/* ---- layer handle ------------------------------------------------------------- */
typedef struct mokLayer *mokLayer_t;

/* Validates the config and creates a layer handle. Host only; no device work.
 * [OUT] layer  [IN] config (copied; the caller may free it afterwards). */
mokResult_t mokLayerCreate(mokLayer_t *layer, const mokConfig_t *config);
/* Frees the handle. NULL is a no-op. */
mokResult_t mokLayerDestroy(mokLayer_t layer);
/* [OUT] config: the validated config, with defaults filled in (row_pad != 0). */
mokResult_t mokLayerGetConfig(mokLayer_t layer, mokConfig_t *config);
/* The message of the last failing call on this handle; "" if none. */
const char *mokLayerGetLastError(mokLayer_t layer);

/* ---- per-rank tensors (host pointers for the reference entry points) ------------ *
 * The GPU layer takes device pointers, and the token tensors x, out, d_out and d_x
 * 16-byte aligned (any allocation, or a view that starts at a token: H % 64 == 0). */
typedef struct mokRankInput {
  int num_tokens;           /* T_r, 0 <= T_r <= max_tokens */
  const mokBf16 *x;         /* [T_r, H] */
  const int32_t *topk_idx;  /* [T_r, k] global expert id or -1 */
  const float *topk_w;      /* [T_r, k] */
} mokRankInput_t;

/* Layout hint (speed only): on Hopper the forward gate+up GEMM loads W_gate and W_up
 * together, in one TMA copy per pipeline stage, where w_up lies after w_gate at a multiple
 * of 16 bytes (e.g. one allocation [W_gate | W_up]); otherwise in four copies, 2-4% slower
 * under uneven routing (docs/PERF.md). */
typedef struct mokRankWeights {
  const mokBf16 *w_gate;    /* [E_l, I, H] */
  const mokBf16 *w_up;      /* [E_l, I, H] */
  const mokBf16 *w_down;    /* [E_l, H, I] */
  const mokBf16 *s_gate;    /* [I_s, H]; NULL when I_s == 0 */
  const mokBf16 *s_up;      /* [I_s, H] */
  const mokBf16 *s_down;    /* [H, I_s] */
} mokRankWeights_t;

/* Weight gradients are of the config's grad_dtype: mokBf16 or float elements. d_x and d_topk_w
 * are always overwritten; the weight gradients too, or with accumulate = 1 (grad_dtype fp32
 * only, else mokInvalidArgument) added to what the buffers hold: g = g + fp32(gradient), one
 * fp32 add an element (Megatron-LM's main_grad, summed over micro-batches in place). */
typedef struct mokRankGrads {
  mokBf16 *d_x;             /* [T_r, H] */
  float *d_topk_w;          /* [T_r, k] */
  void *d_w_gate;           /* [E_l, I, H] */
  void *d_w_up;             /* [E_l, I, H] */
  void *d_w_down;           /* [E_l, H, I] */
  void *d_s_gate;           /* [I_s, H]; ignored (may be NULL) when I_s == 0 */
  void *d_s_up;             /* [I_s, H] */
  void *d_s_down;           /* [H, I_s] */
  int accumulate;           /* 0: weight gradients overwritten; 1: added (fp32 grad_dtype) */
} mokRankGrads_t;

/* ---- schedule (the row layout every implementation shares) ---------------------- */
/* On the rank that owns them, the routes (s, t, j) of local expert e — source rank s,
 * token t of that rank, slot j with topk_idx[s][t, j] == e — are ordered by s, then t,
 * then j, and fill one segment; each segment is padded with zero rows up to a
 * multiple of P; segments follow in expert order. A route is encoded as the int32
 * route id (s * T_max + t) * k + j; a padding row holds -1. */
typedef struct mokSchedule {
  int64_t capacity;         /* [IN] rows available in row_route (mokLayerScheduleCapacity) */
  int32_t *expert_count;    /* [OUT] [E_l] routes of each local expert, unpadded */
  int32_t *expert_offset;   /* [OUT] [E_l + 1] first row of each segment; [E_l] = rows in use */
  int32_t *src_count;       /* [OUT] [N, E_l] routes from source rank s to local expert e; may be NULL */
  int32_t *row_route;       /* [OUT] [capacity] route id of each row in use, -1 on padding rows */
} mokSchedule_t;

/* [OUT] rows: the most rows any rank's schedule can need: N*T_max*k + E_l*(P-1),
 * rounded up to a multiple of P. */
mokResult_t mokLayerScheduleCapacity(mokLayer_t layer, int64_t *rows);

/* ---- CPU reference (float64 math; bf16 rounding where the GPU stores bf16) ------ */
/* Every reference entry point takes the inputs of all N ranks at once, as arrays of
 * N per-rank structs / pointers (index = rank), and validates every input it reads
 * (sizes, NULL pointers, expert ids in range) before writing anything.
 * Rounding points (DESIGN.md section 2a): a = bf16(silu(g) * u); y_tj = bf16(W_down a);
 * shared output bf16; out = bf16(fp32 sum in the order shared, j = 0..k-1).
 * Backward: dy = bf16(topk_w * d_out); g and u are used as bf16 (saved context; with
 * the clamp on, a value the clamp cut is saved as +-inf so the backward's clamp mask is
 * exactly the forward's: g > L -> +inf, u > L -> +inf, u < -L -> -inf);
 * dg, du = bf16; routed d_x partials bf16; d_x = bf16(shared + sum_j partial_j);
 * d_topk_w from the bf16 y_tj; weight gradients summed in float64, stored once. */

/* Routing exchange + schedule for expert-owning rank `rank`.
 * [IN] inputs[N] (only num_tokens and topk_idx are read)  [IN/OUT] schedule */
mokResult_t mokReferenceSchedule(mokLayer_t layer, int rank, const mokRankInput_t *inputs,
                                 mokSchedule_t *schedule);

/* Optional per-rank intermediates of the forward, in schedule row order (rank r's rows
 * are those of its mokReferenceSchedule), for stage-by-stage comparison with a GPU
 * implementation. Any pointer may be NULL. Rows past the rows in use are not written. */
typedef struct mokRankTrace {
  mokBf16 *gathered_x;      /* [capacity, H] dispatched token rows, zero on padding rows */
  mokBf16 *act;             /* [capacity, I] a = silu(g) * u, zero on padding rows */
  mokBf16 *expert_out;      /* [capacity, H] y rows before the router weight, zero on padding */
  mokBf16 *shared_out;      /* [T_r, H] shared expert output (untouched when I_s == 0) */
} mokRankTrace_t;

/* Forward of the whole layer over N simulated ranks.
 * [IN] inputs[N], weights[N]  [OUT] out[N] ([T_r, H] each)  [OUT] trace[N] or NULL */
mokResult_t mokReferenceForward(mokLayer_t layer, const mokRankInput_t *inputs,
                                const mokRankWeights_t *weights, mokBf16 *const *out,
                                const mokRankTrace_t *trace);

/* Backward (it recomputes the forward it needs).
 * [IN] inputs[N], weights[N], d_out[N] ([T_r, H] each)  [OUT] grads[N] */
mokResult_t mokReferenceBackward(mokLayer_t layer, const mokRankInput_t *inputs,
                                 const mokRankWeights_t *weights, const mokBf16 *const *d_out,
                                 const mokRankGrads_t *grads);

/* Checks weight gradients of large shapes without every weight: selected rows idx[q] of
 * dW_gate and dW_up and columns idx[q] of dW_down of one routed expert (global id), in
 * float64 from that expert's weights alone (w_gate, w_up [I, H], w_down [H, I]) and every
 * rank's inputs and d_out, with the rounding points of mokReferenceBackward.
 * Host memory: about 16 * (sum of T_r) * H bytes plus the expert's weights in float64.
 * [IN] inputs[N], d_out[N], idx[n_idx] (each in [0, I))
 * [OUT] d_w_gate_rows, d_w_up_rows [n_idx, H]; d_w_down_cols [n_idx, H] (row q holds column
 *       idx[q] of dW_down) */
mokResult_t mokReferenceExpertGrads(mokLayer_t layer, const mokRankInput_t *inputs, const mokBf16 *const *d_out,
                                    int expert, const mokBf16 *w_gate, const mokBf16 *w_up,
                                    const mokBf16 *w_down, int n_idx, const int *idx, double *d_w_gate_rows,
                                    double *d_w_up_rows, double *d_w_down_cols);

/* ---- test data (counter-based; identical on CPU and GPU) ----------------------- */
/* Every element is a pure function of (seed, tensor, element index), so any part of
 * any tensor can be generated alone, on the host or on the device. */
typedef enum mokTensorKind {
  mokTensorX = 1,        /* x of a rank: tensor id = (kind, rank) */
  mokTensorDOut = 2,     /* d_out of a rank */
  mokTensorWGate = 3,    /* weights of one GLOBAL expert: tensor id = (kind, expert) */
  mokTensorWUp = 4,
  mokTensorWDown = 5,
  mokTensorSGate = 6,    /* shared weights: tensor id = (kind, 0) */
  mokTensorSUp = 7,
  mokTensorSDown = 8,
  mokTensorRouting = 9   /* routing logits of a rank */
} mokTensorKind_t;

/* Fills dst[i] = bf16(scale * U(-sqrt(3), sqrt(3))) for element indices first .. first+count-1
 * of tensor (kind, sub): unit variance before the scale. Use scale = 1 for x and d_out and
 * 1/sqrt(fan_in) for weights. [OUT] dst[count] */
mokResult_t mokGenerateBf16(uint64_t seed, mokTensorKind_t kind, int64_t sub, int64_t first,
                            int64_t count, float scale, mokBf16 *dst);

typedef enum mokRoutingKind {
  mokRoutingUniform = 0, /* top-k of i.i.d. random logits: k distinct experts, all equally likely */
  mokRoutingZipf = 1,    /* k distinct experts drawn without replacement, P(e) ~ 1/(e+1)^param */
  mokRoutingHot = 2      /* slot 0 of every token is expert (int)param; the rest uniform, distinct */
} mokRoutingKind_t;

typedef struct mokRouting {
  mokRoutingKind_t kind;
  double param;          /* Zipf exponent s (> 0), or the hot expert id */
} mokRouting_t;

/* Routing of tokens first .. first+count-1 of `rank`: k distinct experts per token
 * (k <= E required) and softmax weights over the k chosen logits (they sum to 1).
 * [OUT] topk_idx[count, k], topk_w[count, k] */
mokResult_t mokGenerateRouting(uint64_t seed, const mokRouting_t *routing, int num_experts, int topk,
                               int rank, int64_t first, int64_t count, int32_t *topk_idx,
                               float *topk_w);

/* One rank's whole test problem in host buffers, from the generators above: x and d_out
 * (kinds X and DOut, sub = rank, scale 1), the routing of its tokens, its stacked local
 * expert weights (global expert r*E_l + e; scale 1/sqrt(H) for gate and up, 1/sqrt(I) for
 * down) and the shared weights (scale 1/sqrt(H), 1/sqrt(I_s)). Any output may be NULL to
 * skip it. Shapes as in mokRankInput_t / mokRankWeights_t; 0 <= num_tokens <= max_tokens. */
mokResult_t mokGenerateRankData(mokLayer_t layer, uint64_t seed, const mokRouting_t *routing, int rank,
                                int num_tokens, mokBf16 *x, int32_t *topk_idx, float *topk_w, mokBf16 *d_out,
                                mokBf16 *w_gate, mokBf16 *w_up, mokBf16 *w_down, mokBf16 *s_gate,
                                mokBf16 *s_up, mokBf16 *s_down);

/* ---- communicator (multi-GPU runtime on NCCL) ------------------------------------ */
/* Every rank of an expert-parallel group holds one mokComm_t, built on the caller's
 * NCCL communicator (one GPU per rank; all ranks in one NVLink / NCCL LSA domain).
 * It owns a symmetric workspace (ncclMemAlloc + ncclCommWindowRegister with
 * NCCL_WIN_COLL_SYMMETRIC, reused by every layer and call), the device flags of the
 * cross-rank barrier, and the device error word of kernels run on it.
 * "Collective" below means: every rank of the NCCL communicator must make the same
 * call, in the same order, concurrently (from its own process or thread); a rank that
 * does not come makes the others wait inside NCCL.
 * A comm call makes the comm's device current for its duration and restores the
 * caller's current device before it returns. */
typedef struct mokComm *mokComm_t;

#define MOK_COMM_CONFIG_MAGIC 0x6d6f6b4du /* "mokM" */

/* Rules (checked by mokCommCreate, each failure names the field):
 *   timeout_ms: 0 (default 10000) or 1 .. 3600000: budget of every bounded device wait
 *     (a peer that does not arrive within it makes the kernel record mokTimeout);
 *   workspace_bytes: 0 (default 2 MiB) or up to 2^40: symmetric workspace reserved at
 *     create, rounded up to 2 MiB; mokCommReserveWorkspace grows it later.
 *   Every rank must pass the same values (checked collectively). */
typedef struct mokCommConfig {
  size_t size;            /* sizeof(mokCommConfig_t) of the caller's header */
  uint32_t magic;         /* MOK_COMM_CONFIG_MAGIC */
  uint32_t version;       /* MOK_VERSION_CODE of the caller's header */
  int timeout_ms;         /* bounded-wait budget; 0 = default */
  size_t workspace_bytes; /* initial symmetric workspace; 0 = default */
} mokCommConfig_t;

#define MOK_COMM_CONFIG_INITIALIZER \
  { sizeof(mokCommConfig_t), MOK_COMM_CONFIG_MAGIC, MOK_VERSION_CODE, 0, 0 }

/* [OUT] config: set to MOK_COMM_CONFIG_INITIALIZER. */
mokResult_t mokCommConfigInit(mokCommConfig_t *config);

/* Collective. Builds the communicator of this rank on `nccl` (the caller keeps owning
 * it and must destroy it only after mokCommDestroy). Checks that all ranks passed the
 * same config and that every rank can load/store every other rank's memory (one LSA
 * team); otherwise every rank gets the same error. Synchronises the comm's device.
 * Under CUDA's lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) it
 * loads every mok kernel into the device's context first, so that no first launch inside
 * a pass can wait for a kernel that waits for a peer (mokNotSupported, naming
 * CUDA_MODULE_LOADING=EAGER, where the driver predates CUDA 12.4 and cannot).
 * [OUT] comm  [IN] nccl  [IN] config (NULL = defaults; copied) */
mokResult_t mokCommCreate(mokComm_t *comm, ncclComm_t nccl, const mokCommConfig_t *config);

/* Collective. Frees the workspace, every buffer of mokCommMemAlloc still held and the
 * handle; a communicator from mokLocalCommsCreate also destroys its NCCL communicator.
 * Waits for the comm's device to finish its work first. NULL is a no-op. Also the way
 * out after a device error: destroy, then create a new communicator. */
mokResult_t mokCommDestroy(mokComm_t comm);

/* [OUT] rank, num_ranks, device (CUDA ordinal): any may be NULL. Host only. */
mokResult_t mokCommRankInfo(mokComm_t comm, int *rank, int *num_ranks, int *device);

/* [OUT] nccl: the NCCL communicator the comm was built on (still owned by whoever
 * created it). */
mokResult_t mokCommGetNccl(mokComm_t comm, ncclComm_t *nccl);

/* The message of the last failing call on this comm, or of the last error found by
 * mokCommGetAsyncError; "" if none. */
const char *mokCommGetLastError(mokComm_t comm);

/* Errors kernels found on the device (DESIGN.md 2a): a bounded wait that ran out
 * (mokTimeout, e.g. a peer that never arrived), bad device-resident input
 * (mokDeviceError). The first error any rank records is pushed to every rank, so all
 * report the same origin; mokCommGetLastError then says which rank, what it waited
 * for and where. Sticky: after an error destroy and re-create the communicator.
 * Does not wait for kernels in flight (a kernel that is still waiting will record its
 * timeout within timeout_ms). Host only, thread-safe against kernels.
 * [OUT] status: mokSuccess when no error was recorded. */
mokResult_t mokCommGetAsyncError(mokComm_t comm, mokResult_t *status);

/* Collective. Makes the symmetric workspace at least `bytes` (rounded up to 2 MiB);
 * never shrinks it. Growing it frees the old one: the call waits for the device and
 * device views taken before it are invalid afterwards. Refused (mokInvalidUsage) after
 * a device error. [IN] bytes <= 2^40 */
mokResult_t mokCommReserveWorkspace(mokComm_t comm, size_t bytes);
/* [OUT] bytes: current symmetric workspace size (excluding mok's control block). */
mokResult_t mokCommWorkspaceSize(mokComm_t comm, size_t *bytes);

/* Collective. Allocates `bytes` (same value on every rank; rounded up to 2 MiB) of
 * device memory on the comm's device and registers it as a symmetric window, so
 * layers read inputs placed there straight from peers, with no copy. Contents are
 * undefined. [IN] bytes >= 1  [OUT] ptr: device pointer */
mokResult_t mokCommMemAlloc(mokComm_t comm, size_t bytes, void **ptr);
/* Collective. Frees a buffer of mokCommMemAlloc; waits for the device first. NULL is a
 * no-op. A pointer this comm did not allocate is mokInvalidArgument. */
mokResult_t mokCommMemFree(mokComm_t comm, void *ptr);

/* Collective. All-gathers `bytes` of `blob` from every rank (sizes are compared
 * first, so ranks that pass different sizes do not corrupt each other) and compares
 * them with rank 0's. If any rank differs, every rank returns mokInvalidArgument
 * with the same message naming `what`, the first differing rank and byte offset.
 * Compares bytes: zero any padding of a struct before passing it.
 * [IN] blob[bytes], 1 <= bytes <= 65536  [IN] what: short name for messages (may be NULL) */
mokResult_t mokCommCheckAgreement(mokComm_t comm, const void *blob, size_t bytes, const char *what);

/* One process driving all local GPUs: creates one NCCL communicator per device
 * (ncclGetUniqueId, then ncclCommInitRank on one thread per device) and a mokComm on
 * each; rank i uses devices[i] (devices NULL = 0 .. ngpus-1). The comms own their
 * NCCL communicators. [IN] ngpus >= 1  [IN] config (NULL = defaults)  [OUT] comms[ngpus] */
mokResult_t mokLocalCommsCreate(int ngpus, const int *devices, const mokCommConfig_t *config,
                                mokComm_t *comms);
/* Destroys comms[0..ngpus) (each mokCommDestroy on its own thread) and sets them to
 * NULL. NULL entries are skipped. */
mokResult_t mokLocalCommsDestroy(int ngpus, mokComm_t *comms);

/* One process per GPU (torchrun, MPI) without an NCCL communicator of the caller's own:
 * rank 0 makes an id, sends its bytes to every rank by any means (torch.distributed,
 * MPI, a file), and every rank calls mokCommInitRank with it. */
typedef struct mokUniqueId {
  char internal[128]; /* an ncclUniqueId */
} mokUniqueId_t;

/* Host only. [OUT] id: a fresh id (ncclGetUniqueId). */
mokResult_t mokGetUniqueId(mokUniqueId_t *id);

/* Collective over num_ranks processes or threads, each with the same id. Creates this
 * rank's NCCL communicator on `device` (ncclCommInitRank) and the mok comm on it, which
 * owns it (mokCommDestroy destroys both). The caller's current device is kept.
 * [OUT] comm  [IN] num_ranks 1 .. 72, rank 0 .. num_ranks-1, id, device >= 0,
 * config (NULL = defaults) */
mokResult_t mokCommInitRank(mokComm_t *comm, int num_ranks, const mokUniqueId_t *id, int rank, int device,
                            const mokCommConfig_t *config);

/* Runs fn(comms[r], r, arg) for every rank r on its own thread, with the rank's
 * device current, and waits for all. Returns the first failing status (rank order);
 * its message names the rank. [IN] ngpus, comms[ngpus], fn */
typedef mokResult_t (*mokLocalFn_t)(mokComm_t comm, int rank, void *arg);
mokResult_t mokLocalRun(int ngpus, mokComm_t *comms, mokLocalFn_t fn, void *arg);

/* ---- the layer on GPUs ------------------------------------------------------------ */
/* Which implementation runs a pass. */
typedef enum mokImpl {
  mokImplAuto = 0,     /* the fastest one built for this configuration: today mokImplNccl on
                          Hopper (sm_90), mokImplBaseline elsewhere */
  mokImplBaseline = 1, /* the conventional layer: NCCL all-to-all-v + cuBLAS expert GEMMs +
                          mok's small kernels (permute, SwiGLU, combine). It waits on the host
                          once per forward for the routing counts (every conventional
                          expert-parallel layer does); the backward reuses them. */
  mokImplNccl = 2,     /* the same NCCL exchange with mok's grouped Hopper expert GEMMs (one
                          launch per GEMM kind over every expert, SwiGLU and its backward
                          fused into the epilogues); sm_90 only (mokNotSupported elsewhere) */
  mokImplMega = 3      /* the forward megakernel (first step, docs/MEGAKERNEL.md): the schedule
                          on the device, then dispatch, gate+up (SwiGLU) and down in one
                          persistent launch, then the combine (a launch of its own so far);
                          no host wait in the forward. So far: one GPU
                          (num_ranks 1), sm_90, inter % 128 == 0, hidden % 256 == 0, w_up right
                          after w_gate (else mokNotSupported). The shared expert runs as tiles of
                          the launch where shared_inter == inter and s_up lies right after s_gate
                          (else on cuBLAS before it; the two differ in the last bits). Its
                          backward runs mok's GEMMs on the forward's rows (no copies), the
                          shared expert's too where the forward ran it in the launch; then
                          neither pass waits on the host (both can be captured in one CUDA
                          graph). With the shared expert on cuBLAS the backward waits once for a
                          4-byte flag. Routed results bitwise mokImplNccl's.
                          A bad expert id is found on the device: the forward writes nothing, the
                          communicator's error word records it (mokCommGetAsyncError:
                          mokDeviceError; sticky) and the backward writes nothing either (it
                          returns mokSuccess; with the shared expert on cuBLAS it refuses:
                          mokInvalidArgument). */
} mokImpl_t;

/* Collective over comm's ranks. A layer whose passes run on GPUs: checks that every rank
 * passed the same config (num_ranks must equal the comm's rank count) and allocates its
 * index arrays (on the comm's device; a few MiB). Destroy with mokLayerDestroy (every
 * rank; it waits for the device).
 * Device memory: the row buffers are sized by the rows the passes really have, not the
 * worst case of the config (N * T_max * k rows), and grow when a pass needs more (in stream
 * order on the pass's stream, from the device's default memory pool, a quarter of headroom;
 * never shrinking before destroy):
 *   - the layer's own block: what its backward reads (X, [g|u], a and y of the routed rows,
 *     the shared expert's [g|u] and a), kept from a forward to the next;
 *   - one scratch block of the communicator, shared by all its layers: what a pass uses and
 *     drops (send / receive rows, fp32 partials, [dG|dU]). Passes of layers of one comm are
 *     ordered through it: a pass on another stream than the last one waits for it (an
 *     event), so two layers of one comm never overlap, whatever their streams.
 * Host threads: the block's bookkeeping is not locked, so issue the passes of one comm's
 * layers from one host thread at a time (as an autograd engine does).
 * At EP8 with balanced routing that is about 1/N of the old worst-case workspace
 * (docs/MEGAKERNEL.md, "Device memory per layer"). A block cannot grow while the stream
 * captures a CUDA graph (mokInvalidUsage): run one pass of that size first, or mokLayerReserve.
 * [OUT] layer  [IN] config (copied)  [IN] comm (must outlive the layer) */
mokResult_t mokLayerCreateOnComm(mokLayer_t *layer, const mokConfig_t *config, mokComm_t comm);

/* Collective. Forward of this rank: every pointer is DEVICE memory on the comm's
 * device, tensors as in section "per-rank tensors" (input->num_tokens may differ per
 * rank, 0 <= T_r <= max_tokens). Runs on `stream` (stream-ordered; the baseline also
 * waits on the host for the routing counts). The layer keeps what the backward needs:
 * call mokLayerBackward with the same input and weights before the next forward. Several
 * forwards in flight (pipeline schedules): a layer each, made on one comm (they share its
 * scratch block; each holds its forward's rows), as the Python binding's contexts do.
 * A bad expert id in topk_idx is reported as mokInvalidArgument before anything is
 * written. Streams: a layer's passes use its saved block, so run them in one stream order.
 * mok's launches take their tile counters from per-device rings of slots in launch order,
 * and a CUDA graph replays the slots it captured: do not run a replayed graph at the same
 * time as other mok launches on another stream of the device.
 * [IN] input, weights  [OUT] out [T_r, H] */
mokResult_t mokLayerForward(mokLayer_t layer, mokImpl_t impl, const mokRankInput_t *input,
                            const mokRankWeights_t *weights, mokBf16 *out, cudaStream_t stream);

/* Collective. Backward of the last forward (same input and weights; DEVICE pointers):
 * writes every gradient of grads (weight gradients overwritten, or added where
 * grads->accumulate, in grad_dtype).
 * The backward runs the implementation its forward ran (impl must resolve to the same one,
 * else mokInvalidUsage). mokImplMega's backward consumes its forward's saved rows (dY is
 * written over y): a second backward needs the forward again (else mokInvalidUsage); the
 * other implementations can run the backward of one forward again.
 * [IN] d_out [T_r, H]  [OUT] grads */
mokResult_t mokLayerBackward(mokLayer_t layer, mokImpl_t impl, const mokRankInput_t *input,
                             const mokRankWeights_t *weights, const mokBf16 *d_out,
                             const mokRankGrads_t *grads, cudaStream_t stream);

/* Not collective. Grows the layer's block and its communicator's scratch now, on `stream`,
 * to what a pass of num_tokens tokens needs under the worst routing (every route of every
 * rank on this rank's experts; at N > 1 that is N times the balanced need), for any
 * implementation but mokImplMega at N > 1 without a receive capacity (stage A: its forward
 * reads the rows received on the host and grows the blocks to them; with one,
 * mokLayerSetRecvCapacity, its rows are reserved here; its first pass grows the communicator's
 * workspace, collectively, to its window): later passes of at most num_tokens tokens then
 * allocate nothing (for a CUDA graph capture, or to fail early with mokOutOfMemory). If the
 * layer's block grows,
 * the context of the last forward is dropped (a backward then needs a forward again).
 * [IN] num_tokens 0 .. max_tokens */
mokResult_t mokLayerReserve(mokLayer_t layer, int num_tokens, cudaStream_t stream);

/* Collective (every rank of the layer's communicator, the same value; checked). mokImplMega
 * at N > 1: the most routes this rank receives in one forward, from every rank its own
 * included. 0 (the default): each forward reads the rows it received on the host (one wait;
 * the exchanges of refusals wait too; no CUDA graph). routes > 0: the layer's row buffers
 * hold that many routes (plus each expert's padding) from the next pass on, and neither pass
 * waits on the host: both can be captured in one CUDA graph (run one pass first: it grows
 * the blocks and the communicator's workspace). Then a pass that cannot run everywhere —
 * more routes to a rank than this, a bad expert id, a rank that refuses its call — writes
 * nothing on any rank and records mokDeviceError in the layers of the other ranks
 * (mokLayerGetAsyncError says which rank and why); the refusing rank's call returns its own
 * error, the others return mokSuccess; the communicator stays usable and later passes run.
 * A capacity of N * max_tokens * topk never overflows; at N = 1 it has no effect. A refusal
 * while the stream captures a graph is captured, not run: capture only passes that run
 * everywhere. Where the shared expert runs on
 * cuBLAS (s_up not right after s_gate), the backward still reads the forward's flag on the
 * host, as on one GPU (so it cannot be captured), and the shared expert's gradients, this
 * rank's own, are written even when a peer refused its backward (a rank of 0 tokens zeroes
 * its shared-expert gradients whatever the layout). Every rank passes the same
 * impl. Drops the last forward's context. [IN] routes 0 .. num_ranks * max_tokens * topk */
mokResult_t mokLayerSetRecvCapacity(mokLayer_t layer, int64_t routes);
/* [OUT] status: mokSuccess, or mokDeviceError where a pass of this layer was refused on the
 * device since the last call, with no host to see it (mokLayerSetRecvCapacity); then
 * mokLayerGetLastError names the first refusal (which rank, a bad id's route, an overflow's
 * rows). Reading clears it. Sees the passes that finished: synchronize their streams first;
 * a host wait of its own (call it between steps, not inside a CUDA graph capture). */
mokResult_t mokLayerGetAsyncError(mokLayer_t layer, mokResult_t *status);

/* mokLayerTrim's blocks (or'ed). */
#define MOK_TRIM_SAVED 1u   /* the layer's saved block: the rows its backward reads */
#define MOK_TRIM_SCRATCH 2u /* its communicator's scratch block, shared by the comm's layers */
/* Not collective. Frees the blocks `what` names (MOK_TRIM_*) in stream order on `stream`,
 * after their last passes, for the memory to serve other work between passes (e.g. an
 * optimizer step): with the device pool's default release threshold it returns to the
 * driver at the stream's next synchronisation. MOK_TRIM_SAVED drops the last forward's
 * context (its backward then needs the forward again: mokInvalidUsage); the scratch holds
 * nothing between passes. The next pass allocates the blocks again. A block a captured CUDA
 * graph uses is kept (freed with its owner). Refused while `stream` captures a graph
 * (mokInvalidUsage); other bits in `what` are mokInvalidArgument. */
mokResult_t mokLayerTrim(mokLayer_t layer, unsigned what, cudaStream_t stream);

/* Device memory held now. [OUT] layer_bytes: the layer's own (its block, blocks kept for
 * captured CUDA graphs included, and its index arrays); [OUT] comm_scratch_bytes: the
 * scratch block its communicator's layers share. Either may be NULL. */
mokResult_t mokLayerMemoryInfo(mokLayer_t layer, size_t *layer_bytes, size_t *comm_scratch_bytes);

/* Host only (no GPU, no layer): the device memory a layer of `config` holds after passes of
 * num_tokens tokens a rank, for impl (mokImplAuto = mokImplNccl; mokImplMega: on one GPU its
 * rows bound; at N > 1 the rows received, and in comm_scratch_bytes the symmetric workspace
 * its passes reach the peers through, sized by max_tokens), with each rank's routes spread
 * evenly over the experts (worst = 0: what
 * balanced routing gives, within a quarter of growth headroom) or the worst routing
 * (worst = 1: what mokLayerReserve allocates).
 * [OUT] layer_bytes: the layer's own (saved block and index arrays); [OUT]
 * comm_scratch_bytes: its pass's scratch (the comm's block holds the largest layer's). */
mokResult_t mokLayerMemoryEstimate(const mokConfig_t *config, mokImpl_t impl, int num_tokens, int worst,
                                   size_t *layer_bytes, size_t *comm_scratch_bytes);

/* Device twin of mokGenerateBf16 (bit-identical values) on the current device.
 * [OUT] dst: device memory [count]  [IN] stream */
mokResult_t mokGenerateBf16Device(uint64_t seed, mokTensorKind_t kind, int64_t sub, int64_t first,
                                  int64_t count, float scale, mokBf16 *dst, cudaStream_t stream);

/* ---- bf16 helpers ------------------------------------------------------------- */
/* Round to nearest even; NaN stays NaN. */
mokBf16 mokFloatToBf16(float f);
float mokBf16ToFloat(mokBf16 b);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOK_H */
