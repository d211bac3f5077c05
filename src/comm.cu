/*
 * comm.cu — the multi-GPU runtime on NCCL, host side: communicator create/destroy on
 * the caller's ncclComm_t, the symmetric workspace (ncclMemAlloc +
 * ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) + ncclDevCommCreate), user buffers in
 * symmetric memory, the collective agreement check, the async-error query, the loopback
 * ranks' host barrier and the launchers of the barrier/test kernels. The one-process
 * helpers (a thread a GPU, loopback ranks, NCCL's unique id): comm_local.cu; the state
 * both share: comm_host.h; device primitives: comm_device.cuh; layouts: comm.h.
 *
 * Error style: every public function validates its arguments before any work and
 * returns mokInvalidArgument naming the argument, writing nothing. Failures later set
 * the comm's message and the thread's (mok_comm_error) and release what was taken.
 */
#include "comm_host.h"
#include "comm_device.cuh"
#include "internal.h"
#include "kernels_load.h"
#include "workspace.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <nccl_device.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#define MOK_COMM_MAX_TIMEOUT_MS 3600000
#define MOK_COMM_MAX_BYTES ((size_t)1 << 40)
#define MOK_AGREE_MAX_BYTES 65536

// ---- loopback ranks: the host barrier of their threads (struct loopback: comm_host.h) ----
// A barrier of the group's threads; 0 once the group was aborted (then no one waits). Bounded:
// a rank that does not arrive within wait_s aborts the group (a hang becomes an error; the
// comms are then unusable, as after a device timeout: destroy and re-create them).
int mok_lb_wait(struct loopback *lb) {
  pthread_mutex_lock(&lb->mu);
  if (!lb->aborted) {
    const unsigned g = lb->gen;
    if (++lb->arrived == lb->n) {
      lb->arrived = 0;
      lb->gen++;
      pthread_cond_broadcast(&lb->cv);
    } else {
      struct timespec dl;
      clock_gettime(CLOCK_REALTIME, &dl);
      dl.tv_sec += lb->wait_s;
      while (g == lb->gen && !lb->aborted)
        if (pthread_cond_timedwait(&lb->cv, &lb->mu, &dl) == ETIMEDOUT && g == lb->gen) {
          lb->aborted = lb->timed_out = 1;
          pthread_cond_broadcast(&lb->cv);
        }
    }
  }
  const int ok = !lb->aborted;
  pthread_mutex_unlock(&lb->mu);
  return ok;
}
static unsigned long long lb_queued_min(const struct loopback *lb) {
  unsigned long long m = lb->queued[0];
  for (int q = 1; q < lb->n; q++) m = lb->queued[q] < m ? lb->queued[q] : m;
  return m;
}
int mok_lb_gate(struct loopback *lb, int rank) {
  pthread_mutex_lock(&lb->mu);
  const unsigned long long k = ++lb->queued[rank];
  pthread_cond_broadcast(&lb->cv);
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += lb->wait_s;
  while (!lb->aborted && lb_queued_min(lb) < k)
    if (pthread_cond_timedwait(&lb->cv, &lb->mu, &dl) == ETIMEDOUT && lb_queued_min(lb) < k) {
      lb->aborted = 1, lb->timed_out = 2;
      pthread_cond_broadcast(&lb->cv);
    }
  const int ok = !lb->aborted;
  pthread_mutex_unlock(&lb->mu);
  return ok;
}
// Why the group is unusable, for messages.
static const char *lb_why(struct loopback *lb) {
  if (!lb || !lb->timed_out) return "";
  return lb->timed_out == 2 ? " (a rank did not queue a kernel its peers wait for in time: destroy and re-create the comms)"
                            : " (a rank did not reach a host collective in time: destroy and re-create the comms)";
}

extern "C" mokResult_t mok_comm_peer_kernel_queued(mokComm_t c, cudaStream_t stream) {
  static const char fn[] = "mok_comm_peer_kernel_queued";
  if (!c) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  if (!c->lb) return mokSuccess;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
    cudaGetLastError();
    cs = cudaStreamCaptureStatusNone;
  }
  if (cs != cudaStreamCaptureStatusNone) return mokSuccess; /* recorded, not queued */
  if (!mok_lb_gate(c->lb, c->rank))
    return mok_comm_error(c, mokInternalError, "%s: loopback rank %d: the group was aborted%s", fn, c->rank,
                          lb_why(c->lb));
  return mokSuccess;
}
void mok_lb_abort(struct loopback *lb) {
  pthread_mutex_lock(&lb->mu);
  lb->aborted = 1;
  pthread_cond_broadcast(&lb->cv);
  pthread_mutex_unlock(&lb->mu);
}
void mok_lb_drop(struct loopback *lb) {
  if (__atomic_sub_fetch(&lb->refs, 1, __ATOMIC_ACQ_REL) == 0) {
    pthread_cond_destroy(&lb->cv);
    pthread_mutex_destroy(&lb->mu);
    free(lb);
  }
}
// Every rank passes its own ok; returns whether all did (0 in an aborted group).
int mok_lb_all_ok(struct loopback *lb, int rank, int ok) {
  lb->ok[rank] = ok;
  if (!mok_lb_wait(lb)) return 0;
  int all = 1;
  for (int q = 0; q < lb->n; q++) all = all && lb->ok[q];
  if (!mok_lb_wait(lb)) return 0; // nobody writes ok[] again before everyone read it
  return all;
}

