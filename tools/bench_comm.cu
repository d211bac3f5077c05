/*
 * bench_comm.cu — `mok bench comm`: NVLink push and pull bandwidth over symmetric
 * memory, all local GPUs at once (one thread per GPU, mokLocalCommsCreate/mokLocalRun).
 *
 * Each rank r owns two symmetric buffers A and B of `bytes` (mokCommMemAlloc) and
 * talks to peer q = (r + 1) % N:
 *   push: r copies its A into q's B   (loads local, 16-byte stores over NVLink)
 *   pull: r copies q's A into its B   (16-byte loads over NVLink, stores local)
 * so with N = 2 both directions of the link carry traffic at once. A holds a hash
 * pattern of (rank, word); after the timed copies (and a device barrier) every B is
 * checked word by word against its source rank's pattern; any wrong word -> exit 1.
 *
 * Timing: per rank, CUDA events around each of `iters` back-to-back copy kernels
 * (after `warmup` untimed ones; a device barrier first lines the ranks up); time =
 * the median per-copy time of the slowest rank.
 *   GB/s per direction = bytes / time / 1e9   (each rank moves `bytes` in its direction)
 * The copy kernel: `sms` CTAs of `threads` threads; each CTA moves contiguous chunks
 * of threads*unroll*16 bytes, each thread keeping `unroll` 16-byte loads in flight.
 */
#include "cli.h"
#include "comm.h"
#include "comm_device.cuh"
#include "internal.h"
#include "mok.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BC_MAX_LIST 16
#define BC_MAX_GPUS 72

// ---- kernels -------------------------------------------------------------------------
__device__ __forceinline__ uint32_t bc_pattern(uint32_t rank, uint64_t i) {
  uint32_t h = (uint32_t)i * 0x9e3779b1u ^ (uint32_t)(i >> 32) * 0x85ebca77u ^ (rank + 1u) * 0xc2b2ae3du;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return h;
}

__global__ void k_fill(uint32_t *a, size_t words, uint32_t rank) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
    a[i] = bc_pattern(rank, i);
}

__global__ void k_verify(const uint32_t *b, size_t words, uint32_t src_rank, unsigned long long *bad) {
  unsigned long long n = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
    n += b[i] != bc_pattern(src_rank, i);
  if (n) atomicAdd(bad, n);
}

