/*
 * comm_local.cu — the communicator's one-process helpers: ranks as threads of one
 * process, one a GPU (mokLocalCommsCreate / Destroy, mokLocalRun), loopback ranks sharing
 * one GPU without NCCL (tests: mok_comm_create_loopback), and the multi-process entry
 * (mokGetUniqueId, mokCommInitRank). The comm itself: comm.cu (comm_host.h).
 */
#include "comm_host.h"
#include "kernels_load.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- one process, one thread per GPU -------------------------------------------------
typedef struct {
  int rank, n, device;
  ncclUniqueId id;
  const mokCommConfig_t *cfg;
  mokComm_t comm;       // out
  ncclComm_t nccl;      // out
  mokLocalFn_t fn;      // mokLocalRun
  void *arg;
  mokResult_t st;
  char msg[MOK_ERRMSG_LEN];
} local_job;

static void job_fail(local_job *j, mokResult_t st, const char *msg) {
  j->st = st;
  snprintf(j->msg, sizeof j->msg, "%s", msg);
}

static void *local_create_thread(void *p) {
  local_job *j = (local_job *)p;
  if (cudaSetDevice(j->device) != cudaSuccess) {
    job_fail(j, mokCudaError, "cudaSetDevice failed");
    return NULL;
  }
  ncclResult_t r = ncclCommInitRank(&j->nccl, j->n, j->id, j->rank);
  if (r != ncclSuccess) {
    char m[MOK_ERRMSG_LEN];
    snprintf(m, sizeof m, "ncclCommInitRank failed: %s", ncclGetErrorString(r));
    job_fail(j, mokNcclError, m);
    j->nccl = NULL;
    return NULL;
  }
  mokResult_t st = mok_comm_create_on(&j->comm, j->nccl, j->cfg, 1);
  if (st != mokSuccess) job_fail(j, st, mokGetLastError());
  return NULL;
}

static void *local_destroy_thread(void *p) {
  local_job *j = (local_job *)p;
  mokResult_t st = mokCommDestroy(j->comm);
  if (st != mokSuccess) job_fail(j, st, mokGetLastError());
  return NULL;
}

static void *local_run_thread(void *p) {
  local_job *j = (local_job *)p;
  if (cudaSetDevice(j->device) != cudaSuccess) {
    job_fail(j, mokCudaError, "cudaSetDevice failed");
    return NULL;
  }
  mok_clear_error();
  mokResult_t st = j->fn(j->comm, j->rank, j->arg);
  if (st != mokSuccess) job_fail(j, st, mokGetLastError());
  return NULL;
}

// Runs body on one thread per job; returns the first failure (rank order).
static mokResult_t run_threads(const char *fn, local_job *jobs, int n, void *(*body)(void *)) {
  pthread_t *th = (pthread_t *)calloc((size_t)n, sizeof *th);
  int *started = (int *)calloc((size_t)n, sizeof *started);
  mokResult_t st = mokSuccess;
  if (!th || !started) {
    free(th);
    free(started);
    return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  }
  for (int i = 0; i < n; i++) {
    jobs[i].st = mokSuccess;
    jobs[i].msg[0] = '\0';
    started[i] = pthread_create(&th[i], NULL, body, &jobs[i]) == 0;
    if (!started[i]) job_fail(&jobs[i], mokInternalError, "pthread_create failed");
  }
  for (int i = 0; i < n; i++)
    if (started[i]) pthread_join(th[i], NULL);
  for (int i = 0; i < n && st == mokSuccess; i++)
    if (jobs[i].st != mokSuccess)
      st = mok_error(NULL, jobs[i].st, "%s: rank %d (device %d): %s", fn, i, jobs[i].device, jobs[i].msg);
  free(th);
  free(started);
  return st;
}