// ---- errors and device switching ---------------------------------------------------
mokResult_t mok_comm_error(mokComm_t c, mokResult_t st, const char *fmt, ...) {
  char msg[MOK_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c) snprintf(c->last_error, sizeof c->last_error, "%s", msg);
  return mok_error(NULL, st, "%s", msg);
}

// ---- config ------------------------------------------------------------------------
mokResult_t mok_comm_config_validate(const char *fn, const mokCommConfig_t *in, mokCommConfig_t *out) {
  mokCommConfig_t c = MOK_COMM_CONFIG_INITIALIZER;
  if (in) {
    if (in->size != sizeof(mokCommConfig_t))
      return mok_error(NULL, mokInvalidArgument,
                       "%s: config->size = %zu, expected sizeof(mokCommConfig_t) = %zu (use MOK_COMM_CONFIG_INITIALIZER)",
                       fn, in->size, sizeof(mokCommConfig_t));
    if (in->magic != MOK_COMM_CONFIG_MAGIC)
      return mok_error(NULL, mokInvalidArgument,
                       "%s: config->magic = 0x%x, expected MOK_COMM_CONFIG_MAGIC (use MOK_COMM_CONFIG_INITIALIZER)",
                       fn, in->magic);
    if (in->version / 10000 != MOK_VERSION_MAJOR)
      return mok_error(NULL, mokInvalidArgument,
                       "%s: config->version = %u comes from another major version than this library (%d)",
                       fn, in->version, MOK_VERSION_CODE);
    if (in->timeout_ms < 0 || in->timeout_ms > MOK_COMM_MAX_TIMEOUT_MS)
      return mok_error(NULL, mokInvalidArgument,
                       "%s: config->timeout_ms = %d: must be 0 (default %d) or 1 .. %d", fn,
                       in->timeout_ms, MOK_COMM_DEFAULT_TIMEOUT_MS, MOK_COMM_MAX_TIMEOUT_MS);
    if (in->workspace_bytes > MOK_COMM_MAX_BYTES)
      return mok_error(NULL, mokInvalidArgument,
                       "%s: config->workspace_bytes = %zu: must be at most 2^40", fn, in->workspace_bytes);
    c = *in;
  }
  if (c.timeout_ms == 0) c.timeout_ms = MOK_COMM_DEFAULT_TIMEOUT_MS;
  if (c.workspace_bytes == 0) c.workspace_bytes = MOK_COMM_DEFAULT_WORKSPACE;
  c.workspace_bytes = (size_t)mok_round_up((int64_t)c.workspace_bytes, (int64_t)MOK_COMM_ALLOC_ALIGN);
  *out = c;
  return mokSuccess;
}

extern "C" mokResult_t mokCommConfigInit(mokCommConfig_t *config) {
  mok_clear_error();
  if (!config) return mok_error(NULL, mokInvalidArgument, "mokCommConfigInit: config is NULL");
  mokCommConfig_t init = MOK_COMM_CONFIG_INITIALIZER;
  *config = init;
  return mokSuccess;
}

// ---- symmetric windows -------------------------------------------------------------
// ncclGetLsaPointer of every rank, read once on the device and kept on the host, so
// kernels get plain pointers (mokCommDev) and need no NCCL device header.
__global__ void k_peer_bases(ncclWindow_t win, int nranks, char **out) {
  int p = threadIdx.x;
  if (p < nranks) out[p] = (char *)ncclGetLsaPointer(win, 0, p);
}

// Collective. Allocates `total` bytes of symmetric memory, zeroed, registers it.
static mokResult_t lb_sym_alloc(mokComm_t c, const char *fn, size_t total, void **ptr_out, char **peers) {
  struct loopback *lb = c->lb;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, total);
  if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, total, c->side);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->side);
  if (e != cudaSuccess) cudaGetLastError();
  const int all = mok_lb_all_ok(lb, c->rank, e == cudaSuccess);
  if (!all) {
    if (p) cudaFree(p);
    if (e != cudaSuccess)
      return mok_comm_error(c, e == cudaErrorMemoryAllocation ? mokOutOfMemory : mokCudaError,
                            "%s: loopback rank %d: %zu bytes: %s", fn, c->rank, total, cudaGetErrorString(e));
    return mok_comm_error(c, mokOutOfMemory, "%s: loopback: another rank could not allocate %zu bytes", fn, total);
  }
  lb->ptr[c->rank] = p;
  int ok = mok_lb_wait(lb);
  for (int q = 0; q < lb->n && ok; q++) peers[q] = (char *)lb->ptr[q];
  if (!(ok && mok_lb_wait(lb))) {
    cudaFree(p);
    return mok_comm_error(c, mokInternalError, "%s: loopback: the group was aborted%s", fn, lb_why(c->lb));
  }
  *ptr_out = p;
  return mokSuccess;
}

