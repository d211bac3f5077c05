/*
 * test_comm.cu — the multi-GPU runtime (src/comm.cu, src/comm_device.cuh).
 * CPU tests: host-side validation (NULL arguments, bad config fields): each call
 * returns its status and a message naming the argument, and writes nothing.
 * GPU tests (need 2+ GPUs; use every visible GPU, one thread each):
 *   distinct patterns pushed to and pulled from every peer, through the workspace and
 *   through mokCommMemAlloc buffers; 10,000 consecutive device barriers with no early
 *   release; collective agreement (equal, different bytes, different sizes); a planted
 *   device error reaching every rank; a rank that never arrives -> timeout on the
 *   others within the configured time, then a re-created communicator works; 100
 *   mokCommCreate/Destroy cycles with no device-memory growth; workspace growth.
 */
#include "comm.h"
#include "comm_device.cuh"
#include "comm_host.h"
#include "internal.h"
#include "kernels_load.h"
#include "test.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

#define MAX_GPUS 8

static int local_gpus(void) {
  int n = test_gpu_count();
  return n > MAX_GPUS ? MAX_GPUS : n;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- CPU: host validation ------------------------------------------------------------
MOK_TEST(comm_config_init) {
  CHECK_STATUS(mokCommConfigInit(NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "config") != NULL);
  mokCommConfig_t c;
  memset(&c, 0x5a, sizeof c);
  CHECK_OK(mokCommConfigInit(&c));
  CHECK(c.size == sizeof c && c.magic == MOK_COMM_CONFIG_MAGIC && c.version == MOK_VERSION_CODE);
  CHECK(c.timeout_ms == 0 && c.workspace_bytes == 0);
}

/* The loopback launch gate (comm.h, mok_comm_peer_kernel_queued), host only: 4 threads pass
 * it 200 times each with random pauses; no thread may leave its k-th gate before every
 * thread has entered its k-th (each thread's count is raised before it enters). Then one
 * thread stays away: the others' gate fails after wait_s and marks the group aborted for a
 * kernel not queued in time (timed_out 2), and a later gate fails at once. */
enum { kGateRanks = 4, kGateRounds = 200 };
typedef struct {
  struct loopback *lb;
  int rank, absent, bad, failed_at;
  int *entered; /* [kGateRanks], __atomic_* */
  uint32_t seed;
} gate_job;
static void *gate_thread(void *arg) {
  gate_job *j = (gate_job *)arg;
  j->failed_at = -1;
  if (j->absent) return NULL;
  for (int k = 1; k <= kGateRounds; k++) {
    j->seed = j->seed * 1664525u + 1013904223u;
    if ((j->seed >> 28) == 0) {
      struct timespec ts = {0, (long)(j->seed >> 12) % 200000};
      nanosleep(&ts, NULL);
    }
    __atomic_store_n(&j->entered[j->rank], k, __ATOMIC_RELEASE);
    if (!mok_lb_gate(j->lb, j->rank)) {
      j->failed_at = k;
      return NULL;
    }
    for (int q = 0; q < kGateRanks; q++)
      if (__atomic_load_n(&j->entered[q], __ATOMIC_ACQUIRE) < k) j->bad++;
  }
  return NULL;
}
static void gate_run(test_ctx *t, int absent, int wait_s, gate_job *jobs, struct loopback *lb) {
  int entered[kGateRanks] = {0};
  memset(lb, 0, sizeof *lb);
  lb->n = kGateRanks, lb->wait_s = wait_s;
  pthread_mutex_init(&lb->mu, NULL);
  pthread_cond_init(&lb->cv, NULL);
  pthread_t th[kGateRanks];
  for (int r = 0; r < kGateRanks; r++) {
    jobs[r] = (gate_job){lb, r, r == absent, 0, -1, entered, (uint32_t)test_seed() + 77u * (uint32_t)r};
    CHECK(pthread_create(&th[r], NULL, gate_thread, &jobs[r]) == 0);
  }
  for (int r = 0; r < kGateRanks; r++) pthread_join(th[r], NULL);
}
MOK_TEST(comm_loopback_gate_rounds) {
  struct loopback lb;
  gate_job jobs[kGateRanks];
  gate_run(t, -1, 30, jobs, &lb);
  for (int r = 0; r < kGateRanks; r++) {
    CHECK_MSG(jobs[r].failed_at < 0, "rank %d: gate %d failed", r, jobs[r].failed_at);
    CHECK_MSG(jobs[r].bad == 0, "rank %d left a gate %d times before every rank had entered it", r, jobs[r].bad);
    CHECK(lb.queued[r] == kGateRounds);
  }
  CHECK(!lb.aborted && !lb.timed_out);
  pthread_cond_destroy(&lb.cv), pthread_mutex_destroy(&lb.mu);
  const double t0 = now_s();
  gate_run(t, 2, 1, jobs, &lb); /* rank 2 never comes: the others fail their first gate */
  const double waited = now_s() - t0;
  for (int r = 0; r < kGateRanks; r++)
    if (r != 2) CHECK_MSG(jobs[r].failed_at == 1, "rank %d: failed at gate %d, want 1", r, jobs[r].failed_at);
  CHECK(lb.aborted && lb.timed_out == 2);
  CHECK_MSG(waited > 0.5 && waited < 10.0, "waited %.2f s (wait_s 1)", waited);
  CHECK(!mok_lb_gate(&lb, 0)); /* an aborted group: at once */
  pthread_cond_destroy(&lb.cv), pthread_mutex_destroy(&lb.mu);
}

MOK_TEST(comm_create_validation) {
  mokComm_t sentinel = (mokComm_t)0x1234, comm = sentinel;
  ncclComm_t fake = (ncclComm_t)0x1;  // never touched: validation comes first
  CHECK_STATUS(mokCommCreate(NULL, fake, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "comm is NULL") != NULL);
  CHECK_STATUS(mokCommCreate(&comm, NULL, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "nccl is NULL") != NULL && comm == sentinel);

  struct {
    const char *field;
    mokCommConfig_t cfg;
  } bad[5];
  for (int i = 0; i < 5; i++) {
    mokCommConfig_t c = MOK_COMM_CONFIG_INITIALIZER;
    bad[i].cfg = c;
  }
  bad[0].field = "config->size";
  bad[0].cfg.size = 8;
  bad[1].field = "config->magic";
  bad[1].cfg.magic = 0;
  bad[2].field = "config->version";
  bad[2].cfg.version = 990000;
  bad[3].field = "config->timeout_ms";
  bad[3].cfg.timeout_ms = -1;
  bad[4].field = "config->workspace_bytes";
  bad[4].cfg.workspace_bytes = ((size_t)1 << 40) + 1;
  for (int i = 0; i < 5; i++) {
    CHECK_STATUS(mokCommCreate(&comm, fake, &bad[i].cfg), mokInvalidArgument);
    CHECK_MSG(strstr(mokGetLastError(), bad[i].field) != NULL, "message '%s' does not name %s",
              mokGetLastError(), bad[i].field);
    CHECK(comm == sentinel);
  }
  mokCommConfig_t c = MOK_COMM_CONFIG_INITIALIZER;
  c.timeout_ms = 3600001;
  CHECK_STATUS(mokCommCreate(&comm, fake, &c), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "timeout_ms") != NULL && comm == sentinel);
}

