/*
 * kernels_load.cu — every mok kernel loaded at once under CUDA's lazy loading (why and
 * how: kernels_load.h).
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdlib.h>

#include "internal.h"
#include "kernels_load.h"

typedef CUresult (*get_mode_t)(CUmoduleLoadingMode *);
typedef CUresult (*get_module_t)(CUmodule *, CUfunction);
typedef CUresult (*fn_count_t)(unsigned *, CUmodule);
typedef CUresult (*enum_fn_t)(CUfunction *, unsigned, CUmodule);
typedef CUresult (*is_loaded_t)(CUfunctionLoadingState *, CUfunction);
typedef CUresult (*load_fn_t)(CUfunction);

typedef struct {
  get_module_t get_module;
  fn_count_t count;
  enum_fn_t enumerate;
  is_loaded_t is_loaded;
  load_fn_t load;
} driver_calls;

static void *driver_entry(const char *name, int version) {
  void *p = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, (unsigned)version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

/* 1 lazy, 0 eager (or a driver without the query: it predates lazy loading). */
static int loads_lazily(void) {
  get_mode_t get_mode = (get_mode_t)driver_entry("cuModuleGetLoadingMode", 11070);
  CUmoduleLoadingMode mode = CU_MODULE_EAGER_LOADING;
  return get_mode && get_mode(&mode) == CUDA_SUCCESS && mode == CU_MODULE_LAZY_LOADING;
}

/* One module's functions: counted, and with load loaded. */
static mokResult_t load_module(const char *fn, const driver_calls *d, const mokKernelAnchor *a, int load,
                               mokKernelsLoadInfo *info) {
  cudaFunction_t f = NULL;
  if (cudaGetFuncBySymbol(&f, a->kernel) != cudaSuccess || !f) {
    const cudaError_t e = cudaGetLastError();
    return mok_error(NULL, mokCudaError, "%s: finding the kernels of %s failed: %s", fn, a->file, cudaGetErrorString(e));
  }
  CUmodule m = NULL;
  unsigned n = 0;
  CUresult r = d->get_module(&m, (CUfunction)f);
  if (r == CUDA_SUCCESS) r = d->count(&n, m);
  if (r != CUDA_SUCCESS)
    return mok_error(NULL, mokCudaError, "%s: the module of %s: driver error %d", fn, a->file, (int)r);
  CUfunction *all = (CUfunction *)malloc((n ? n : 1) * sizeof *all);
  if (!all) return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  r = d->enumerate(all, n, m);
  for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++) {
    CUfunctionLoadingState s = CU_FUNCTION_LOADING_STATE_LOADED;
    if ((r = d->is_loaded(&s, all[i])) != CUDA_SUCCESS) break;
    info->unloaded += s != CU_FUNCTION_LOADING_STATE_LOADED;
    if (load && s != CU_FUNCTION_LOADING_STATE_LOADED) r = d->load(all[i]);
  }
  free(all);
  if (r != CUDA_SUCCESS)
    return mok_error(NULL, mokCudaError, "%s: loading the kernels of %s: driver error %d", fn, a->file, (int)r);
  info->modules++;
  info->functions += (int)n;
  for (int g = 0; load && g < 4 && a->globals[g]; g++) {
    void *p = NULL;
    if (cudaGetSymbolAddress(&p, a->globals[g]) != cudaSuccess) {
      const cudaError_t e = cudaGetLastError();
      return mok_error(NULL, mokCudaError, "%s: loading the device variables of %s failed: %s", fn, a->file,
                       cudaGetErrorString(e));
    }
  }
  return mokSuccess;
}

extern "C" mokResult_t mok_kernels_load(const char *fn, int device, int load, mokKernelsLoadInfo *info) {
  mokKernelsLoadInfo mine = {0, 0, 0, 0};
  if (!info) info = &mine;
  *info = mine;
  if (!(info->lazy = loads_lazily())) return mokSuccess;
  driver_calls d;
  d.get_module = (get_module_t)driver_entry("cuFuncGetModule", 11000);
  d.count = (fn_count_t)driver_entry("cuModuleGetFunctionCount", 12040);
  d.enumerate = (enum_fn_t)driver_entry("cuModuleEnumerateFunctions", 12040);
  d.is_loaded = (is_loaded_t)driver_entry("cuFuncIsLoaded", 12040);
  d.load = (load_fn_t)driver_entry("cuFuncLoad", 12040);
  if (!d.get_module || !d.count || !d.enumerate || !d.is_loaded || !d.load)
    return mok_error(NULL, mokNotSupported, "%s: CUDA's lazy loading is on and this driver cannot load mok's kernels "
                     "ahead (cuModuleEnumerateFunctions / cuFuncLoad need a CUDA 12.4 driver); a kernel loaded while "
                     "another waits for it can deadlock: set CUDA_MODULE_LOADING=EAGER before the process's first CUDA call",
                     fn);
  const mokKernelAnchor anchors[] = {mok_anchor_baseline(),   mok_anchor_comm(),         mok_anchor_ep_dev(),
                                     mok_anchor_gemm(),       mok_anchor_gemm_ffn(),     mok_anchor_layer_mega(),
                                     mok_anchor_schedule_dev(), mok_anchor_testdata()};
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  cudaError_t e = prev == device ? cudaSuccess : cudaSetDevice(device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return mok_error(NULL, mokCudaError, "%s: cudaSetDevice(%d) failed: %s", fn, device, cudaGetErrorString(e));
  }
  mokResult_t st = mokSuccess;
  for (size_t i = 0; i < sizeof anchors / sizeof anchors[0] && st == mokSuccess; i++)
    st = load_module(fn, &d, &anchors[i], load, info);
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
  return st;
}