static mokResult_t sym_alloc(mokComm_t c, const char *fn, size_t total, void **ptr_out,
                             ncclWindow_t *win_out, char **peers) {
  mokResult_t st = mokSuccess;
  void *p = NULL;
  ncclWindow_t win = NULL;
  if (c->lb) {
    *win_out = NULL;
    return lb_sym_alloc(c, fn, total, ptr_out, peers);
  }
  C_NCCL(c->nccl, ncclMemAlloc(&p, total));
  // Zero before registering: registration is collective, so no peer can reach this
  // memory (through the window) before it is zeroed here.
  C_CUDA(cudaMemsetAsync(p, 0, total, c->side));
  C_CUDA(cudaStreamSynchronize(c->side));
  if (c->nranks == 1) {
    // NCCL has no symmetric windows on a one-rank communicator ("does not support
    // symmetric memory"), and there are no peers to reach: the local buffer is all.
    peers[0] = (char *)p;
    *ptr_out = p;
    *win_out = NULL;
    return mokSuccess;
  }
  C_NCCL(c->nccl, ncclCommWindowRegister(c->nccl, p, total, &win, NCCL_WIN_COLL_SYMMETRIC));
  k_peer_bases<<<1, MOK_COMM_MAX_RANKS, 0, c->side>>>(win, c->nranks, c->d_scratch);
  C_CUDA(cudaGetLastError());
  C_CUDA(cudaMemcpyAsync(peers, c->d_scratch, sizeof(char *) * (size_t)c->nranks,
                         cudaMemcpyDeviceToHost, c->side));
  C_CUDA(cudaStreamSynchronize(c->side));
  *ptr_out = p;
  *win_out = win;
  return mokSuccess;
out:
  if (win) ncclCommWindowDeregister(c->nccl, win);
  if (p) ncclMemFree(p);
  return st;
}

// Collective. Deregisters and frees; keeps the first error, releases all.
static mokResult_t sym_free(mokComm_t c, const char *fn, void *p, ncclWindow_t win) {
  mokResult_t st = mokSuccess;
  if (c->lb) { // every rank done with every window before any is freed (none waits in an aborted group)
    (void)mok_lb_wait(c->lb);
    cudaError_t e = p ? cudaFree(p) : cudaSuccess;
    return e == cudaSuccess ? mokSuccess
                            : mok_comm_error(c, mokCudaError, "%s: cudaFree failed: %s", fn, cudaGetErrorString(e));
  }
  if (win) C_NCCL(c->nccl, ncclCommWindowDeregister(c->nccl, win));
out:
  if (p) {
    ncclResult_t r = ncclMemFree(p);
    if (r != ncclSuccess && st == mokSuccess)
      st = mok_comm_error(c, mokNcclError, "%s: ncclMemFree failed: %s", fn, ncclGetErrorString(r));
  }
  return st;
}

mokResult_t mok_comm_ws_create(mokComm_t c, const char *fn, size_t user_bytes) {
  size_t total = MOK_COMM_CTRL_BYTES + user_bytes;
  MOK_CHECK(sym_alloc(c, fn, total, &c->ws_ptr, &c->ws_win, c->ws_peer));
  c->ws_total = total;
  return mokSuccess;
}