// mokInvalidArgument (mokNotSupported where no device at all) unless CUDA device `device`
// exists; rank >= 0 names the rank that asked for it.
static mokResult_t device_exists(const char *fn, int device, int rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (device < count) return mokSuccess;
  char who[32] = "";
  if (rank >= 0) snprintf(who, sizeof who, " of rank %d", rank);
  return mok_error(NULL, count ? mokInvalidArgument : mokNotSupported,
                   "%s: device %d%s does not exist (%d CUDA device(s) visible)", fn, device, who, count);
}

extern "C" mokResult_t mokLocalCommsCreate(int ngpus, const int *devices, const mokCommConfig_t *config,
                                           mokComm_t *comms) {
  static const char fn[] = "mokLocalCommsCreate";
  mok_clear_error();
  if (ngpus < 1 || ngpus > MOK_COMM_MAX_RANKS)
    return mok_error(NULL, mokInvalidArgument, "%s: ngpus = %d: must be 1 .. %d", fn, ngpus, MOK_COMM_MAX_RANKS);
  if (!comms) return mok_error(NULL, mokInvalidArgument, "%s: comms is NULL", fn);
  if (devices)
    for (int i = 0; i < ngpus; i++) {
      if (devices[i] < 0)
        return mok_error(NULL, mokInvalidArgument, "%s: devices[%d] = %d is negative", fn, i, devices[i]);
      for (int k = 0; k < i; k++)
        if (devices[k] == devices[i])
          return mok_error(NULL, mokInvalidArgument, "%s: devices[%d] and devices[%d] are both %d: one rank per GPU",
                           fn, k, i, devices[i]);
    }
  mokCommConfig_t cfg;
  MOK_CHECK(mok_comm_config_validate(fn, config, &cfg));
  for (int i = 0; i < ngpus; i++) MOK_CHECK(device_exists(fn, devices ? devices[i] : i, i));
  local_job *jobs = (local_job *)calloc((size_t)ngpus, sizeof *jobs);
  if (!jobs) return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    free(jobs);
    return mok_error(NULL, mokNcclError, "%s: ncclGetUniqueId failed: %s", fn, ncclGetErrorString(r));
  }
  for (int i = 0; i < ngpus; i++) {
    jobs[i].rank = i;
    jobs[i].n = ngpus;
    jobs[i].device = devices ? devices[i] : i;
    jobs[i].id = id;
    jobs[i].cfg = &cfg;
  }
  mokResult_t st = run_threads(fn, jobs, ngpus, local_create_thread);
  if (st == mokSuccess) {
    for (int i = 0; i < ngpus; i++) comms[i] = jobs[i].comm;
  } else {
    // Partial failure: tear down locally without collectives (abort), so no rank hangs.
    char msg[MOK_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s", mokGetLastError());
    for (int i = 0; i < ngpus; i++) {
      if (jobs[i].comm) {
        mokComm_t c = jobs[i].comm;
        int prev = dev_enter(c->device);
        cudaDeviceSynchronize();
        if (c->nccl) ncclCommAbort(c->nccl);
        c->nccl = NULL;
        c->owns_nccl = 0;
        c->has_devcomm = 0;
        while (c->bufs) {
          struct symbuf *b = c->bufs;
          c->bufs = b->next;
          free(b);
        }
        if (c->ws_ptr) ncclMemFree(c->ws_ptr);
        c->ws_ptr = NULL;
        c->ws_win = NULL;
        mok_comm_release(c, fn);
        free(c);
        dev_leave(prev, jobs[i].device);
      } else if (jobs[i].nccl) {
        ncclCommAbort(jobs[i].nccl);
      }
    }
    mok_error(NULL, st, "%s", msg);
  }
  free(jobs);
  return st;
}