MOK_TEST(comm_null_handles) {
  CHECK_OK(mokCommDestroy(NULL));
  int r = -7;
  CHECK_STATUS(mokCommRankInfo(NULL, &r, NULL, NULL), mokInvalidArgument);
  CHECK(r == -7 && strstr(mokGetLastError(), "comm is NULL") != NULL);
  mokResult_t s = (mokResult_t)77;
  CHECK_STATUS(mokCommGetAsyncError(NULL, &s), mokInvalidArgument);
  CHECK(s == (mokResult_t)77);
  ncclComm_t nc = (ncclComm_t)0x9;
  CHECK_STATUS(mokCommGetNccl(NULL, &nc), mokInvalidArgument);
  CHECK(nc == (ncclComm_t)0x9);
  CHECK(strcmp(mokCommGetLastError(NULL), "") == 0);
  int blob = 1;
  CHECK_STATUS(mokCommCheckAgreement(NULL, &blob, sizeof blob, "x"), mokInvalidArgument);
  void *p = (void *)0x77;
  CHECK_STATUS(mokCommMemAlloc(NULL, 64, &p), mokInvalidArgument);
  CHECK(p == (void *)0x77);
  CHECK_STATUS(mokCommMemFree(NULL, p), mokInvalidArgument);
  CHECK_STATUS(mokCommReserveWorkspace(NULL, 64), mokInvalidArgument);
  size_t b = 5;
  CHECK_STATUS(mokCommWorkspaceSize(NULL, &b), mokInvalidArgument);
  CHECK(b == 5);
  CHECK_STATUS(mok_comm_peer_kernel_queued(NULL, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "comm is NULL") != NULL);
}

static mokResult_t noop_fn(mokComm_t comm, int rank, void *arg) { return mokSuccess; }

MOK_TEST(comm_local_validation) {
  mokComm_t comms[2] = {(mokComm_t)0x1, (mokComm_t)0x2};
  CHECK_STATUS(mokLocalCommsCreate(0, NULL, NULL, comms), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "ngpus") != NULL);
  CHECK_STATUS(mokLocalCommsCreate(2, NULL, NULL, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "comms is NULL") != NULL);
  int dup[2] = {0, 0};
  CHECK_STATUS(mokLocalCommsCreate(2, dup, NULL, comms), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "devices[0] and devices[1]") != NULL);
  int neg[2] = {0, -1};
  CHECK_STATUS(mokLocalCommsCreate(2, neg, NULL, comms), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "devices[1]") != NULL);
  mokCommConfig_t c = MOK_COMM_CONFIG_INITIALIZER;
  c.magic = 1;
  CHECK_STATUS(mokLocalCommsCreate(2, NULL, &c, comms), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "config->magic") != NULL);
  int far[2] = {0, 1000};
  mokResult_t st = mokLocalCommsCreate(2, far, NULL, comms);
  CHECK(st == mokInvalidArgument || st == mokNotSupported);
  CHECK(strstr(mokGetLastError(), "does not exist") != NULL);
  CHECK(comms[0] == (mokComm_t)0x1 && comms[1] == (mokComm_t)0x2);

  CHECK_STATUS(mokLocalRun(0, comms, noop_fn, NULL), mokInvalidArgument);
  CHECK_STATUS(mokLocalRun(2, comms, NULL, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "fn is NULL") != NULL);
  mokComm_t holes[2] = {(mokComm_t)0x1, NULL};
  CHECK_STATUS(mokLocalRun(2, holes, noop_fn, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "comms[1]") != NULL);
  CHECK_OK(mokLocalCommsDestroy(0, NULL));
  CHECK_STATUS(mokLocalCommsDestroy(-1, comms), mokInvalidArgument);
}

MOK_TEST(comm_init_rank_validation) {
  mokUniqueId_t id;
  memset(&id, 0, sizeof id);
  mokComm_t c = (mokComm_t)0x1;
  CHECK_STATUS(mokGetUniqueId(NULL), mokInvalidArgument);
  CHECK_STATUS(mokCommInitRank(NULL, 1, &id, 0, 0, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "comm is NULL") != NULL);
  CHECK_STATUS(mokCommInitRank(&c, 1, NULL, 0, 0, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "id is NULL") != NULL);
  CHECK_STATUS(mokCommInitRank(&c, 0, &id, 0, 0, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "num_ranks = 0") != NULL);
  CHECK_STATUS(mokCommInitRank(&c, 73, &id, 0, 0, NULL), mokInvalidArgument);
  CHECK_STATUS(mokCommInitRank(&c, 2, &id, 2, 0, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "rank = 2") != NULL);
  CHECK_STATUS(mokCommInitRank(&c, 2, &id, -1, 0, NULL), mokInvalidArgument);
  CHECK_STATUS(mokCommInitRank(&c, 1, &id, 0, -3, NULL), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "device = -3") != NULL);
  mokCommConfig_t cc = MOK_COMM_CONFIG_INITIALIZER;
  cc.timeout_ms = -5;
  CHECK_STATUS(mokCommInitRank(&c, 1, &id, 0, 0, &cc), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "timeout_ms") != NULL);
  mokResult_t st = mokCommInitRank(&c, 1, &id, 0, 1000, NULL);
  CHECK(st == mokInvalidArgument || st == mokNotSupported);
  CHECK(strstr(mokGetLastError(), "does not exist") != NULL);
  CHECK(c == (mokComm_t)0x1);
}

typedef struct {
  int rank, n;
  mokUniqueId_t id;
  mokComm_t comm;
  mokResult_t st;
  char msg[MOK_ERRMSG_LEN];
} init_rank_job;

static void *init_rank_thread(void *p) {
  init_rank_job *j = (init_rank_job *)p;
  cudaSetDevice(0);  // the call must use its `device` argument and leave this one current
  j->st = mokCommInitRank(&j->comm, j->n, &j->id, j->rank, j->rank, NULL);
  snprintf(j->msg, sizeof j->msg, "%s", mokGetLastError());
  int cur = -1;
  cudaGetDevice(&cur);
  if (j->st == mokSuccess && cur != 0) {
    j->st = mokInternalError;
    snprintf(j->msg, sizeof j->msg, "current device %d after mokCommInitRank, not the caller's 0", cur);
  }
  return NULL;
}