// ---- agreement -----------------------------------------------------------------------
static uint64_t fnv1a(const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// agree's checks of rank r's blob against rank 0's: the same messages on every rank.
static mokResult_t agree_size(mokComm_t c, const char *fn, const char *what, int r, uint64_t br, uint64_t b0) {
  if (br == b0) return mokSuccess;
  return mok_comm_error(c, mokInvalidArgument,
                        "%s: %s differs between ranks: rank %d passed %llu bytes, rank 0 passed %llu", fn, what, r,
                        (unsigned long long)br, (unsigned long long)b0);
}
static mokResult_t agree_bytes(mokComm_t c, const char *fn, const char *what, int r, const unsigned char *x,
                               const unsigned char *r0, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    if (x[i] != r0[i])
      return mok_comm_error(c, mokInvalidArgument,
                            "%s: %s differs between ranks: rank %d disagrees with rank 0 at byte %zu "
                            "of %zu (0x%02x vs 0x%02x); every rank must pass the same %s",
                            fn, what, r, i, bytes, x[i], r0[i], what);
  return mokSuccess;
}

// Collective: all-gather (bytes, hash), then the blobs, then compare with rank 0.
mokResult_t mok_comm_agree(mokComm_t c, const char *fn, const void *blob, size_t bytes, const char *what) {
  mokResult_t st = mokSuccess;
  const int n = c->nranks;
  uint64_t hdr[2] = {(uint64_t)bytes, fnv1a(blob, bytes)};
  uint64_t *all_hdr = (uint64_t *)malloc(sizeof(uint64_t) * 2 * (size_t)n);
  unsigned char *all = NULL;
  char *d = NULL;
  const size_t dbytes = 16 * (size_t)(n + 1) + bytes * (size_t)(n + 1);
  if (!what) what = "value";
  if (!all_hdr) return mok_comm_error(c, mokOutOfMemory, "%s: out of host memory", fn);
  if (c->lb) { // the blobs in place: every rank compares every rank's with rank 0's, as below
    struct loopback *lb = c->lb;
    lb->blob[c->rank] = blob;
    lb->bytes[c->rank] = bytes;
    if (!mok_lb_wait(lb)) {
      free(all_hdr);
      return mok_comm_error(c, mokInternalError, "%s: loopback: the group was aborted%s", fn, lb_why(c->lb));
    }
    for (int r = 1; r < n && st == mokSuccess; r++) st = agree_size(c, fn, what, r, lb->bytes[r], lb->bytes[0]);
    for (int r = 1; r < n && st == mokSuccess; r++)
      st = agree_bytes(c, fn, what, r, (const unsigned char *)lb->blob[r], (const unsigned char *)lb->blob[0], bytes);
    (void)mok_lb_wait(lb); /* every blob stays valid until every rank compared */
    free(all_hdr);
    return st;
  }
  C_CUDA(cudaMallocAsync((void **)&d, dbytes, c->side));
  C_CUDA(cudaMemcpyAsync(d, hdr, 16, cudaMemcpyHostToDevice, c->side));
  C_NCCL(c->nccl, ncclAllGather(d, d + 16, 16, ncclUint8, c->nccl, c->side));
  C_CUDA(cudaMemcpyAsync(all_hdr, d + 16, 16 * (size_t)n, cudaMemcpyDeviceToHost, c->side));
  C_CUDA(cudaStreamSynchronize(c->side));
  for (int r = 1; r < n; r++) C_MOK(agree_size(c, fn, what, r, all_hdr[2 * r], all_hdr[0]));
  {
    // Same sizes everywhere: the blobs can be gathered safely.
    all = (unsigned char *)malloc(bytes * (size_t)n);
    if (!all) {
      st = mok_comm_error(c, mokOutOfMemory, "%s: out of host memory", fn);
      goto out;
    }
    char *dsend = d + 16 * (size_t)(n + 1), *drecv = dsend + bytes;
    C_CUDA(cudaMemcpyAsync(dsend, blob, bytes, cudaMemcpyHostToDevice, c->side));
    C_NCCL(c->nccl, ncclAllGather(dsend, drecv, bytes, ncclUint8, c->nccl, c->side));
    C_CUDA(cudaMemcpyAsync(all, drecv, bytes * (size_t)n, cudaMemcpyDeviceToHost, c->side));
    C_CUDA(cudaStreamSynchronize(c->side));
    for (int r = 1; r < n; r++) C_MOK(agree_bytes(c, fn, what, r, all + (size_t)r * bytes, all, bytes));
  }
out:
  if (d) cudaFreeAsync(d, c->side);
  cudaStreamSynchronize(c->side);
  free(all_hdr);
  free(all);
  return st;
}

// Every rank's `bytes` bytes, rank order, into all (host memory of n * bytes); host-blocking.
extern "C" mokResult_t mok_comm_host_allgather(mokComm_t c, const void *mine, size_t bytes, void *all) {
  static const char fn[] = "mok_comm_host_allgather";
  if (!c || !mine || !all || !bytes) return mok_error(NULL, mokInvalidArgument, "%s: NULL or empty argument", fn);
  const int n = c->nranks;
  if (c->lb) { // the blobs in place, as agree does
    struct loopback *lb = c->lb;
    lb->blob[c->rank] = mine;
    if (!mok_lb_wait(lb))
      return mok_comm_error(c, mokInternalError, "%s: loopback: the group was aborted%s", fn, lb_why(c->lb));
    for (int r = 0; r < n; r++) memcpy((char *)all + (size_t)r * bytes, lb->blob[r], bytes);
    if (!mok_lb_wait(lb))
      return mok_comm_error(c, mokInternalError, "%s: loopback: the group was aborted%s", fn, lb_why(c->lb));
    return mokSuccess;
  }
  mokResult_t st = mokSuccess;
  char *d = NULL;
  int prev = dev_enter(c->device);
  C_CUDA(cudaMallocAsync((void **)&d, bytes * (size_t)(n + 1), c->side));
  C_CUDA(cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, c->side));
  C_NCCL(c->nccl, ncclAllGather(d, d + bytes, bytes, ncclUint8, c->nccl, c->side));
  C_CUDA(cudaMemcpyAsync(all, d + bytes, bytes * (size_t)n, cudaMemcpyDeviceToHost, c->side));
  C_CUDA(cudaStreamSynchronize(c->side));
out:
  if (d) cudaFreeAsync(d, c->side);
  cudaStreamSynchronize(c->side);
  dev_leave(prev, c->device);
  return st;
}

extern "C" int mok_comm_device_share(mokComm_t c) { return c && c->lb ? c->nranks : 1; }
extern "C" int mok_comm_is_loopback(mokComm_t c) { return c && c->lb; }

extern "C" mokResult_t mokCommCheckAgreement(mokComm_t comm, const void *blob, size_t bytes, const char *what) {
  static const char fn[] = "mokCommCheckAgreement";
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  if (!blob) return mok_comm_error(comm, mokInvalidArgument, "%s: blob is NULL", fn);
  if (bytes < 1 || bytes > MOK_AGREE_MAX_BYTES)
    return mok_comm_error(comm, mokInvalidArgument, "%s: bytes = %zu: must be 1 .. %d", fn, bytes,
                          MOK_AGREE_MAX_BYTES);
  int prev = dev_enter(comm->device);
  mokResult_t st = mok_comm_agree(comm, fn, blob, bytes, what);
  dev_leave(prev, comm->device);
  return st;
}