// 16-byte load that bypasses L1 (data read once).
__device__ __forceinline__ int4 ld_nc_na_v4(const int4 *p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void st_na_v4(int4 *p, int4 v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// n16 = number of 16-byte elements. Each CTA takes chunks of blockDim*U elements;
// thread t moves elements t, t+blockDim, ... so every warp access is 512 contiguous bytes.
template <int U>
__global__ void __launch_bounds__(1024) k_copy(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n16) {
  const size_t chunk = (size_t)blockDim.x * U;
  for (size_t base = (size_t)blockIdx.x * chunk; base < n16; base += (size_t)gridDim.x * chunk) {
    if (base + chunk <= n16) {
      int4 v[U];
#pragma unroll
      for (int k = 0; k < U; k++) v[k] = ld_nc_na_v4(src + base + (size_t)k * blockDim.x + threadIdx.x);
#pragma unroll
      for (int k = 0; k < U; k++) st_na_v4(dst + base + (size_t)k * blockDim.x + threadIdx.x, v[k]);
    } else {
      for (size_t i = base + threadIdx.x; i < n16; i += blockDim.x) dst[i] = src[i];
    }
  }
}

static cudaError_t launch_copy(int unroll, int sms, int threads, const void *src, void *dst, size_t bytes,
                               cudaStream_t s) {
  const size_t n16 = bytes / 16;
  switch (unroll) {
    case 1: k_copy<1><<<sms, threads, 0, s>>>((const int4 *)src, (int4 *)dst, n16); break;
    case 2: k_copy<2><<<sms, threads, 0, s>>>((const int4 *)src, (int4 *)dst, n16); break;
    case 4: k_copy<4><<<sms, threads, 0, s>>>((const int4 *)src, (int4 *)dst, n16); break;
    case 8: k_copy<8><<<sms, threads, 0, s>>>((const int4 *)src, (int4 *)dst, n16); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// ---- TMA bulk engine ------------------------------------------------------------------
// One thread per CTA drives a ring of `stages` shared-memory buffers of `chunk` bytes:
// bulk load (global -> shared, completion on an mbarrier), then bulk store (shared ->
// global). A stage is refilled once the store that read it has finished reading shared
// memory (cp.async.bulk.wait_group.read 1: only the newest store may still be reading).
// Chunks go round-robin over CTAs. Few SMs, many bytes in flight: stages-1 loads.
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *b) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void bulk_load(void *dst_smem, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst_smem)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// Bounded: false after ~2 s (a bulk copy that never lands); the caller stops.
__device__ __forceinline__ bool mbar_wait(uint64_t *b, uint32_t parity) {
  const unsigned long long deadline = globaltimer_ns() + 2000000000ull;
  for (;;) {
    uint32_t done;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
    if (done) return true;
    if (globaltimer_ns() > deadline) return false;
  }
}
__device__ __forceinline__ void bulk_store(void *dst, const void *src_smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src_smem)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

#define BC_MAX_STAGES 8
__global__ void __launch_bounds__(32) k_bulk_copy(const char *src, char *dst, size_t bytes, uint32_t chunk, int stages) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) uint64_t full[BC_MAX_STAGES];
  if (threadIdx.x != 0) return;
  const size_t nchunks_all = (bytes + chunk - 1) / chunk;
  if (blockIdx.x >= nchunks_all) return;
  const int n = (int)((nchunks_all - blockIdx.x + gridDim.x - 1) / gridDim.x);  // chunks of this CTA
  for (int s = 0; s < stages; s++) mbar_init(&full[s]);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  auto off = [&](int k) { return ((size_t)blockIdx.x + (size_t)k * gridDim.x) * chunk; };
  auto len = [&](int k) { size_t o = off(k); return (uint32_t)(bytes - o < chunk ? bytes - o : chunk); };
  for (int k = 0; k < stages && k < n; k++) bulk_load(ring + (size_t)k * chunk, src + off(k), len(k), &full[k]);
  for (int k = 0; k < n; k++) {
    const int s = k % stages;
    if (!mbar_wait(&full[s], (uint32_t)(k / stages) & 1u)) break;
    bulk_store(dst + off(k), ring + (size_t)s * chunk, len(k));
    const int j = k - 1 + stages;  // refill the stage chunk k-1 used
    if (k >= 1 && j < n) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      const int sp = (k - 1) % stages;
      bulk_load(ring + (size_t)sp * chunk, src + off(j), len(j), &full[sp]);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

static cudaError_t launch_bulk(int sms, uint32_t chunk, const void *src, void *dst, size_t bytes, cudaStream_t s) {
  int stages = (int)((200u << 10) / chunk);
  if (stages > BC_MAX_STAGES) stages = BC_MAX_STAGES;
  if (stages < 2) stages = 2;
  const size_t smem = (size_t)stages * chunk;
  cudaError_t e = cudaFuncSetAttribute(k_bulk_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  k_bulk_copy<<<sms, 32, smem, s>>>((const char *)src, (char *)dst, bytes, chunk, stages);
  return cudaGetLastError();
}

// ---- options -------------------------------------------------------------------------
typedef struct {
  int gpus;
  int sms[BC_MAX_LIST], nsms;
  int unroll[BC_MAX_LIST], nunroll;
  size_t bytes;
  int push, pull;
  int iters, warmup, threads;
  int ldst, bulk;       // engines to run
  uint32_t chunk;       // bulk engine: bytes per bulk copy
  const char *json;
} bc_opts;

typedef struct {
  int mode;  // 0 push, 1 pull
  int bulk;  // engine: 0 = 16-byte loads/stores, 1 = TMA bulk copies
  int sms, unroll;
  float median_ms[BC_MAX_GPUS], min_ms[BC_MAX_GPUS];
  unsigned long long bad[BC_MAX_GPUS];
} bc_row;

typedef struct {
  const bc_opts *o;
  bc_row *rows;
  int nrows;
} bc_ctx;

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

#define BC_CUDA(call)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      st = mok_error(NULL, mokCudaError, "%s:%d: %s: %s", __FILE__, __LINE__, #call,           \
                     cudaGetErrorString(e_));                                                  \
      goto out;                                                                                \
    }                                                                                          \
  } while (0)
#define BC_MOK(call)                 \
  do {                               \
    st = (call);                     \
    if (st != mokSuccess) goto out;  \
  } while (0)

static mokResult_t bc_rank(mokComm_t comm, int rank, void *argp) {
  bc_ctx *ctx = (bc_ctx *)argp;
  const bc_opts *o = ctx->o;
  mokResult_t st = mokSuccess;
  int n = 0;
  void *A = NULL, *B = NULL;
  void *pa[MOK_COMM_MAX_RANKS], *pb[MOK_COMM_MAX_RANKS];
  cudaStream_t s = NULL;
  cudaEvent_t *ev = (cudaEvent_t *)calloc((size_t)o->iters + 1, sizeof *ev);
  float *t = (float *)calloc((size_t)o->iters, sizeof *t);
  unsigned long long *d_bad = NULL;
  int nev = 0;
  if (!ev || !t) {
    st = mok_error(NULL, mokOutOfMemory, "out of host memory");
    goto out;
  }
  BC_MOK(mokCommRankInfo(comm, NULL, &n, NULL));
  BC_MOK(mokCommMemAlloc(comm, o->bytes, &A));
  BC_MOK(mokCommMemAlloc(comm, o->bytes, &B));
  mok_comm_find_symmetric(comm, A, o->bytes, pa);
  mok_comm_find_symmetric(comm, B, o->bytes, pb);
  BC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (; nev <= o->iters; nev++) BC_CUDA(cudaEventCreate(&ev[nev]));
  BC_CUDA(cudaMalloc(&d_bad, sizeof *d_bad));
  k_fill<<<1024, 256, 0, s>>>((uint32_t *)A, o->bytes / 4, (uint32_t)rank);
  BC_CUDA(cudaGetLastError());
  {
    const int q = (rank + 1) % n;          // the peer this rank talks to
    const int from_push = (rank + n - 1) % n;  // who pushes into our B
    for (int r = 0; r < ctx->nrows; r++) {
      bc_row *row = &ctx->rows[r];
      const void *src = row->mode == 0 ? A : pa[q];
      void *dst = row->mode == 0 ? pb[q] : B;
      BC_CUDA(cudaMemsetAsync(B, 0xff, o->bytes, s));
      BC_MOK(mok_comm_launch_barriers(comm, 1, 128, 1, 0, 0, s));  // B poisoned everywhere
#define BC_LAUNCH()                                                                       \
  (row->bulk ? launch_bulk(row->sms, o->chunk, src, dst, o->bytes, s)                      \
             : launch_copy(row->unroll, row->sms, o->threads, src, dst, o->bytes, s))
      for (int i = 0; i < o->warmup; i++) BC_CUDA(BC_LAUNCH());
      BC_MOK(mok_comm_launch_barriers(comm, 1, 128, 1, 0, 0, s));  // start together
      BC_CUDA(cudaEventRecord(ev[0], s));
      for (int i = 0; i < o->iters; i++) {
        BC_CUDA(BC_LAUNCH());
        BC_CUDA(cudaEventRecord(ev[i + 1], s));
      }
      BC_MOK(mok_comm_launch_barriers(comm, 1, 128, 1, 0, 0, s));  // every copy into our B landed
      BC_CUDA(cudaMemsetAsync(d_bad, 0, sizeof *d_bad, s));
      k_verify<<<1024, 256, 0, s>>>((const uint32_t *)B, o->bytes / 4,
                                    (uint32_t)(row->mode == 0 ? from_push : q), d_bad);
      BC_CUDA(cudaGetLastError());
      BC_CUDA(cudaMemcpyAsync(&row->bad[rank], d_bad, sizeof *d_bad, cudaMemcpyDeviceToHost, s));
      BC_CUDA(cudaStreamSynchronize(s));
      for (int i = 0; i < o->iters; i++) BC_CUDA(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
      qsort(t, (size_t)o->iters, sizeof *t, cmp_float);
      row->median_ms[rank] = t[o->iters / 2];
      row->min_ms[rank] = t[0];
      // the next row poisons B: no rank may still be reading its peer's A / B
      BC_MOK(mok_comm_launch_barriers(comm, 1, 128, 1, 0, 0, s));
    }
    BC_CUDA(cudaStreamSynchronize(s));
    mokResult_t as;
    BC_MOK(mokCommGetAsyncError(comm, &as));
    if (as != mokSuccess) {
      st = mok_error(NULL, as, "%s", mokCommGetLastError(comm));
      goto out;
    }
  }
out:
  if (s) cudaStreamSynchronize(s);
  for (int i = 0; i < nev; i++) cudaEventDestroy(ev[i]);
  if (s) cudaStreamDestroy(s);
  if (d_bad) cudaFree(d_bad);
  {
    // keep the first error's message across the (collective) frees
    char msg[MOK_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s", mokGetLastError());
    if (B) mokCommMemFree(comm, B);
    if (A) mokCommMemFree(comm, A);
    if (st != mokSuccess) mok_error(NULL, st, "%s", msg);
  }
  free(ev);
  free(t);
  return st;
}

// ---- CLI -----------------------------------------------------------------------------
static void bc_usage(FILE *f) {
  fprintf(f,
          "usage: mok bench comm [--gpus N] [--sms LIST] [--bytes B] [--mode push|pull|both]\n"
          "                      [--iters N] [--warmup N] [--threads T] [--unroll LIST]\n"
          "                      [--engine ldst|bulk|both] [--chunk B] [--json FILE]\n"
          "  NVLink push/pull bandwidth over symmetric memory, all GPUs at once; rank r talks to\n"
          "  rank (r+1)%%N. LIST = comma-separated values ('all' = every SM).\n"
          "  defaults: --gpus all --sms 8,16,24,32 --bytes 1G --mode both --iters 20 --warmup 3\n"
          "            --threads 1024 --unroll 4 --engine ldst --chunk 32K.  B takes K, M, G\n"
          "            suffixes (powers of 1024).\n"
          "  engines: ldst = T threads/CTA, each with `unroll` 16-byte loads in flight, then stores;\n"
          "           bulk = one thread/CTA driving TMA bulk copies (global -> shared -> global) of\n"
          "           `chunk` bytes through a ring of floor(200K/chunk) (2..8) shared-memory stages.\n"
          "  GB/s per direction = bytes / (median per-copy time of the slowest rank) / 1e9.\n");
}

static int parse_size(const char *s, size_t *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || v <= 0) return 0;
  double m = 1;
  if (*end == 'k' || *end == 'K') m = 1024.0, end++;
  else if (*end == 'm' || *end == 'M') m = 1048576.0, end++;
  else if (*end == 'g' || *end == 'G') m = 1073741824.0, end++;
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end) return 0;
  *out = (size_t)(v * m);
  return 1;
}

static int parse_list(const char *s, int *out, int *n, int all_value) {
  *n = 0;
  while (*s) {
    char *end = NULL;
    long v;
    if (strncmp(s, "all", 3) == 0) {
      v = all_value;
      end = (char *)s + 3;
    } else {
      v = strtol(s, &end, 10);
      if (end == s) return 0;
    }
    if (v < 1 || *n == BC_MAX_LIST) return 0;
    out[(*n)++] = (int)v;
    s = end;
    if (*s == ',') s++;
    else if (*s) return 0;
  }
  return *n > 0;
}

extern "C" int mok_bench_comm_main(int argc, char **argv) {
  bc_opts o;
  memset(&o, 0, sizeof o);
  o.bytes = (size_t)1 << 30;
  o.push = o.pull = 1;
  o.iters = 20;
  o.warmup = 3;
  o.threads = 1024;
  o.unroll[0] = 4;
  o.nunroll = 1;
  o.ldst = 1;
  o.chunk = 32u << 10;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  int sm_count = 0;
  if (ndev > 0) cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0);
  const char *sms_arg = "8,16,24,32";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      bc_usage(stdout);
      return 0;
    }
    if (!v) {
      fprintf(stderr, "mok bench comm: %s needs a value\n", a);
      bc_usage(stderr);
      return 2;
    }
    i++;
    int ok = 1;
    if (!strcmp(a, "--gpus")) ok = (o.gpus = atoi(v)) >= 1;
    else if (!strcmp(a, "--sms")) sms_arg = v;
    else if (!strcmp(a, "--unroll")) {
      ok = parse_list(v, o.unroll, &o.nunroll, 4);
      for (int k = 0; ok && k < o.nunroll; k++) ok = o.unroll[k] == 1 || o.unroll[k] == 2 || o.unroll[k] == 4 || o.unroll[k] == 8;
    } else if (!strcmp(a, "--bytes")) ok = parse_size(v, &o.bytes) && o.bytes % 16 == 0;
    else if (!strcmp(a, "--mode")) {
      o.push = !strcmp(v, "push") || !strcmp(v, "both");
      o.pull = !strcmp(v, "pull") || !strcmp(v, "both");
      ok = o.push || o.pull;
    } else if (!strcmp(a, "--iters")) ok = (o.iters = atoi(v)) >= 1;
    else if (!strcmp(a, "--warmup")) ok = (o.warmup = atoi(v)) >= 0;
    else if (!strcmp(a, "--threads")) ok = (o.threads = atoi(v)) >= 32 && o.threads <= 1024 && o.threads % 32 == 0;
    else if (!strcmp(a, "--json")) o.json = v;
    else if (!strcmp(a, "--engine")) {
      o.ldst = !strcmp(v, "ldst") || !strcmp(v, "both");
      o.bulk = !strcmp(v, "bulk") || !strcmp(v, "both");
      ok = o.ldst || o.bulk;
    } else if (!strcmp(a, "--chunk")) {
      size_t c = 0;
      ok = parse_size(v, &c) && c >= 16 && c % 16 == 0 && c <= (100u << 10);
      o.chunk = (uint32_t)c;
    }
    else {
      fprintf(stderr, "mok bench comm: unknown option %s\n", a);
      bc_usage(stderr);
      return 2;
    }
    if (!ok) {
      fprintf(stderr, "mok bench comm: bad value for %s: %s\n", a, v);
      bc_usage(stderr);
      return 2;
    }
  }
  if (!parse_list(sms_arg, o.sms, &o.nsms, sm_count > 0 ? sm_count : 1)) {
    fprintf(stderr, "mok bench comm: bad value for --sms: %s\n", sms_arg);
    return 2;
  }
  if (ndev < 1) {
    fprintf(stderr, "mok bench comm: no CUDA device visible\n");
    return 1;
  }
  if (o.gpus == 0) o.gpus = ndev;
  if (o.gpus > ndev || o.gpus > BC_MAX_GPUS) {
    fprintf(stderr, "mok bench comm: --gpus %d but %d device(s) visible\n", o.gpus, ndev);
    return 2;
  }
  for (int k = 0; k < o.nsms; k++)
    if (o.sms[k] > sm_count) {
      fprintf(stderr, "mok bench comm: --sms %d exceeds the %d SMs of the device\n", o.sms[k], sm_count);
      return 2;
    }

  int nrows = (o.push + o.pull) * o.nsms * (o.ldst * o.nunroll + o.bulk);
  bc_row *rows = (bc_row *)calloc((size_t)nrows, sizeof *rows);
  int r = 0;
  for (int m = 0; m < 2; m++) {
    if ((m == 0 && !o.push) || (m == 1 && !o.pull)) continue;
    for (int u = 0; u < o.ldst * o.nunroll + o.bulk; u++)
      for (int k = 0; k < o.nsms; k++) {
        rows[r].mode = m;
        rows[r].sms = o.sms[k];
        rows[r].bulk = u >= o.ldst * o.nunroll;
        rows[r].unroll = rows[r].bulk ? 0 : o.unroll[u];
        r++;
      }
  }
  mokComm_t comms[BC_MAX_GPUS];
  if (mokLocalCommsCreate(o.gpus, NULL, NULL, comms) != mokSuccess) {
    fprintf(stderr, "mok bench comm: %s\n", mokGetLastError());
    free(rows);
    return 1;
  }
  bc_ctx ctx = {&o, rows, nrows};
  mokResult_t st = mokLocalRun(o.gpus, comms, bc_rank, &ctx);
  if (st != mokSuccess) fprintf(stderr, "mok bench comm: %s\n", mokGetLastError());
  mokLocalCommsDestroy(o.gpus, comms);
  if (st != mokSuccess) {
    free(rows);
    return 1;
  }

  int wrong = 0;
  FILE *js = NULL;
  if (o.json && !(js = fopen(o.json, "w"))) fprintf(stderr, "mok bench comm: cannot write %s\n", o.json);
  if (js)
    fprintf(js, "{\"bench\": \"comm\", \"gpus\": %d, \"bytes\": %zu, \"threads\": %d, \"iters\": %d, \"rows\": [\n",
            o.gpus, o.bytes, o.threads, o.iters);
  printf("# mok bench comm: %d GPUs, rank r <-> rank (r+1)%%%d, all ranks at once, %d threads/CTA, median of %d\n",
         o.gpus, o.gpus, o.threads, o.iters);
  printf("# GB/s per direction = bytes / time / 1e9; time = median per-copy time of the slowest rank\n");
  printf("%-5s %-6s %4s %6s %12s %10s %10s %12s %8s\n", "mode", "engine", "SMs", "unroll", "bytes", "time_ms", "GB/s",
         "GB/s_best", "wrong");
  for (int i = 0; i < nrows; i++) {
    bc_row *w = &rows[i];
    float worst = 0, worst_min = 0;
    unsigned long long bad = 0;
    for (int k = 0; k < o.gpus; k++) {
      if (w->median_ms[k] > worst) worst = w->median_ms[k];
      if (w->min_ms[k] > worst_min) worst_min = w->min_ms[k];
      bad += w->bad[k];
    }
    const double gbs = (double)o.bytes / (worst * 1e-3) / 1e9;
    const double gbs_best = (double)o.bytes / (worst_min * 1e-3) / 1e9;
    if (bad) wrong = 1;
    printf("%-5s %-6s %4d %6d %12zu %10.4f %10.1f %12.1f %8llu\n", w->mode ? "pull" : "push",
           w->bulk ? "bulk" : "ldst", w->sms, w->unroll, o.bytes, worst, gbs, gbs_best, bad);
    if (js)
      fprintf(js,
              "  {\"mode\": \"%s\", \"engine\": \"%s\", \"sms\": %d, \"unroll\": %d, \"chunk\": %u, "
              "\"bytes\": %zu, \"time_ms\": %.5f, \"gbps_per_direction\": %.2f, \"gbps_best\": %.2f, "
              "\"wrong_words\": %llu}%s\n",
              w->mode ? "pull" : "push", w->bulk ? "bulk" : "ldst", w->sms, w->unroll, w->bulk ? o.chunk : 0, o.bytes,
              worst, gbs, gbs_best, bad,
              i + 1 < nrows ? "," : "");
  }
  if (js) {
    fprintf(js, "]}\n");
    fclose(js);
  }
  free(rows);
  if (wrong) fprintf(stderr, "mok bench comm: WRONG data in at least one copy (see the 'wrong' column)\n");
  return wrong ? 1 : 0;
}