static mokResult_t expect_no_async_error(mokComm_t comm, const char *step);

static mokResult_t init_rank_barriers(mokComm_t comm, int rank, void *arg) {
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) return mokCudaError;
  mokResult_t st = mok_comm_launch_barriers(comm, 4, 128, 100, 1, 7, s);
  if (cudaStreamSynchronize(s) != cudaSuccess && st == mokSuccess) st = mokCudaError;
  cudaStreamDestroy(s);
  return st == mokSuccess ? expect_no_async_error(comm, "agreement barriers") : st;
}

/* A comm per GPU made the way a process per GPU makes it (here a thread per GPU), then
 * used: its barrier kernel runs on the layer's ranks. */
MOK_GPU_TEST(comm_gpu_init_rank, 1) {
  int n = local_gpus();
  init_rank_job jobs[MAX_GPUS];
  pthread_t th[MAX_GPUS];
  memset(jobs, 0, sizeof jobs);
  mokUniqueId_t id;
  CHECK_OK(mokGetUniqueId(&id));
  for (int r = 0; r < n; r++) {
    jobs[r].rank = r;
    jobs[r].n = n;
    jobs[r].id = id;
    CHECK(pthread_create(&th[r], NULL, init_rank_thread, &jobs[r]) == 0);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  mokComm_t comms[MAX_GPUS];
  int ok = 1;
  for (int r = 0; r < n; r++) {
    comms[r] = jobs[r].comm;
    if (jobs[r].st != mokSuccess) ok = 0;
  }
  CHECK_MSG(ok, "rank 0: %s; rank %d: %s", jobs[0].msg, n - 1, jobs[n - 1].msg);
  for (int r = 0; r < n; r++) {
    int rank = -1, nranks = -1, dev = -1;
    CHECK_OK(mokCommRankInfo(comms[r], &rank, &nranks, &dev));
    CHECK(rank == r && nranks == n && dev == r);
  }
  mokResult_t st = mokLocalRun(n, comms, init_rank_barriers, NULL);
  CHECK_MSG(st == mokSuccess, "%s", mokGetLastError());
  CHECK_OK(mokLocalCommsDestroy(n, comms));  // destroys the NCCL comms they own
}

MOK_TEST(comm_errword_layout) {
  unsigned long long w = MOK_ERRWORD(MOK_DEVERR_TIMEOUT, MOK_WAIT_PEER, 71, 0xdeadbeefu);
  CHECK(w != 0);
  CHECK(MOK_ERRWORD_KIND(w) == MOK_DEVERR_TIMEOUT);
  CHECK(MOK_ERRWORD_WHAT(w) == MOK_WAIT_PEER);
  CHECK(MOK_ERRWORD_RANK(w) == 71);
  CHECK(MOK_ERRWORD_WHERE(w) == 0xdeadbeefu);
  CHECK(sizeof(mokCommCtrl) <= MOK_COMM_CTRL_BYTES);
  CHECK(offsetof(mokCommCtrl, grid_count) % 128 == 0 && offsetof(mokCommCtrl, arrive) % 128 == 0);
}

// ---- GPU helpers ---------------------------------------------------------------------
#define RUN_CHECK(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) return mok_error(NULL, mokInternalError, __VA_ARGS__); \
  } while (0)
#define RUN_CUDA(call)                                                                     \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      return mok_error(NULL, mokCudaError, "%s:%d: %s: %s", __FILE__, __LINE__, #call,     \
                       cudaGetErrorString(e_));                                            \
  } while (0)

static mokResult_t expect_no_async_error(mokComm_t comm, const char *step) {
  mokResult_t s;
  MOK_CHECK(mokCommGetAsyncError(comm, &s));
  RUN_CHECK(s == mokSuccess, "%s: unexpected async error %s: %s", step, mokGetErrorName(s), mokCommGetLastError(comm));
  return mokSuccess;
}

static __device__ __forceinline__ uint32_t pattern(uint32_t src, uint32_t dst, uint32_t i, uint32_t seed) {
  uint32_t h = seed ^ (src * 0x9e3779b9u) ^ (dst * 0x85ebca6bu) ^ (i * 0xc2b2ae35u);
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

// Workspace layout: region s (words [s*words, (s+1)*words)) of rank d is written by
// rank s with pattern(s, d, i). Push to every peer, barrier, check own regions
// (data that arrived), check every peer's regions through NVLink loads (pull), barrier.
__global__ void k_ws_patterns(mokCommDev c, size_t words, uint32_t seed, unsigned long long *bad) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nth = (size_t)gridDim.x * blockDim.x;
  for (int d = 0; d < c.nranks; d++) {
    uint32_t *dst = (uint32_t *)mok_peer_ptr(c, d, 0) + (size_t)c.rank * words;
    for (size_t i = tid; i < words; i += nth) dst[i] = pattern(c.rank, d, (uint32_t)i, seed);
  }
  if (!mok_barrier(c)) return;
  unsigned long long n = 0;
  for (int q = 0; q < c.nranks; q++)  // q = owner of the memory read
    for (int s = 0; s < c.nranks; s++) {
      const uint32_t *src = (const uint32_t *)mok_peer_ptr(c, q, 0) + (size_t)s * words;
      for (size_t i = tid; i < words; i += nth) n += src[i] != pattern(s, q, (uint32_t)i, seed);
    }
  if (n) atomicAdd(bad, n);
  mok_barrier(c);
}

struct peer_table {
  uint32_t *p[MOK_COMM_MAX_RANKS];
};

__global__ void k_buf_push(peer_table t, int rank, int nranks, size_t words, uint32_t seed) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (size_t)gridDim.x * blockDim.x;
  for (int d = 0; d < nranks; d++)
    for (size_t i = tid; i < words; i += nth) t.p[d][(size_t)rank * words + i] = pattern(rank, d, (uint32_t)i, seed);
}
__global__ void k_buf_check(peer_table t, int nranks, size_t words, uint32_t seed, unsigned long long *bad) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (size_t)gridDim.x * blockDim.x;
  unsigned long long n = 0;
  for (int q = 0; q < nranks; q++)
    for (int s = 0; s < nranks; s++)
      for (size_t i = tid; i < words; i += nth) n += t.p[q][(size_t)s * words + i] != pattern(s, q, (uint32_t)i, seed);
  if (n) atomicAdd(bad, n);
}

typedef struct {
  uint32_t seed;
} pattern_arg;

/* Where each rank's thread was, for a loopback run that fails: run_patterns and run_barriers
 * stamp their host steps (ms from steps_reset), and the loopback test prints every rank's
 * steps and control block (ctrl_print) when such a run fails. A step that took about the
 * timeout (2 s) is the one that waited. (Session 38 found the timeouts of sessions 36-37 this
 * way: every rank had launched, one rank's kernel had not started; comm.h, the rounds.) */