// A loopback rank's comm: mok_comm_create_on without NCCL (the same host state, config agreement
// and workspace). Collective over the group's ranks; on failure every rank fails.
static mokResult_t lb_create(mokComm_t *comm, struct loopback *lb, int rank, int device, const mokCommConfig_t *cfg) {
  static const char fn[] = "mok_comm_create_loopback";
  mokResult_t st = mokSuccess;
  int prev = dev_enter(device);
  mokComm_t c = (mokComm_t)calloc(1, sizeof *c);
  int ok = c != NULL;
  if (c) {
    c->rank = rank, c->nranks = lb->n, c->device = device, c->cfg = *cfg, c->lb = lb;
    __atomic_add_fetch(&lb->refs, 1, __ATOMIC_ACQ_REL);
    ok = cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking) == cudaSuccess &&
         cudaMallocHost((void **)&c->h_word, sizeof *c->h_word) == cudaSuccess &&
         cudaMalloc((void **)&c->d_scratch, sizeof(char *) * MOK_COMM_MAX_RANKS) == cudaSuccess;
    if (!ok) cudaGetLastError();
  }
  if (!mok_lb_all_ok(lb, rank, ok)) {
    st = mok_error(NULL, ok ? mokInternalError : mokOutOfMemory, "%s: rank %d: %s", fn, rank,
                   ok ? "another rank could not set up" : "could not set up its stream and buffers");
    goto out;
  }
  {
    agreed_config a;
    memset(&a, 0, sizeof a);
    a.workspace_bytes = cfg->workspace_bytes;
    a.timeout_ms = cfg->timeout_ms;
    a.nranks = lb->n;
    a.version_major = MOK_VERSION_MAJOR;
    C_MOK(mok_comm_agree(c, fn, &a, sizeof a, "mokCommConfig_t"));
  }
  C_MOK(mok_comm_ws_create(c, fn, cfg->workspace_bytes));
  {
    const cudaError_t e = cudaDeviceSynchronize();
    if (!mok_lb_all_ok(lb, rank, e == cudaSuccess)) {
      st = mok_comm_error(c, mokCudaError, "%s: rank %d: %s", fn, rank,
                          e == cudaSuccess ? "another rank's device failed" : cudaGetErrorString(e));
      goto out;
    }
  }
  *comm = c;
  dev_leave(prev, device);
  return mokSuccess;
out:
  if (c) {
    char msg[MOK_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s", mokGetLastError());
    mok_comm_release(c, fn);
    free(c);
    mok_error(NULL, st, "%s", msg);
  }
  dev_leave(prev, device);
  return st;
}

typedef struct {
  local_job job;
  struct loopback *lb;
} lb_job;

static void *local_loopback_thread(void *p) {
  lb_job *j = (lb_job *)p;
  if (cudaSetDevice(j->job.device) != cudaSuccess) {
    mok_lb_all_ok(j->lb, j->job.rank, 0); /* (lb_create's first meeting: the others fail there too) */
    job_fail(&j->job, mokCudaError, "cudaSetDevice failed");
    return NULL;
  }
  mokResult_t st = lb_create(&j->job.comm, j->lb, j->job.rank, j->job.device, j->job.cfg);
  if (st != mokSuccess) job_fail(&j->job, st, mokGetLastError());
  return NULL;
}

