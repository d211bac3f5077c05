/*
 * internal.h — what every mok source file shares: the layer struct, error reporting
 * (set a message, return a status), and small helpers. Not installed.
 *
 * Error style: a failing function calls mok_error(layer_or_NULL, status, fmt, ...)
 * which records the message in the calling thread's slot (and the handle's) and
 * returns the status, so checks read `if (bad) return mok_error(...)`.
 * MOK_CHECK(call) propagates a status; CUDA_CHECK / NCCL_CHECK turn a failing CUDA or
 * NCCL call into mokCudaError / mokNcclError with file:line and the call's text.
 */
#ifndef MOK_INTERNAL_H
#define MOK_INTERNAL_H

#include "mok.h"

#include <stdarg.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOK_ERRMSG_LEN 512

struct mok_gpu_layer;       /* device resources of a layer on a communicator (layer.cu) */

struct mokLayer {
  mokConfig_t cfg;           /* validated, defaults filled in */
  int local_experts;         /* E_l = E / N */
  int64_t sched_capacity;    /* rows of the largest schedule */
  mokComm_t comm;            /* NULL for a host-only layer (mokLayerCreate) */
  struct mok_gpu_layer *gpu; /* NULL for a host-only layer */
  char last_error[MOK_ERRMSG_LEN];
};

/* Fills the host-side fields of a layer from a validated config (api.c). */
void mok_layer_init_host(struct mokLayer *l, const mokConfig_t *validated);
/* Frees the device resources of a layer (layer.cu); NULL-safe. */
void mok_gpu_layer_free(struct mokLayer *l);

/* Records the message (thread slot, and the layer's when non-NULL); returns status. */
mokResult_t mok_error(struct mokLayer *layer, mokResult_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clears the calling thread's message; every public entry point calls it first. */
void mok_clear_error(void);

/* Validates a user config; on success fills *out with defaults applied. */
mokResult_t mok_config_validate(const mokConfig_t *in, mokConfig_t *out);
/* grads->accumulate of rank s (fn: the caller's name): 0, or 1 with fp32 grad_dtype. */
mokResult_t mok_check_accumulate(struct mokLayer *layer, const char *fn, int s, int accumulate);

#define MOK_CHECK(call)                                                          \
  do {                                                                           \
    mokResult_t st_ = (call);                                                    \
    if (st_ != mokSuccess) return st_;                                           \
  } while (0)

#define CUDA_CHECK(layer, call)                                                  \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess)                                                       \
      return mok_error((layer), mokCudaError, "%s:%d: %s failed: %s", __FILE__,  \
                       __LINE__, #call, cudaGetErrorString(e_));                 \
  } while (0)

#define NCCL_CHECK(layer, call)                                                  \
  do {                                                                           \
    ncclResult_t r_ = (call);                                                    \
    if (r_ != ncclSuccess)                                                       \
      return mok_error((layer), mokNcclError, "%s:%d: %s failed: %s", __FILE__,  \
                       __LINE__, #call, ncclGetErrorString(r_));                 \
  } while (0)

static inline int64_t mok_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

#ifdef __cplusplus
}
#endif
#endif /* MOK_INTERNAL_H */