enum { kMaxSteps = 12 };
typedef struct {
  const char *what[kMaxSteps];
  double ms[kMaxSteps];
  int n;
} rank_steps;
static rank_steps g_steps[MAX_GPUS];
static double g_steps_t0;
static void steps_reset(void) {
  memset(g_steps, 0, sizeof g_steps);
  g_steps_t0 = 1e3 * now_s();
}
static void step(int rank, const char *what) {
  if (rank < 0 || rank >= MAX_GPUS || g_steps[rank].n >= kMaxSteps) return;
  rank_steps *r = &g_steps[rank];
  r->what[r->n] = what;
  r->ms[r->n] = 1e3 * now_s() - g_steps_t0;
  r->n++;
}
static void steps_print(int nranks, const char *run) {
  printf("      %s, each rank's host steps (ms from the start):\n", run);
  for (int r = 0; r < nranks && r < MAX_GPUS; r++) {
    printf("        rank %d:", r);
    for (int i = 0; i < g_steps[r].n; i++) printf(" %s %.1f", g_steps[r].what[i], g_steps[r].ms[i]);
    printf("\n");
  }
}

/* After a failed loopback run: every rank's control block (its barrier state), so a timeout
 * shows whose grid did not arrive (grid_count short of the grid) or whose leader did not
 * publish (epoch behind), beside the host steps above. */
