/*
 * param-dump.c — diagnostics: a CUPTI injection library (CUDA_INJECTION64_PATH) that prints,
 * for the first launch of a kernel whose name contains $PARAM_DUMP_MATCH (default "nvjet"),
 * the kernel's name, grid, block, cluster and every parameter byte (offset from the
 * parameter space's start, i.e. c[0x0][0x210 + offset] in sm_90 SASS; cuBLAS passes one
 * buffer through `extra`); PARAM_DUMP_VERBOSE=1 also names every launch it sees. Used to read
 * cuBLAS's tile tables (docs/PERF.md, session 14). Build on the device:
 *   gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o /tmp/param-dump.so scripts/param-dump.c \
 *       -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib -lcupti -lcuda
 * Run: CUDA_INJECTION64_PATH=/tmp/param-dump.so build/mok bench gemm ... --iters 1
 */
#include <cuda.h>
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_left = 1;

static void dump_bytes(const unsigned char *b, size_t off, size_t sz) {
  for (size_t j = 0; j < sz; j += 16) {
    fprintf(stderr, "PARAMS %04zx:", off + j);
    for (size_t k = j; k < j + 16 && k < sz; ++k) fprintf(stderr, " %02x", b[k]);
    fprintf(stderr, "\n");
  }
}

static void dump(CUfunction f, void **kp, void **extra, const CUlaunchConfig *cfg) {
  const char *name = NULL, *match = getenv("PARAM_DUMP_MATCH");
  CUresult r = cuFuncGetName(&name, f);
  int is_kernel = 0;
  if (r != CUDA_SUCCESS) { /* a library kernel (CUkernel) launched through the runtime */
    r = cuKernelGetName(&name, (CUkernel)f);
    is_kernel = r == CUDA_SUCCESS;
  }
  if (getenv("PARAM_DUMP_VERBOSE")) fprintf(stderr, "LAUNCH %d %s\n", (int)r, name ? name : "?");
  if (r != CUDA_SUCCESS || !name || !strstr(name, match ? match : "nvjet") || g_left <= 0) return;
  --g_left;
  fprintf(stderr, "PARAMS kernel %s\n", name);
  if (cfg) {
    fprintf(stderr, "PARAMS grid %u %u %u block %u %u %u smem %u\n", cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ,
            cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ, cfg->sharedMemBytes);
    for (unsigned i = 0; i < cfg->numAttrs; ++i)
      if (cfg->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        fprintf(stderr, "PARAMS cluster %u %u %u\n", cfg->attrs[i].value.clusterDim.x, cfg->attrs[i].value.clusterDim.y,
                cfg->attrs[i].value.clusterDim.z);
  }
  if (!kp) { /* one buffer: {CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, END} */
    const unsigned char *buf = NULL;
    size_t size = 0;
    for (int i = 0; extra && extra[i] != CU_LAUNCH_PARAM_END && i < 16; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = (const unsigned char *)extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *(const size_t *)extra[i + 1];
    }
    fprintf(stderr, "PARAMS buffer of %zu bytes\n", size);
    if (buf) dump_bytes(buf, 0, size);
    return;
  }
  size_t off = 0, sz = 0;
  for (size_t i = 0; (is_kernel ? cuKernelGetParamInfo((CUkernel)f, i, &off, &sz) : cuFuncGetParamInfo(f, i, &off, &sz)) ==
                     CUDA_SUCCESS; ++i) {
    dump_bytes((const unsigned char *)kp[i], off, sz);
  }
}

static void CUPTIAPI callback(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void *data) {
  const CUpti_CallbackData *d = (const CUpti_CallbackData *)data;
  if (dom != CUPTI_CB_DOMAIN_DRIVER_API || d->callbackSite != CUPTI_API_ENTER) return;
  if (id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx || id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz) {
    const cuLaunchKernelEx_params *p = (const cuLaunchKernelEx_params *)d->functionParams;
    dump(p->f, p->kernelParams, p->extra, p->config);
  } else if (id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel || id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz) {
    const cuLaunchKernel_params *p = (const cuLaunchKernel_params *)d->functionParams;
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = p->gridDimX, c.gridDimY = p->gridDimY, c.gridDimZ = p->gridDimZ;
    c.blockDimX = p->blockDimX, c.blockDimY = p->blockDimY, c.blockDimZ = p->blockDimZ;
    c.sharedMemBytes = p->sharedMemBytes;
    dump(p->f, p->kernelParams, p->extra, &c);
  }
}

int InitializeInjection(void) {
  CUpti_SubscriberHandle sub;
  const CUptiResult r = cuptiSubscribe(&sub, (CUpti_CallbackFunc)callback, NULL);
  if (r != CUPTI_SUCCESS) {
    fprintf(stderr, "param-dump: cuptiSubscribe failed (%d)\n", (int)r);
    return 0;
  }
  cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API);
  return 1;
}
