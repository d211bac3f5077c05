/*
 * comm_host.h — the communicator's host state, shared by comm.cu (create / destroy,
 * windows, agreement, queries, the barrier and test kernels) and comm_local.cu (the
 * one-process helpers: one thread a GPU, loopback ranks, NCCL's unique id). Internal.
 */
#ifndef MOK_COMM_HOST_H
#define MOK_COMM_HOST_H

#include "comm.h"
#include "internal.h"
#include "workspace.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <pthread.h>

// A buffer of mokCommMemAlloc.
struct symbuf {
  void *ptr;
  size_t bytes;
  ncclWindow_t win;
  char *peer[MOK_COMM_MAX_RANKS];
  struct symbuf *next;
};

struct mokComm {
  int rank, nranks, device;
  ncclComm_t nccl;
  int owns_nccl;               // made by mokLocalCommsCreate: destroyed with the comm
  mokCommConfig_t cfg;         // validated, defaults filled in
  ncclDevComm devcomm;
  int has_devcomm;
  cudaStream_t side;           // private non-blocking stream: never waits for user streams
  unsigned long long *h_word;  // pinned host word for error reads
  char **d_scratch;            // [MOK_COMM_MAX_RANKS] peer bases from the device
  // symmetric workspace: [mokCommCtrl | user workspace]
  void *ws_ptr;
  size_t ws_total;
  ncclWindow_t ws_win;
  char *ws_peer[MOK_COMM_MAX_RANKS];
  struct symbuf *bufs;
  mok_devbuf scratch;          // the row scratch its layers share (workspace.h)
  char last_error[MOK_ERRMSG_LEN];
  struct loopback *lb;         // a loopback rank (mok_comm_create_loopback), else NULL
};

// ---- loopback ranks: N ranks of one process on one device, without NCCL (tests) -------
// Their windows are plain device allocations (peers' bases: the same address space); the
// host collectives meet at a barrier of the ranks' threads (one thread a rank, as
// mokLocalRun runs them). Every step that can fail on one rank is agreed before the next
// collective, so no rank waits at a barrier another rank will not reach.
struct loopback {
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived, aborted; // under mu
  int timed_out;        // aborted because a rank did not arrive within wait_s: 1 at a host
                        // collective, 2 at the launch gate (under mu)
  int wait_s;           // the most a host barrier waits for the last rank
  unsigned gen;         // barriers completed (under mu)
  void *ptr[MOK_COMM_MAX_RANKS];
  const void *blob[MOK_COMM_MAX_RANKS];
  size_t bytes[MOK_COMM_MAX_RANKS];
  int ok[MOK_COMM_MAX_RANKS];
  unsigned long long queued[MOK_COMM_MAX_RANKS]; // kernels each rank queued that wait for peers (under mu)
  int refs; // ranks holding it (__atomic_*); the last to release frees it
};
int mok_lb_wait(struct loopback *lb);
void mok_lb_abort(struct loopback *lb);
void mok_lb_drop(struct loopback *lb);
int mok_lb_all_ok(struct loopback *lb, int rank, int ok);
// The launch gate (mok_comm_peer_kernel_queued): rank queued one more kernel that waits for
// its peers; returns once every rank has queued as many (0: aborted, or wait_s passed). Its
// own counters (queued), not mok_lb_wait's: a rank at the gate never pairs with a peer at a
// host collective.
int mok_lb_gate(struct loopback *lb, int rank);

// The part of the config every rank must agree on, without padding bytes.
typedef struct {
  uint64_t workspace_bytes;
  int64_t timeout_ms;
  int64_t nranks;
  int64_t version_major;
} agreed_config;

/* The comm's message and the thread's (mokGetLastError); returns st. */
mokResult_t mok_comm_error(mokComm_t c, mokResult_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
mokResult_t mok_comm_config_validate(const char *fn, const mokCommConfig_t *in, mokCommConfig_t *out);
/* The symmetric workspace: [mokCommCtrl | user_bytes]; collective. */
mokResult_t mok_comm_ws_create(mokComm_t c, const char *fn, size_t user_bytes);
/* Every rank passes the same blob (collective), else mokInvalidArgument naming what. */
mokResult_t mok_comm_agree(mokComm_t c, const char *fn, const void *blob, size_t bytes, const char *what);
/* Releases everything the comm holds (not the struct); keeps the first error. */
mokResult_t mok_comm_release(mokComm_t c, const char *fn);
/* A comm on the caller's NCCL communicator (owns: destroyed with it); collective. */
mokResult_t mok_comm_create_on(mokComm_t *comm, ncclComm_t nccl, const mokCommConfig_t *config, int owns);

// Inside functions with `mokResult_t st` and an `out:` label that restores state.
#define C_CUDA(call)                                                                        \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      st = mok_comm_error(c, e_ == cudaErrorMemoryAllocation ? mokOutOfMemory : mokCudaError, \
                          "%s: %s failed: %s (%s:%d)", fn, #call, cudaGetErrorString(e_),   \
                          __FILE__, __LINE__);                                              \
      goto out;                                                                             \
    }                                                                                       \
  } while (0)
#define C_NCCL(nc, call)                                                                    \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess) {                                                                \
      const char *l_ = (nc) ? ncclGetLastError(nc) : "";                                    \
      st = mok_comm_error(c, mokNcclError, "%s: %s failed: %s%s%s (%s:%d)", fn, #call,      \
                          ncclGetErrorString(r_), l_ && *l_ ? ": " : "", l_ ? l_ : "",      \
                          __FILE__, __LINE__);                                              \
      goto out;                                                                             \
    }                                                                                       \
  } while (0)
#define C_MOK(call)                             \
  do {                                          \
    st = (call);                                \
    if (st != mokSuccess) goto out;             \
  } while (0)

// Makes `device` current, remembering the caller's; restore with dev_leave.
static inline int dev_enter(int device) {
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  if (prev != device) cudaSetDevice(device);
  return prev;
}
static inline void dev_leave(int prev, int device) {
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
}

#endif /* MOK_COMM_HOST_H */