extern "C" mokResult_t mok_comm_create_loopback(int nranks, int device, const mokCommConfig_t *config,
                                                mokComm_t *comms) {
  static const char fn[] = "mok_comm_create_loopback";
  mok_clear_error();
  if (nranks < 1 || nranks > MOK_COMM_MAX_RANKS)
    return mok_error(NULL, mokInvalidArgument, "%s: nranks = %d: must be 1 .. %d", fn, nranks, MOK_COMM_MAX_RANKS);
  if (!comms) return mok_error(NULL, mokInvalidArgument, "%s: comms is NULL", fn);
  if (device < 0) return mok_error(NULL, mokInvalidArgument, "%s: device %d is negative", fn, device);
  mokCommConfig_t cfg;
  MOK_CHECK(mok_comm_config_validate(fn, config, &cfg));
  if (nranks > 1) { /* comm.h: one hardware queue runs the ranks' launches in issue order */
    const char *q = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (q && atoi(q) == 1)
      return mok_error(NULL, mokNotSupported,
                       "%s: %d ranks on one GPU under CUDA_DEVICE_MAX_CONNECTIONS=1: every stream shares one "
                       "hardware queue, where a CUDA graph replay queues a rank's waiting kernels ahead of a "
                       "peer's (its passes time out there); run loopback ranks with 8 or more queues",
                       fn, nranks);
  }
  MOK_CHECK(device_exists(fn, device, -1));
  // Ranks' kernels wait for each other's: every kernel loaded before any rank runs
  // (kernels_load.h: under lazy loading a first launch can wait for a waiting kernel).
  MOK_CHECK(mok_kernels_load(fn, device, 1, NULL));
  struct loopback *lb = (struct loopback *)calloc(1, sizeof *lb);
  lb_job *jobs = (lb_job *)calloc((size_t)nranks, sizeof *jobs);
  pthread_t *th = (pthread_t *)calloc((size_t)nranks, sizeof *th);
  if (!lb || !jobs || !th) {
    free(lb);
    free(jobs);
    free(th);
    return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  }
  lb->n = nranks;
  lb->wait_s = 2 + 3 * ((cfg.timeout_ms + 999) / 1000); /* (beyond a device wait's budget) */
  pthread_mutex_init(&lb->mu, NULL);
  pthread_cond_init(&lb->cv, NULL);
  __atomic_store_n(&lb->refs, 1, __ATOMIC_RELAXED); /* this function's, dropped below */
  for (int i = 0; i < nranks; i++) {
    jobs[i].job.rank = i, jobs[i].job.n = nranks, jobs[i].job.device = device, jobs[i].job.cfg = &cfg;
    jobs[i].lb = lb;
  }
  mokResult_t st = mokSuccess;
  int started = 0;
  for (; started < nranks; started++)
    if (pthread_create(&th[started], NULL, local_loopback_thread, &jobs[started]) != 0) break;
  if (started < nranks) { /* the started ranks would wait for the missing one: release them */
    st = mok_error(NULL, mokInternalError, "%s: pthread_create failed for rank %d", fn, started);
    mok_lb_abort(lb);
  }
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < started && st == mokSuccess; i++)
    if (jobs[i].job.st != mokSuccess)
      st = mok_error(NULL, jobs[i].job.st, "%s: rank %d (device %d): %s", fn, i, device, jobs[i].job.msg);
  for (int i = 0; i < nranks; i++) {
    if (st != mokSuccess && jobs[i].job.comm) { /* (aborted: some ranks made theirs) */
      mokComm_t c = jobs[i].job.comm;
      int prev = dev_enter(device);
      cudaDeviceSynchronize();
      mok_comm_release(c, fn); /* sym_free: no waiting in an aborted group */
      free(c);
      dev_leave(prev, device);
      jobs[i].job.comm = NULL;
    }
    comms[i] = jobs[i].job.comm;
  }
  if (st != mokSuccess) mok_lb_abort(lb);
  mok_lb_drop(lb);
  free(th);
  free(jobs);
  return st;
}

extern "C" mokResult_t mokLocalCommsDestroy(int ngpus, mokComm_t *comms) {
  static const char fn[] = "mokLocalCommsDestroy";
  mok_clear_error();
  if (ngpus < 0 || ngpus > MOK_COMM_MAX_RANKS)
    return mok_error(NULL, mokInvalidArgument, "%s: ngpus = %d: must be 0 .. %d", fn, ngpus, MOK_COMM_MAX_RANKS);
  if (ngpus > 0 && !comms) return mok_error(NULL, mokInvalidArgument, "%s: comms is NULL", fn);
  if (ngpus == 0) return mokSuccess;
  local_job *jobs = (local_job *)calloc((size_t)ngpus, sizeof *jobs);
  if (!jobs) return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  for (int i = 0; i < ngpus; i++) {
    jobs[i].rank = i;
    jobs[i].comm = comms[i];
    jobs[i].device = comms[i] ? comms[i]->device : -1;
  }
  mokResult_t st = run_threads(fn, jobs, ngpus, local_destroy_thread);
  for (int i = 0; i < ngpus; i++) comms[i] = NULL;
  free(jobs);
  return st;
}