// ---- create / destroy ----------------------------------------------------------------
// Releases everything the comm holds; keeps the first error. Collective for windows.
mokResult_t mok_comm_release(mokComm_t c, const char *fn) {
  mokResult_t st = mokSuccess, s;
  while (c->bufs) {
    struct symbuf *b = c->bufs;
    c->bufs = b->next;
    s = sym_free(c, fn, b->ptr, b->win);
    if (st == mokSuccess) st = s;
    free(b);
  }
  if (c->ws_ptr) {
    s = sym_free(c, fn, c->ws_ptr, c->ws_win);
    if (st == mokSuccess) st = s;
    c->ws_ptr = NULL;
    c->ws_win = NULL;
  }
  if (c->has_devcomm) {
    ncclResult_t r = ncclDevCommDestroy(c->nccl, &c->devcomm);
    if (r != ncclSuccess && st == mokSuccess)
      st = mok_comm_error(c, mokNcclError, "%s: ncclDevCommDestroy failed: %s", fn, ncclGetErrorString(r));
    c->has_devcomm = 0;
  }
  if (c->d_scratch) cudaFree(c->d_scratch);
  mok_devbuf_free(&c->scratch);
  if (c->h_word) cudaFreeHost(c->h_word);
  if (c->side) cudaStreamDestroy(c->side);
  c->d_scratch = NULL;
  c->h_word = NULL;
  c->side = NULL;
  if (c->lb) {
    mok_lb_drop(c->lb);
    c->lb = NULL;
  }
  if (c->owns_nccl && c->nccl) {
    ncclResult_t r = ncclCommFinalize(c->nccl);
    if (r == ncclSuccess) r = ncclCommDestroy(c->nccl);
    else ncclCommAbort(c->nccl);
    if (r != ncclSuccess && st == mokSuccess)
      st = mok_comm_error(c, mokNcclError, "%s: destroying the NCCL communicator failed: %s", fn,
                          ncclGetErrorString(r));
    c->nccl = NULL;
  }
  return st;
}

mokResult_t mok_comm_create_on(mokComm_t *comm, ncclComm_t nccl, const mokCommConfig_t *config, int owns) {
  static const char fn[] = "mokCommCreate";
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  if (!nccl) return mok_error(NULL, mokInvalidArgument, "%s: nccl is NULL", fn);
  mokCommConfig_t cfg;
  MOK_CHECK(mok_comm_config_validate(fn, config, &cfg));

  mokResult_t st = mokSuccess;
  int nranks = 0, rank = 0, device = 0, prev = -1;
  mokComm_t c = NULL;
  {
    ncclResult_t r;
    if ((r = ncclCommCount(nccl, &nranks)) != ncclSuccess || (r = ncclCommUserRank(nccl, &rank)) != ncclSuccess ||
        (r = ncclCommCuDevice(nccl, &device)) != ncclSuccess)
      return mok_error(NULL, mokNcclError, "%s: querying the NCCL communicator failed: %s", fn,
                       ncclGetErrorString(r));
  }
  // Every rank sees the same count, so every rank fails here alike.
  if (nranks > MOK_COMM_MAX_RANKS)
    return mok_error(NULL, mokNotSupported, "%s: %d ranks: at most %d are supported (MOK_COMM_MAX_RANKS)",
                     fn, nranks, MOK_COMM_MAX_RANKS);
  c = (mokComm_t)calloc(1, sizeof *c);
  if (!c) return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->nccl = nccl;
  c->cfg = cfg;
  prev = dev_enter(device);
  // A rank's kernels wait for its peers' (and NCCL's for theirs): under CUDA's lazy loading
  // a first launch could wait for them in turn (kernels_load.h), so every mok kernel is
  // loaded now. Before the first collective: a driver too old to do it fails every rank.
  C_MOK(mok_kernels_load(fn, device, 1, NULL));
  C_CUDA(cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking));
  C_CUDA(cudaMallocHost((void **)&c->h_word, sizeof *c->h_word));
  C_CUDA(cudaMalloc((void **)&c->d_scratch, sizeof(char *) * MOK_COMM_MAX_RANKS));
  {
    agreed_config a;
    memset(&a, 0, sizeof a);
    a.workspace_bytes = cfg.workspace_bytes;
    a.timeout_ms = cfg.timeout_ms;
    a.nranks = nranks;
    a.version_major = MOK_VERSION_MAJOR;
    C_MOK(mok_comm_agree(c, fn, &a, sizeof a, "mokCommConfig_t"));
  }
  if (nranks > 1) {  // one rank: no peers, and NCCL refuses symmetric memory there
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof reqs);
    C_NCCL(nccl, ncclDevCommCreate(nccl, &reqs, &c->devcomm));
    c->has_devcomm = 1;
    // mok addresses peers by world rank through LSA pointers: all ranks must be in
    // one LSA team (one NVLink domain) with LSA rank = world rank. The same on every
    // rank, so all fail alike.
    if (c->devcomm.lsaSize != nranks || c->devcomm.lsaRank != rank) {
      st = mok_comm_error(c, mokNotSupported,
                          "%s: rank %d of %d is in an NVLink (LSA) team of %d ranks (LSA rank %d): mok "
                          "needs every rank to load/store every other rank's memory",
                          fn, rank, nranks, c->devcomm.lsaSize, c->devcomm.lsaRank);
      goto out;
    }
  }
  C_MOK(mok_comm_ws_create(c, fn, cfg.workspace_bytes));
  C_CUDA(cudaDeviceSynchronize());
  c->owns_nccl = owns;
  *comm = c;
  dev_leave(prev, device);
  return mokSuccess;