static void ctrl_print(int nranks, mokComm_t *comms) {
  cudaDeviceSynchronize();
  for (int r = 0; r < nranks; r++) {
    mokCommDev cd;
    mokCommCtrl h;
    if (mok_comm_device_view(comms[r], &cd) != mokSuccess ||
        cudaMemcpy(&h, cd.peer_base[r], sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
      printf("        rank %d: control block not readable\n", r);
      continue;
    }
    printf("        rank %d: error %016llx grid_count %u grid_gen %u epoch %u arrive", r, h.error, h.grid_count,
           h.grid_gen, h.epoch);
    for (int q = 0; q < nranks; q++) printf(" %u", h.arrive[q][0]);
    printf("\n");
  }
}

static mokResult_t run_patterns(mokComm_t comm, int rank, void *argp) {
  pattern_arg *a = (pattern_arg *)argp;
  int nranks = 0, sms = 0, dev = 0;
  MOK_CHECK(mokCommRankInfo(comm, NULL, &nranks, &dev));
  RUN_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  mokCommDev cd;
  MOK_CHECK(mok_comm_device_view(comm, &cd));
  const size_t words = (cd.ws_bytes / 4 / (size_t)nranks) - 17;  // odd size: tails too
  unsigned long long *bad = NULL, hbad = 0;
  step(rank, "malloc");
  RUN_CUDA(cudaMalloc(&bad, sizeof *bad));
  step(rank, "memset");
  RUN_CUDA(cudaMemset(bad, 0, sizeof *bad));
  step(rank, "stream");
  cudaStream_t s;
  RUN_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // 1) workspace, inside one persistent kernel with device barriers
  int blocks = sms < 16 ? sms : 16;
  step(rank, "launch");
  for (int rep = 0; rep < 2; rep++) {
    k_ws_patterns<<<blocks, 512, 0, s>>>(cd, words, a->seed + (uint32_t)rep, bad);
    RUN_CUDA(cudaGetLastError());
    MOK_CHECK(mok_comm_peer_kernel_queued(comm, s)); /* (loopback ranks: rounds, comm.h) */
  }
  step(rank, "sync");
  RUN_CUDA(cudaStreamSynchronize(s));
  step(rank, "done");
  MOK_CHECK(expect_no_async_error(comm, "workspace patterns (one kernel, device barriers)"));
  RUN_CUDA(cudaMemcpy(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost));
  RUN_CHECK(hbad == 0, "workspace: %llu wrong words of %zu", hbad, 2 * words * (size_t)nranks * nranks);
  // 2) a user buffer in symmetric memory (mokCommMemAlloc), barriers as separate kernels
  const size_t bwords = ((size_t)3 << 20) / 4;  // 3 MiB per source rank: rounds up to 2 MiB multiples
  void *buf = NULL;
  MOK_CHECK(mokCommMemAlloc(comm, bwords * 4 * (size_t)nranks, &buf));
  peer_table t;
  memset(&t, 0, sizeof t);
  void *peers[MOK_COMM_MAX_RANKS];
  RUN_CHECK(mok_comm_find_symmetric(comm, buf, bwords * 4 * (size_t)nranks, peers) == 1, "buffer not found");
  RUN_CHECK(mok_comm_find_symmetric(comm, (char *)buf + 4096, 64, peers) == 1, "interior not found");
  RUN_CHECK(mok_comm_find_symmetric(comm, (char *)buf + 64, (size_t)1 << 30, peers) == 0, "overrun accepted");
  mok_comm_find_symmetric(comm, buf, 4, peers);
  for (int p = 0; p < nranks; p++) t.p[p] = (uint32_t *)peers[p];
  k_buf_push<<<blocks, 512, 0, s>>>(t, rank, nranks, bwords, a->seed ^ 0xabcdu);
  RUN_CUDA(cudaGetLastError());
  MOK_CHECK(mok_comm_launch_barriers(comm, 1, 128, 1, 0, 0, s));
  RUN_CUDA(cudaMemsetAsync(bad, 0, sizeof *bad, s));
  k_buf_check<<<blocks, 512, 0, s>>>(t, nranks, bwords, a->seed ^ 0xabcdu, bad);
  RUN_CUDA(cudaGetLastError());
  MOK_CHECK(mok_comm_launch_barriers(comm, 1, 128, 1, 0, 0, s));
  RUN_CUDA(cudaStreamSynchronize(s));
  MOK_CHECK(expect_no_async_error(comm, "symmetric buffer (push, barrier, check, barrier kernels)"));
  RUN_CUDA(cudaMemcpy(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost));
  RUN_CHECK(hbad == 0, "symmetric buffer: %llu wrong words", hbad);
  RUN_CHECK(mokCommMemFree(comm, (char *)buf + 16) == mokInvalidArgument, "freeing an interior pointer was accepted");
  MOK_CHECK(mokCommMemFree(comm, buf));
  MOK_CHECK(mokCommMemFree(comm, NULL));
  cudaStreamDestroy(s);
  cudaFree(bad);
  return mokSuccess;
}

MOK_GPU_TEST(comm_gpu_peer_patterns, 2) {
  int n = local_gpus();
  mokComm_t comms[MAX_GPUS];
  mokCommConfig_t cfg = MOK_COMM_CONFIG_INITIALIZER;
  cfg.workspace_bytes = (size_t)64 << 20;
  CHECK_OK(mokLocalCommsCreate(n, NULL, &cfg, comms));
  for (int r = 0; r < n; r++) {
    int rank, nranks, dev;
    size_t ws = 0;
    CHECK_OK(mokCommRankInfo(comms[r], &rank, &nranks, &dev));
    CHECK(rank == r && nranks == n && dev == r);
    CHECK_OK(mokCommWorkspaceSize(comms[r], &ws));
    CHECK(ws >= cfg.workspace_bytes);
  }
  pattern_arg a = {(uint32_t)test_seed()};
  mokResult_t st = mokLocalRun(n, comms, run_patterns, &a);
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_MSG(st == mokSuccess, "%s", msg);
}

// ---- barriers ------------------------------------------------------------------------
typedef struct {
  int blocks_big;
} barrier_arg;

static mokResult_t run_barriers(mokComm_t comm, int rank, void *argp) {
  int dev = 0, sms = 0;
  MOK_CHECK(mokCommRankInfo(comm, NULL, NULL, &dev));
  RUN_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  step(rank, "stream");
  cudaStream_t s;
  RUN_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  step(rank, "events");
  cudaEvent_t e0, e1;
  RUN_CUDA(cudaEventCreate(&e0));
  RUN_CUDA(cudaEventCreate(&e1));
  step(rank, "launch");
  // 5,000 barriers in one kernel on every SM, then 5 kernels x 1,000 on 8 CTAs (the
  // epochs continue across launches and grid sizes). The stamps run on from kernel to kernel:
  // a rank's check after barrier i accepts i + 1 (a peer already past it), which may come
  // from the peer's next kernel (session 33: 4 loopback ranks saw base 10000 there).
  RUN_CUDA(cudaEventRecord(e0, s));
  MOK_CHECK(mok_comm_launch_barriers(comm, sms, 256, 5000, 1, 0, s));
  for (int k = 0; k < 5; k++) MOK_CHECK(mok_comm_launch_barriers(comm, 8, 128, 1000, 1, 5000u + 1000u * (uint32_t)k, s));
  RUN_CUDA(cudaEventRecord(e1, s));
  step(rank, "sync");
  RUN_CUDA(cudaStreamSynchronize(s));
  step(rank, "done");
  float ms = 0;
  RUN_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  MOK_CHECK(expect_no_async_error(comm, "10,000 barriers"));
  if (rank == 0) printf("      10,000 barriers: %.1f ms (%.2f us each)\n", ms, ms * 1e3 / 10000);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  return mokSuccess;
}

MOK_GPU_TEST(comm_gpu_barrier_10000, 2) {
  int n = local_gpus();
  mokComm_t comms[MAX_GPUS];
  CHECK_OK(mokLocalCommsCreate(n, NULL, NULL, comms));
  mokResult_t st = mokLocalRun(n, comms, run_barriers, NULL);
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_MSG(st == mokSuccess, "%s", msg);
}

// ---- agreement ---------------------------------------------------------------------------
typedef struct {
  char msg[MAX_GPUS][MOK_ERRMSG_LEN];
  mokResult_t st[MAX_GPUS][3];
} agree_arg;

static mokResult_t run_agree(mokComm_t comm, int rank, void *argp) {
  agree_arg *a = (agree_arg *)argp;
  uint64_t same[5] = {1, 2, 3, 4, 5};
  a->st[rank][0] = mokCommCheckAgreement(comm, same, sizeof same, "same");
  uint64_t diff[5] = {1, 2, 3, rank == 1 ? 99u : 4u, 5};
  a->st[rank][1] = mokCommCheckAgreement(comm, diff, sizeof diff, "layer config");
  snprintf(a->msg[rank], sizeof a->msg[rank], "%s", mokGetLastError());
  a->st[rank][2] = mokCommCheckAgreement(comm, same, rank == 1 ? 32 : 40, "sized");
  return mokSuccess;
}

/* mok_comm_host_allgather: every rank gets every rank's 12 bytes in rank order, twice. */
static mokResult_t run_allgather(mokComm_t comm, int rank, void *argp) {
  int nranks = 0;
  MOK_CHECK(mokCommRankInfo(comm, NULL, &nranks, NULL));
  for (int rep = 0; rep < 2; rep++) {
    const int32_t mine[3] = {rank, 7 * rank + 1 + rep, -rank};
    int32_t all[3 * MAX_GPUS];
    memset(all, 0xff, sizeof all);
    MOK_CHECK(mok_comm_host_allgather(comm, mine, sizeof mine, all));
    for (int q = 0; q < nranks; q++)
      RUN_CHECK(all[3 * q] == q && all[3 * q + 1] == 7 * q + 1 + rep && all[3 * q + 2] == -q,
                "rank %d, repeat %d: rank %d's entry is {%d, %d, %d}", rank, rep, q, all[3 * q], all[3 * q + 1],
                all[3 * q + 2]);
  }
  return mokSuccess;
}

MOK_GPU_TEST(comm_gpu_agreement, 2) {
  int n = local_gpus();
  mokComm_t comms[MAX_GPUS];
  CHECK_OK(mokLocalCommsCreate(n, NULL, NULL, comms));
  agree_arg *a = (agree_arg *)calloc(1, sizeof *a);
  mokResult_t st = mokLocalRun(n, comms, run_agree, a);
  // the comms stay usable after validation errors
  mokResult_t st2 = mokLocalRun(n, comms, run_barriers, NULL);
  if (st2 == mokSuccess) st2 = mokLocalRun(n, comms, run_allgather, NULL);
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_OK(st);
  CHECK_OK(st2);
  for (int r = 0; r < n; r++) {
    CHECK_MSG(a->st[r][0] == mokSuccess, "rank %d: equal blobs gave %d", r, a->st[r][0]);
    CHECK_MSG(a->st[r][1] == mokInvalidArgument, "rank %d: different blobs gave %d", r, a->st[r][1]);
    CHECK_MSG(strstr(a->msg[r], "rank 1") && strstr(a->msg[r], "layer config") && strstr(a->msg[r], "byte 24"),
              "rank %d: message '%s'", r, a->msg[r]);
    CHECK_MSG(a->st[r][2] == mokInvalidArgument, "rank %d: different sizes gave %d", r, a->st[r][2]);
  }
  free(a);
}

// ---- device errors: planted, timeout, re-create --------------------------------------------
static mokResult_t run_plant(mokComm_t comm, int rank, void *argp) {
  pthread_barrier_t *b = (pthread_barrier_t *)argp;
  if (rank == 1)
    MOK_CHECK(mok_comm_launch_plant_error(comm, MOK_ERRWORD(MOK_DEVERR_INPUT, MOK_WAIT_TEST, 1, 42), 0));
  RUN_CUDA(cudaDeviceSynchronize());
  pthread_barrier_wait(b);
  mokResult_t s;
  MOK_CHECK(mokCommGetAsyncError(comm, &s));
  RUN_CHECK(s == mokDeviceError, "rank %d: got %s, expected mokDeviceError", rank, mokGetErrorName(s));
  const char *m = mokCommGetLastError(comm);
  RUN_CHECK(strstr(m, "rank 1") && strstr(m, "42"), "rank %d: message '%s'", rank, m);
  RUN_CHECK(mokCommReserveWorkspace(comm, (size_t)1 << 30) == mokInvalidUsage, "reserve after an error accepted");
  return mokSuccess;
}

MOK_GPU_TEST(comm_gpu_planted_error, 2) {
  int n = local_gpus();
  mokComm_t comms[MAX_GPUS];
  CHECK_OK(mokLocalCommsCreate(n, NULL, NULL, comms));
  pthread_barrier_t b;
  pthread_barrier_init(&b, NULL, (unsigned)n);
  mokResult_t st = mokLocalRun(n, comms, run_plant, &b);
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  pthread_barrier_destroy(&b);
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_MSG(st == mokSuccess, "%s", msg);
}

typedef struct {
  pthread_barrier_t b;
  double elapsed_s;
  int timeout_ms;
} timeout_arg;

static mokResult_t run_absent(mokComm_t comm, int rank, void *argp) {
  timeout_arg *a = (timeout_arg *)argp;
  if (rank != 1) {  // rank 1 never arrives
    double t0 = now_s();
    MOK_CHECK(mok_comm_launch_barriers(comm, 4, 128, 1, 0, 0, 0));
    RUN_CUDA(cudaDeviceSynchronize());
    if (rank == 0) a->elapsed_s = now_s() - t0;
  }
  pthread_barrier_wait(&a->b);
  mokResult_t s;
  MOK_CHECK(mokCommGetAsyncError(comm, &s));
  RUN_CHECK(s == mokTimeout, "rank %d: got %s, expected mokTimeout (%s)", rank, mokGetErrorName(s),
            mokCommGetLastError(comm));
  const char *m = mokCommGetLastError(comm);
  RUN_CHECK(strstr(m, "timed out") && strstr(m, "barrier"), "rank %d: message '%s'", rank, m);
  if (rank == 0) RUN_CHECK(strstr(m, "rank 1"), "rank 0: message does not name the absent rank: '%s'", m);
  if (rank == 0) printf("      rank 0: %s\n", m);
  return mokSuccess;
}

MOK_GPU_TEST(comm_gpu_timeout_recreate, 2) {
  int n = local_gpus();
  mokComm_t comms[MAX_GPUS];
  mokCommConfig_t cfg = MOK_COMM_CONFIG_INITIALIZER;
  cfg.timeout_ms = 300;
  CHECK_OK(mokLocalCommsCreate(n, NULL, &cfg, comms));
  timeout_arg a;
  memset(&a, 0, sizeof a);
  a.timeout_ms = cfg.timeout_ms;
  pthread_barrier_init(&a.b, NULL, (unsigned)n);
  mokResult_t st = mokLocalRun(n, comms, run_absent, &a);
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  pthread_barrier_destroy(&a.b);
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_MSG(st == mokSuccess, "%s", msg);
  printf("      timeout %d ms, rank 0 returned after %.3f s\n", cfg.timeout_ms, a.elapsed_s);
  CHECK_MSG(a.elapsed_s >= 0.9 * cfg.timeout_ms * 1e-3 && a.elapsed_s < cfg.timeout_ms * 1e-3 + 2.0,
            "rank 0 returned after %.3f s with a %d ms timeout", a.elapsed_s, cfg.timeout_ms);
  // a re-created communicator works
  CHECK_OK(mokLocalCommsCreate(n, NULL, &cfg, comms));
  st = mokLocalRun(n, comms, run_barriers, NULL);
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_MSG(st == mokSuccess, "after re-create: %s", msg);
}

// ---- create/destroy cycles -----------------------------------------------------------------
typedef struct {
  size_t free_at[MAX_GPUS][3];
  int cycles;
} cycle_arg;

static mokResult_t run_cycles(mokComm_t comm, int rank, void *argp) {
  cycle_arg *a = (cycle_arg *)argp;
  ncclComm_t nc;
  MOK_CHECK(mokCommGetNccl(comm, &nc));
  mokCommConfig_t cfg = MOK_COMM_CONFIG_INITIALIZER;
  cfg.workspace_bytes = (size_t)32 << 20;  // a leak of it would show at once
  size_t fr, tot;
  for (int i = 0; i < a->cycles; i++) {
    if (i == 0) RUN_CUDA(cudaMemGetInfo(&a->free_at[rank][0], &tot));
    if (i == 10) RUN_CUDA(cudaMemGetInfo(&a->free_at[rank][1], &tot));
    mokComm_t c2 = NULL;
    MOK_CHECK(mokCommCreate(&c2, nc, &cfg));
    void *buf = NULL;
    if (i % 10 == 0) MOK_CHECK(mokCommMemAlloc(c2, (size_t)4 << 20, &buf));  // freed by destroy
    if (i % 25 == 0) MOK_CHECK(mok_comm_launch_barriers(c2, 2, 128, 10, 1, 0, 0));
    MOK_CHECK(mokCommDestroy(c2));
  }
  RUN_CUDA(cudaMemGetInfo(&fr, &tot));
  a->free_at[rank][2] = fr;
  return mokSuccess;
}

MOK_GPU_TEST(comm_gpu_create_destroy_100, 2) {
  int n = local_gpus();
  mokComm_t comms[MAX_GPUS];
  CHECK_OK(mokLocalCommsCreate(n, NULL, NULL, comms));
  cycle_arg a;
  memset(&a, 0, sizeof a);
  a.cycles = 100;
  double t0 = now_s();
  mokResult_t st = mokLocalRun(n, comms, run_cycles, &a);
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_MSG(st == mokSuccess, "%s", msg);
  for (int r = 0; r < n; r++) {
    long long d10 = (long long)a.free_at[r][1] - (long long)a.free_at[r][2];
    long long d0 = (long long)a.free_at[r][0] - (long long)a.free_at[r][2];
    printf("      rank %d: device memory used after 100 cycles vs cycle 10: %+.2f MiB (vs cycle 0: %+.2f MiB), %.1f s\n",
           r, d10 / 1048576.0, d0 / 1048576.0, now_s() - t0);
    // 90 cycles of a 32 MiB workspace + 9 x 4 MiB buffers: any per-cycle leak of them is far above 4 MiB
    CHECK_MSG(d10 <= (4ll << 20), "rank %d: %.2f MiB more device memory in use after cycles 10..100", r,
              d10 / 1048576.0);
  }
}

// ---- workspace growth ------------------------------------------------------------------
static mokResult_t run_grow(mokComm_t comm, int rank, void *argp) {
  size_t ws = 0;
  MOK_CHECK(mokCommReserveWorkspace(comm, 1000));  // smaller: no-op
  MOK_CHECK(mokCommWorkspaceSize(comm, &ws));
  RUN_CHECK(ws == MOK_COMM_DEFAULT_WORKSPACE, "workspace %zu after a smaller reserve", ws);
  MOK_CHECK(mok_comm_launch_barriers(comm, 4, 128, 100, 1, 0, 0));
  RUN_CUDA(cudaDeviceSynchronize());
  MOK_CHECK(mokCommReserveWorkspace(comm, (size_t)48 << 20));
  MOK_CHECK(mokCommWorkspaceSize(comm, &ws));
  RUN_CHECK(ws == ((size_t)48 << 20), "workspace %zu after reserving 48 MiB", ws);
  MOK_CHECK(mok_comm_launch_barriers(comm, 4, 128, 100, 1, 0, 0));
  RUN_CUDA(cudaDeviceSynchronize());
  MOK_CHECK(expect_no_async_error(comm, "barriers after reserving the workspace"));
  pattern_arg pa = {7u};
  return run_patterns(comm, rank, &pa);
}

MOK_GPU_TEST(comm_gpu_reserve_workspace, 2) {
  int n = local_gpus();
  mokComm_t comms[MAX_GPUS];
  CHECK_OK(mokLocalCommsCreate(n, NULL, NULL, comms));
  mokResult_t st = mokLocalRun(n, comms, run_grow, NULL);
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  CHECK_OK(mokLocalCommsDestroy(n, comms));
  CHECK_MSG(st == mokSuccess, "%s", msg);
}

// ---- loopback ranks: several ranks on one GPU, without NCCL (comm.h) --------------------
// The device-side pieces the 2-GPU tests above check (workspace and symmetric buffers
// through peer bases, 10,000 bounded barriers, agreement with its messages) on 2 and 4
// loopback ranks of one GPU; what needs NCCL is refused. A machine that does not run the
// ranks' kernels at once fails here by the barriers' timeout (2 s), not by a hang.
/* A loopback rank that never reaches a host collective: its peer's wait ends (2 + 3 x the
 * timeout's seconds: 5 s here) with an error naming the cause, instead of hanging; the
 * comms can still be destroyed. */
static mokResult_t run_lb_absent(mokComm_t comm, int rank, void *argp) {
  if (rank == 1) return mokSuccess; /* (never arrives) */
  const int32_t mine[1] = {rank};
  int32_t all[2];
  mokResult_t st = mok_comm_host_allgather(comm, mine, sizeof mine, all);
  snprintf((char *)argp, MOK_ERRMSG_LEN, "%s", mokGetLastError());
  return st == mokInternalError ? mokSuccess : mokInternalError;
}

MOK_GPU_TEST(comm_loopback_absent_rank_times_out, 1) {
  SKIP_LOOPBACK_ON_ONE_QUEUE();
  mokComm_t comms[2];
  mokCommConfig_t cfg = MOK_COMM_CONFIG_INITIALIZER;
  cfg.timeout_ms = 1000;
  CHECK_OK(mok_comm_create_loopback(2, 0, &cfg, comms));
  if (t->failed) return;
  char msg[MOK_ERRMSG_LEN] = "";
  const double t0 = now_s();
  const mokResult_t st = mokLocalRun(2, comms, run_lb_absent, msg);
  const double waited = now_s() - t0;
  CHECK_OK(mokLocalCommsDestroy(2, comms));
  CHECK_MSG(st == mokSuccess, "the waiting rank did not get mokInternalError: %s", msg);
  CHECK_MSG(strstr(msg, "did not reach a host collective in time") != NULL, "message: %s", msg);
  CHECK_MSG(waited > 4.0 && waited < 30.0, "waited %.1f s (want about 5)", waited);
}

/* Under CUDA's lazy loading (the default since CUDA 12.2; mok_tests itself loads eagerly:
 * test_main.c) creating a loopback group loads every mok kernel first, so that no rank's
 * first launch waits for a peer's waiting kernel (kernels_load.h). Checked in a child
 * mok_tests run with CUDA_MODULE_LOADING=LAZY (and no CUDA_MODULE_DATA_LOADING, as a user's
 * process has it): that mok's modules start with unloaded functions (else the test proves
 * nothing), that none is left unloaded after mok_comm_create_loopback, and then the
 * megakernel layer over 2 loopback ranks against the reference (the test that timed out
 * under lazy loading in session 33). */
MOK_GPU_TEST(comm_loopback_loads_kernels_under_lazy_loading, 1) {
  SKIP_LOOPBACK_ON_ONE_QUEUE(); /* (the child inherits the variable) */
  if (getenv("MOK_TEST_LAZY_CHILD")) { /* the child */
    mokKernelsLoadInfo before, after;
    CHECK_OK(mok_kernels_load("test", 0, 0, &before));
    CHECK_MSG(before.lazy == 1, "the child does not load lazily (CUDA_MODULE_LOADING=%s)",
              getenv("CUDA_MODULE_LOADING") ? getenv("CUDA_MODULE_LOADING") : "(unset)");
    CHECK_MSG(before.modules == 8 && before.functions > 20 && before.unloaded > 0,
              "before: %d modules, %d functions, %d unloaded", before.modules, before.functions, before.unloaded);
    mokComm_t c[2] = {NULL, NULL};
    CHECK_OK(mok_comm_create_loopback(2, 0, NULL, c));
    CHECK_OK(mok_kernels_load("test", 0, 0, &after));
    CHECK_OK(mokLocalCommsDestroy(2, c));
    CHECK_MSG(after.unloaded == 0 && after.functions == before.functions,
              "after mok_comm_create_loopback: %d of %d functions unloaded", after.unloaded, after.functions);
    printf("child: %d modules, %d functions, %d unloaded before, 0 after\n", before.modules, before.functions,
           before.unloaded);
    return;
  }
  char rep[4096];
  int passed = 0;
  const int rc = test_run_child("-u CUDA_MODULE_DATA_LOADING CUDA_MODULE_LOADING=LAZY MOK_TEST_LAZY_CHILD=1",
                                "comm_loopback_loads_kernels_under_lazy_loading layer_mega_matches_reference_loopback",
                                240, &passed, rep, sizeof rep);
  if (rc < 0) SKIP("%s", rep);
  CHECK_MSG(rc == 0 && passed == 2, "the child under lazy loading (status %d, %d of 2 passed): %s", rc, passed, rep);
}

/* Under CUDA_DEVICE_MAX_CONNECTIONS=1 more than one loopback rank is refused before any CUDA
 * call (mokNotSupported, a message naming the variable; comms untouched), one rank is not
 * (that check only; without a GPU the call fails later). The variable is restored. */
MOK_TEST(comm_loopback_refuses_one_hardware_queue) {
  test_env_saved saved;
  test_env_set("CUDA_DEVICE_MAX_CONNECTIONS", "1", &saved);
  mokComm_t c[4] = {(mokComm_t)&c[0], (mokComm_t)&c[1], (mokComm_t)&c[2], (mokComm_t)&c[3]};
  const mokResult_t st2 = mok_comm_create_loopback(2, 0, NULL, c);
  char msg2[MOK_ERRMSG_LEN];
  snprintf(msg2, sizeof msg2, "%s", mokGetLastError());
  const mokResult_t st4 = mok_comm_create_loopback(4, 0, NULL, c);
  int untouched = 1;
  for (int i = 0; i < 4; i++) untouched &= c[i] == (mokComm_t)&c[i];
  const mokResult_t st1 = mok_comm_create_loopback(1, 0, NULL, c);
  char msg1[MOK_ERRMSG_LEN];
  snprintf(msg1, sizeof msg1, "%s", mokGetLastError());
  if (st1 == mokSuccess) mokLocalCommsDestroy(1, c);
  test_env_restore("CUDA_DEVICE_MAX_CONNECTIONS", &saved);
  CHECK_MSG(st2 == mokNotSupported && strstr(msg2, "CUDA_DEVICE_MAX_CONNECTIONS=1") && strstr(msg2, "2 ranks"),
            "2 ranks: status %d, '%s'", (int)st2, msg2);
  CHECK_MSG(st4 == mokNotSupported, "4 ranks: status %d", (int)st4);
  CHECK_MSG(untouched, "a refused call wrote comms");
  CHECK_MSG(!strstr(msg1, "CUDA_DEVICE_MAX_CONNECTIONS"), "one rank refused for the queues: '%s'", msg1);
}

MOK_GPU_TEST(comm_loopback_ranks_1gpu, 1) {
  SKIP_LOOPBACK_ON_ONE_QUEUE();
  for (int n = 2; n <= 4 && !t->failed; n += 2) {
    mokComm_t comms[MAX_GPUS];
    mokCommConfig_t cfg = MOK_COMM_CONFIG_INITIALIZER;
    cfg.workspace_bytes = (size_t)16 << 20;
    cfg.timeout_ms = 2000;
    CHECK_OK(mok_comm_create_loopback(n, 0, &cfg, comms));
    if (t->failed) return;
    // the ranks' kernels wait for each other: load them before they run (comm.h)
    const void *kern[] = {(const void *)k_ws_patterns, (const void *)k_buf_push, (const void *)k_buf_check};
    for (int k = 0; k < 3; k++) {
      cudaFuncAttributes fa;
      const cudaError_t e = cudaFuncGetAttributes(&fa, kern[k]);
      CHECK_MSG(e == cudaSuccess, "loading test kernel %d: %s", k, cudaGetErrorString(e));
    }
    for (int r = 0; r < n; r++) {
      int rank = -1, nranks = 0, dev = -1;
      CHECK_OK(mokCommRankInfo(comms[r], &rank, &nranks, &dev));
      CHECK(rank == r && nranks == n && dev == 0);
      mokCommDev cd;
      CHECK_OK(mok_comm_device_view(comms[r], &cd));
      for (int q = 0; q < n; q++) {
        mokCommDev cq;
        CHECK_OK(mok_comm_device_view(comms[q], &cq));
        CHECK_MSG(cd.peer_base[q] == cq.peer_base[q], "rank %d sees rank %d's window at another address", r, q);
        if (q != r) CHECK(cd.peer_base[q] != cd.peer_base[r]);
      }
    }
    ncclComm_t nc = NULL;
    CHECK_STATUS(mokCommGetNccl(comms[0], &nc), mokNotSupported);
    CHECK(strstr(mokGetLastError(), "loopback") != NULL);
    pattern_arg a = {(uint32_t)test_seed()};
    steps_reset();
    const mokResult_t st1 = mokLocalRun(n, comms, run_patterns, &a);
    char msg1[MOK_ERRMSG_LEN];
    snprintf(msg1, sizeof msg1, "%s", mokGetLastError());
    if (st1 != mokSuccess) steps_print(n, "patterns failed"), ctrl_print(n, comms);
    steps_reset();
    const mokResult_t st2 = st1 == mokSuccess ? mokLocalRun(n, comms, run_barriers, NULL) : st1;
    char msg2[MOK_ERRMSG_LEN];
    snprintf(msg2, sizeof msg2, "%s", mokGetLastError());
    if (st1 == mokSuccess && st2 != mokSuccess) steps_print(n, "barriers failed"), ctrl_print(n, comms);
    agree_arg *g = (agree_arg *)calloc(1, sizeof *g);
    const mokResult_t st3 = mokLocalRun(n, comms, run_agree, g);
    const mokResult_t st4 = mokLocalRun(n, comms, run_allgather, NULL);
    CHECK_MSG(st4 == mokSuccess, "%d loopback ranks, host allgather: %s", n, mokGetLastError());
    CHECK(mok_comm_is_loopback(comms[0]) && mok_comm_device_share(comms[0]) == n);
    CHECK_OK(mokLocalCommsDestroy(n, comms));
    CHECK_MSG(st1 == mokSuccess, "%d loopback ranks, patterns: %s", n, msg1);
    CHECK_MSG(st2 == mokSuccess, "%d loopback ranks, barriers: %s", n, msg2);
    CHECK_OK(st3);
    for (int r = 0; r < n; r++) {
      CHECK_MSG(g->st[r][0] == mokSuccess, "rank %d: equal blobs gave %d", r, g->st[r][0]);
      CHECK_MSG(g->st[r][1] == mokInvalidArgument && strstr(g->msg[r], "rank 1") && strstr(g->msg[r], "byte 24"),
                "rank %d: different blobs gave %d, '%s'", r, g->st[r][1], g->msg[r]);
      CHECK_MSG(g->st[r][2] == mokInvalidArgument, "rank %d: different sizes gave %d", r, g->st[r][2]);
    }
    free(g);
  }
  mokComm_t c[2];
  CHECK_STATUS(mok_comm_create_loopback(0, 0, NULL, c), mokInvalidArgument);
  CHECK_STATUS(mok_comm_create_loopback(2, -1, NULL, c), mokInvalidArgument);
  CHECK_STATUS(mok_comm_create_loopback(2, 0, NULL, NULL), mokInvalidArgument);
}