static_assert(sizeof(mokUniqueId_t) == sizeof(ncclUniqueId), "mokUniqueId_t holds an ncclUniqueId");

extern "C" mokResult_t mokGetUniqueId(mokUniqueId_t *id) {
  static const char fn[] = "mokGetUniqueId";
  mok_clear_error();
  if (!id) return mok_error(NULL, mokInvalidArgument, "%s: id is NULL", fn);
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return mok_error(NULL, mokNcclError, "%s: ncclGetUniqueId failed: %s", fn, ncclGetErrorString(r));
  memcpy(id->internal, &u, sizeof u);
  return mokSuccess;
}

extern "C" mokResult_t mokCommInitRank(mokComm_t *comm, int num_ranks, const mokUniqueId_t *id, int rank, int device,
                                       const mokCommConfig_t *config) {
  static const char fn[] = "mokCommInitRank";
  mok_clear_error();
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  if (!id) return mok_error(NULL, mokInvalidArgument, "%s: id is NULL", fn);
  if (num_ranks < 1 || num_ranks > MOK_COMM_MAX_RANKS)
    return mok_error(NULL, mokInvalidArgument, "%s: num_ranks = %d: must be 1 .. %d", fn, num_ranks,
                     MOK_COMM_MAX_RANKS);
  if (rank < 0 || rank >= num_ranks)
    return mok_error(NULL, mokInvalidArgument, "%s: rank = %d: must be 0 .. %d", fn, rank, num_ranks - 1);
  if (device < 0) return mok_error(NULL, mokInvalidArgument, "%s: device = %d is negative", fn, device);
  mokCommConfig_t cfg;
  MOK_CHECK(mok_comm_config_validate(fn, config, &cfg));
  MOK_CHECK(device_exists(fn, device, -1));
  int prev = dev_enter(device);
  ncclUniqueId u;
  memcpy(&u, id->internal, sizeof u);
  ncclComm_t nccl = NULL;
  ncclResult_t r = ncclCommInitRank(&nccl, num_ranks, u, rank);
  mokResult_t st = mokSuccess;
  if (r != ncclSuccess) {
    st = mok_error(NULL, mokNcclError, "%s: rank %d of %d: ncclCommInitRank failed: %s", fn, rank, num_ranks,
                   ncclGetErrorString(r));
  } else if ((st = mok_comm_create_on(comm, nccl, &cfg, 1)) != mokSuccess) {
    ncclCommAbort(nccl);  // mok_comm_create_on failed on every rank alike; it left the NCCL comm to us
  }
  dev_leave(prev, device);
  return st;
}

extern "C" mokResult_t mokLocalRun(int ngpus, mokComm_t *comms, mokLocalFn_t fn_, void *arg) {
  static const char fn[] = "mokLocalRun";
  mok_clear_error();
  if (ngpus < 1 || ngpus > MOK_COMM_MAX_RANKS)
    return mok_error(NULL, mokInvalidArgument, "%s: ngpus = %d: must be 1 .. %d", fn, ngpus, MOK_COMM_MAX_RANKS);
  if (!comms) return mok_error(NULL, mokInvalidArgument, "%s: comms is NULL", fn);
  if (!fn_) return mok_error(NULL, mokInvalidArgument, "%s: fn is NULL", fn);
  for (int i = 0; i < ngpus; i++)
    if (!comms[i]) return mok_error(NULL, mokInvalidArgument, "%s: comms[%d] is NULL", fn, i);
  local_job *jobs = (local_job *)calloc((size_t)ngpus, sizeof *jobs);
  if (!jobs) return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  for (int i = 0; i < ngpus; i++) {
    jobs[i].rank = i;
    jobs[i].comm = comms[i];
    jobs[i].device = comms[i]->device;
    jobs[i].fn = fn_;
    jobs[i].arg = arg;
  }
  mokResult_t st = run_threads(fn, jobs, ngpus, local_run_thread);
  free(jobs);
  return st;
}