out:
  {
    char msg[MOK_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s", mokGetLastError());
    mok_comm_release(c, fn);  // owns_nccl is 0 here: the caller keeps its NCCL comm
    free(c);
    dev_leave(prev, device);
    mok_error(NULL, st, "%s", msg);
  }
  return st;
}

extern "C" mokResult_t mokCommCreate(mokComm_t *comm, ncclComm_t nccl, const mokCommConfig_t *config) {
  mok_clear_error();
  return mok_comm_create_on(comm, nccl, config, 0);
}

extern "C" mokResult_t mokCommDestroy(mokComm_t comm) {
  static const char fn[] = "mokCommDestroy";
  mok_clear_error();
  if (!comm) return mokSuccess;
  mokComm_t c = comm;
  const int device = c->device;
  int prev = dev_enter(device);
  mokResult_t st = mokSuccess;
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    st = mok_comm_error(c, mokCudaError, "%s: cudaDeviceSynchronize failed: %s", fn, cudaGetErrorString(e));
  mokResult_t s = mok_comm_release(c, fn);
  if (st == mokSuccess) st = s;
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  free(c);
  dev_leave(prev, device);
  if (st != mokSuccess) mok_error(NULL, st, "%s", msg);
  return st;
}

// ---- queries -----------------------------------------------------------------------
mok_devbuf *mok_comm_scratch(mokComm_t comm) { return comm ? &comm->scratch : NULL; }

extern "C" mokResult_t mokCommRankInfo(mokComm_t comm, int *rank, int *num_ranks, int *device) {
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "mokCommRankInfo: comm is NULL");
  if (rank) *rank = comm->rank;
  if (num_ranks) *num_ranks = comm->nranks;
  if (device) *device = comm->device;
  return mokSuccess;
}

extern "C" mokResult_t mokCommGetNccl(mokComm_t comm, ncclComm_t *nccl) {
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "mokCommGetNccl: comm is NULL");
  if (!nccl) return mok_comm_error(comm, mokInvalidArgument, "mokCommGetNccl: nccl is NULL");
  if (comm->lb)
    return mok_comm_error(comm, mokNotSupported, "mokCommGetNccl: a loopback communicator (tests: several ranks on one "
                          "GPU) has no NCCL communicator; what needs NCCL does not run on it");
  *nccl = comm->nccl;
  return mokSuccess;
}

extern "C" const char *mokCommGetLastError(mokComm_t comm) { return comm ? comm->last_error : ""; }

extern "C" mokResult_t mok_comm_read_error_word(mokComm_t c, unsigned long long *word) {
  static const char fn[] = "mokCommGetAsyncError";
  mokResult_t st = mokSuccess;
  int prev = dev_enter(c->device);
  mokCommCtrl *ctrl = (mokCommCtrl *)c->ws_ptr;
  C_CUDA(cudaMemcpyAsync(c->h_word, &ctrl->error, sizeof *c->h_word, cudaMemcpyDeviceToHost, c->side));
  C_CUDA(cudaStreamSynchronize(c->side));
  *word = *(volatile unsigned long long *)c->h_word;
out:
  dev_leave(prev, c->device);
  return st;
}

static const char *wait_name(unsigned what) {
#define MOK_WAIT_NAME_(name, value, text, where) \
  case value:                                    \
    return text;
  switch (what) { MOK_WAIT_LIST(MOK_WAIT_NAME_) }
#undef MOK_WAIT_NAME_
  return "wait";
}
static const char *where_name(unsigned what) {
#define MOK_WHERE_NAME_(name, value, text, where) \
  case value:                                     \
    return where;
  switch (what) { MOK_WAIT_LIST(MOK_WHERE_NAME_) }
#undef MOK_WHERE_NAME_
  return "detail";
}

extern "C" void mok_errword_text(unsigned long long w, char *buf, size_t n) {
  const unsigned kind = MOK_ERRWORD_KIND(w), what = MOK_ERRWORD_WHAT(w);
  snprintf(buf, n, "rank %d: %s in %s, %s %u", MOK_ERRWORD_RANK(w),
           kind == MOK_DEVERR_TIMEOUT ? "timed out" : kind == MOK_DEVERR_INPUT ? "bad device input" : "internal error",
           wait_name(what), where_name(what), MOK_ERRWORD_WHERE(w));
}

