/*
 * kernels_load.h — every mok kernel and module variable loaded into a device's context at
 * once, so that CUDA's lazy loading (the default since CUDA 12.2) never loads one while a
 * kernel that waits for another is running.
 *
 * Why: under lazy loading the first launch of a kernel (or first use of a module's
 * __device__ variables) loads it, and a load may wait for the kernels running in the
 * context. A kernel that waits for another kernel — loopback ranks sharing a GPU, a rank's
 * megakernel beside a peer-waiting NCCL kernel — then waits for a launch that waits for it:
 * a deadlock that only the wait's timeout ends (measured on an H100 in session 33: the
 * megakernel layer tests timed out under CUDA_MODULE_LOADING=LAZY and passed under EAGER).
 *
 * How: each source file with kernels names one of them and its __device__ variables
 * (mokKernelAnchor); a kernel gives its module (cudaGetFuncBySymbol, cuFuncGetModule), the
 * module its functions (cuModuleEnumerateFunctions, CUDA 12.4 drivers), and cuFuncLoad loads
 * each; cudaGetSymbolAddress loads the variables. Under eager loading nothing is done.
 */
#ifndef MOK_KERNELS_LOAD_H
#define MOK_KERNELS_LOAD_H

#include "mok.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One source file's kernels: any one of them (its module holds them all, template
 * instances included) and its __device__ variables (NULL-terminated). */
typedef struct {
  const char *file;
  const void *kernel;
  const void *globals[4];
} mokKernelAnchor;

/* One per source file with kernels (each defined there). */
mokKernelAnchor mok_anchor_baseline(void);
mokKernelAnchor mok_anchor_comm(void);
mokKernelAnchor mok_anchor_ep_dev(void);
mokKernelAnchor mok_anchor_gemm(void);
mokKernelAnchor mok_anchor_gemm_ffn(void);
mokKernelAnchor mok_anchor_layer_mega(void);
mokKernelAnchor mok_anchor_schedule_dev(void);
mokKernelAnchor mok_anchor_testdata(void);

/* What mok_kernels_load did (or, with load = 0, what it found). */
typedef struct {
  int lazy;      /* the process loads lazily (CUDA_MODULE_LOADING=LAZY or the default) */
  int modules;   /* source files' modules visited */
  int functions; /* their functions */
  int unloaded;  /* of those, not loaded when looked at (before loading) */
} mokKernelsLoadInfo;

/* Loads every mok kernel and __device__ variable into `device`'s primary context (the
 * caller's current device is kept). Under eager loading returns at once (info->lazy = 0).
 * load = 0 only counts (tests). mokNotSupported where lazy loading is on and the driver
 * lacks the calls (before CUDA 12.4), naming CUDA_MODULE_LOADING=EAGER as the fix;
 * mokCudaError if a load fails. `fn` names the caller in messages. info may be NULL. */
mokResult_t mok_kernels_load(const char *fn, int device, int load, mokKernelsLoadInfo *info);

#ifdef __cplusplus
}
#endif

#endif /* MOK_KERNELS_LOAD_H */