extern "C" mokResult_t mokCommGetAsyncError(mokComm_t comm, mokResult_t *status) {
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "mokCommGetAsyncError: comm is NULL");
  if (!status) return mok_comm_error(comm, mokInvalidArgument, "mokCommGetAsyncError: status is NULL");
  unsigned long long w = 0;
  MOK_CHECK(mok_comm_read_error_word(comm, &w));
  if (w == 0) {
    *status = mokSuccess;
    return mokSuccess;
  }
  const unsigned kind = MOK_ERRWORD_KIND(w), what = MOK_ERRWORD_WHAT(w);
  const int origin = MOK_ERRWORD_RANK(w);
  const mokResult_t s = kind == MOK_DEVERR_TIMEOUT ? mokTimeout
                        : kind == MOK_DEVERR_INPUT ? mokDeviceError
                                                   : mokInternalError;
  char here[64] = "";
  if (origin != comm->rank) snprintf(here, sizeof here, " (seen on rank %d)", comm->rank);
  snprintf(comm->last_error, sizeof comm->last_error,
           "device error on rank %d%s: %s in %s, %s %u; destroy and re-create the communicator",
           origin, here,
           kind == MOK_DEVERR_TIMEOUT ? "timed out" : kind == MOK_DEVERR_INPUT ? "bad device input" : "internal error",
           wait_name(what), where_name(what), MOK_ERRWORD_WHERE(w));
  *status = s;
  return mokSuccess;
}

extern "C" mokResult_t mok_comm_device_view(mokComm_t comm, mokCommDev *dev) {
  if (!comm || !dev) return mok_error(NULL, mokInvalidArgument, "mok_comm_device_view: NULL argument");
  memset(dev, 0, sizeof *dev);
  dev->rank = comm->rank;
  dev->nranks = comm->nranks;
  dev->timeout_ns = (unsigned long long)comm->cfg.timeout_ms * 1000000ull;
  dev->ws_bytes = comm->ws_total - MOK_COMM_CTRL_BYTES;
  for (int p = 0; p < comm->nranks; p++) dev->peer_base[p] = comm->ws_peer[p];
  return mokSuccess;
}

extern "C" int mok_comm_find_symmetric(mokComm_t comm, const void *ptr, size_t bytes, void **peers) {
  if (!comm || !ptr) return 0;
  for (struct symbuf *b = comm->bufs; b; b = b->next) {
    const char *lo = (const char *)b->ptr, *q = (const char *)ptr;
    if (q >= lo && bytes <= b->bytes && (size_t)(q - lo) <= b->bytes - bytes) {
      for (int p = 0; p < comm->nranks; p++) peers[p] = b->peer[p] + (q - lo);
      return 1;
    }
  }
  return 0;
}

// ---- workspace and user buffers ------------------------------------------------------
extern "C" mokResult_t mokCommWorkspaceSize(mokComm_t comm, size_t *bytes) {
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "mokCommWorkspaceSize: comm is NULL");
  if (!bytes) return mok_comm_error(comm, mokInvalidArgument, "mokCommWorkspaceSize: bytes is NULL");
  *bytes = comm->ws_total - MOK_COMM_CTRL_BYTES;
  return mokSuccess;
}

extern "C" mokResult_t mokCommReserveWorkspace(mokComm_t comm, size_t bytes) {
  static const char fn[] = "mokCommReserveWorkspace";
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  if (bytes > MOK_COMM_MAX_BYTES)
    return mok_comm_error(comm, mokInvalidArgument, "%s: bytes = %zu: must be at most 2^40", fn, bytes);
  mokComm_t c = comm;
  const size_t want = (size_t)mok_round_up((int64_t)bytes, (int64_t)MOK_COMM_ALLOC_ALIGN);
  if (want <= c->ws_total - MOK_COMM_CTRL_BYTES) return mokSuccess;
  mokResult_t st = mokSuccess;
  unsigned long long w = 0;
  int prev = dev_enter(c->device);
  C_MOK(mok_comm_read_error_word(c, &w));
  if (w) {
    st = mok_comm_error(c, mokInvalidUsage,
                        "%s: the communicator has a device error (see mokCommGetAsyncError); destroy and "
                        "re-create it", fn);
    goto out;
  }
  C_CUDA(cudaDeviceSynchronize());
  C_MOK(sym_free(c, fn, c->ws_ptr, c->ws_win));
  c->ws_ptr = NULL;
  c->ws_win = NULL;
  c->ws_total = 0;
  C_MOK(mok_comm_ws_create(c, fn, want));
out:
  dev_leave(prev, c->device);
  return st;
}

extern "C" mokResult_t mokCommMemAlloc(mokComm_t comm, size_t bytes, void **ptr) {
  static const char fn[] = "mokCommMemAlloc";
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  if (!ptr) return mok_comm_error(comm, mokInvalidArgument, "%s: ptr is NULL", fn);
  if (bytes < 1 || bytes > MOK_COMM_MAX_BYTES)
    return mok_comm_error(comm, mokInvalidArgument, "%s: bytes = %zu: must be 1 .. 2^40", fn, bytes);
  mokComm_t c = comm;
  mokResult_t st = mokSuccess;
  int prev = dev_enter(c->device);
  struct symbuf *b = (struct symbuf *)calloc(1, sizeof *b);
  if (!b) {
    st = mok_comm_error(c, mokOutOfMemory, "%s: out of host memory", fn);
    goto out;
  }
  b->bytes = (size_t)mok_round_up((int64_t)bytes, (int64_t)MOK_COMM_ALLOC_ALIGN);
  C_MOK(sym_alloc(c, fn, b->bytes, &b->ptr, &b->win, b->peer));
  b->next = c->bufs;
  c->bufs = b;
  *ptr = b->ptr;
  b = NULL;
out:
  free(b);
  dev_leave(prev, c->device);
  return st;
}

extern "C" mokResult_t mokCommMemFree(mokComm_t comm, void *ptr) {
  static const char fn[] = "mokCommMemFree";
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  if (!ptr) return mokSuccess;
  mokComm_t c = comm;
  struct symbuf **pp = &c->bufs;
  while (*pp && (*pp)->ptr != ptr) pp = &(*pp)->next;
  if (!*pp)
    return mok_comm_error(c, mokInvalidArgument, "%s: ptr %p was not allocated by mokCommMemAlloc on this comm",
                          fn, ptr);
  struct symbuf *b = *pp;
  mokResult_t st = mokSuccess;
  int prev = dev_enter(c->device);
  C_CUDA(cudaDeviceSynchronize());
  *pp = b->next;
  st = sym_free(c, fn, b->ptr, b->win);
  free(b);
out:
  dev_leave(prev, c->device);
  return st;
}

// ---- barrier / test kernels -----------------------------------------------------------
// `count` consecutive barriers; with `check`, each CTA stamps base+i into its slot on
// every rank before barrier i and verifies all slots after it (see comm.h).
// Slots: uint32 [nranks * gridDim.x] at the start of each rank's user workspace.
__global__ void k_barriers(mokCommDev c, int count, int check, uint32_t base) {
  const int nslots = c.nranks * (int)gridDim.x;
  const int my = c.rank * (int)gridDim.x + (int)blockIdx.x;
  volatile uint32_t *local = (volatile uint32_t *)mok_local_ptr(c, 0);
  __shared__ int s_bad;
  for (int i = 0; i < count; i++) {
    const uint32_t v = base + (uint32_t)i;
    if (check && threadIdx.x < (unsigned)c.nranks)
      ((volatile uint32_t *)mok_peer_ptr(c, (int)threadIdx.x, 0))[my] = v;
    if (!mok_barrier(c)) return;
    if (check) {
      if (threadIdx.x == 0) s_bad = 0;
      __syncthreads();
      for (int k = threadIdx.x; k < nslots; k += blockDim.x) {
        const uint32_t got = local[k];
        if (got != v && got != v + 1u) s_bad = 1;
      }
      __syncthreads();
      if (s_bad) {
        if (threadIdx.x == 0) mok_record_error(c, MOK_ERRWORD(MOK_DEVERR_INTERNAL, MOK_WAIT_TEST, c.rank, i));
        return;
      }
    }
  }
}

__global__ void k_plant_error(mokCommDev c, unsigned long long word) { mok_record_error(c, word); }

extern "C" mokResult_t mok_comm_launch_barriers(mokComm_t comm, int blocks, int threads, int count,
                                                int check, uint32_t base, cudaStream_t stream) {
  static const char fn[] = "mok_comm_launch_barriers";
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  mokComm_t c = comm;
  mokResult_t st = mokSuccess;
  int prev = dev_enter(c->device);
  int sms = 0;
  mokCommDev dev;
  C_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device));
  if (blocks < 1 || blocks > sms || threads < 32 || threads > 1024 || count < 0) {
    st = mok_comm_error(c, mokInvalidArgument, "%s: blocks = %d (1 .. %d SMs), threads = %d (32 .. 1024), count = %d",
                        fn, blocks, sms, threads, count);
    goto out;
  }
  C_MOK(mok_comm_device_view(c, &dev));
  if (check && (size_t)c->nranks * (size_t)blocks * 4 > dev.ws_bytes) {
    st = mok_comm_error(c, mokInvalidArgument, "%s: check needs %zu workspace bytes", fn,
                        (size_t)c->nranks * (size_t)blocks * 4);
    goto out;
  }
  k_barriers<<<blocks, threads, 0, stream>>>(dev, count, check, base);
  {
    const cudaError_t e = cudaGetLastError();
    /* queued or not, the peers meet this rank at the gate (a failed launch: their kernels
     * time out on the device and report it, rather than their threads waiting here) */
    const mokResult_t g = mok_comm_peer_kernel_queued(c, stream);
    C_CUDA(e);
    C_MOK(g);
  }
out:
  dev_leave(prev, c->device);
  return st;
}

extern "C" mokResult_t mok_comm_launch_plant_error(mokComm_t comm, unsigned long long word, cudaStream_t stream) {
  static const char fn[] = "mok_comm_launch_plant_error";
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  mokComm_t c = comm;
  mokResult_t st = mokSuccess;
  int prev = dev_enter(c->device);
  mokCommDev dev;
  C_MOK(mok_comm_device_view(c, &dev));
  k_plant_error<<<1, 1, 0, stream>>>(dev, word);
  C_CUDA(cudaGetLastError());
out:
  dev_leave(prev, c->device);
  return st;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
extern "C" mokKernelAnchor mok_anchor_comm(void) {
  mokKernelAnchor a = {"src/comm.cu", (const void *)k_plant_error, {NULL}};
  return a;
}
