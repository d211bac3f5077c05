/*
 * probe-hostcalls.cu — which host calls of one thread wait for another thread's running
 * kernel on the same GPU (the loopback ranks' hazard: docs/PERF.md, "Session 37, continued").
 *
 * For each candidate call: the main thread launches a one-CTA kernel on a non-blocking stream
 * of its own that spins until a flag in mapped host memory is set (or SPIN_MS passes); once it
 * runs, a second thread makes the call and times it, and the main thread sets the flag at
 * SPIN_MS / 2. A call that takes about SPIN_MS / 2 waited for the spinning kernel (so, between
 * loopback ranks, it would wait for a peer's kernel that waits for this rank: a hang until the
 * timeout); one that takes microseconds did not. Then, with the spinner running and an empty
 * kernel queued behind it on its stream, the main thread makes NSTREAMS fresh streams and
 * launches an empty kernel on each in turn: one that does not finish within 5 ms is stuck
 * behind the queued kernel (shares its hardware queue); the same again with those streams,
 * already used. Last, the loopback ranks' pattern without the library: 4 threads, a stream
 * each, two kernels each that meet the other threads' kernel of the same round (500 ms
 * timeout), 30 trials a setting: 1 CTA x 32 or 16 CTAs x 512, launched as they come, after
 * a host barrier, or in rounds (a thread queues its round-r kernel once every thread has
 * queued its round r-1 one: comm.h, mok_comm_peer_kernel_queued).
 * Session 38 (one H100, bench/results/probe-hostcalls-h100-2026-12-06-s38*.log): cudaFree,
 * cudaMalloc + cudaFree 64 MB, cudaMallocHost + cudaFreeHost wait for the spinner; stream,
 * event and 8 B / 256 MB cudaMalloc calls do not; no fresh or used stream was stuck under 32,
 * 8 or 2 queues (33 of 40 under 1); the meeting kernels timed out in 10-22 of 30 trials after
 * a host barrier, 0-3 of 30 as they come, 0 of 240 in rounds. PROBE_SKIP_CALLS=1 skips the
 * host-call timings.
 * No library code: the CUDA runtime alone.
 *
 * Build and run (a GPU machine; CUDA_DEVICE_MAX_CONNECTIONS as the run wants):
 *   nvcc -O2 -arch=sm_90a -o build/probe-hostcalls scripts/probe-hostcalls.cu -lpthread
 *   CUDA_DEVICE_MAX_CONNECTIONS=32 build/probe-hostcalls [SPIN_MS [NSTREAMS [SPIN_CTAS]]]
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(call)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

__global__ void k_spin(volatile int *flag, unsigned long long ns, volatile int *started) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *started = 1;
    __threadfence_system();
  }
  if (threadIdx.x == 0) /* one poller a CTA; the others hold the CTA's place at the barrier */
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (!*flag && t - t0 < ns);
  __syncthreads();
}
__global__ void k_empty() {}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

typedef struct {
  const char *name;
  int which;
  double ms;
} job;

static int g_spin_ms = 1000;
static void *keep_ptr = NULL;

/* The candidate calls, each made by thread B while the spinner runs. */
static void call(int which) {
  static cudaStream_t s;
  static cudaEvent_t ev;
  void *p = NULL;
  switch (which) {
    case 0: CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); break;
    case 1: { /* a fresh stream's first launch, and waiting for it */
      cudaStream_t f;
      CK(cudaStreamCreateWithFlags(&f, cudaStreamNonBlocking));
      k_empty<<<1, 32, 0, f>>>();
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(f));
      CK(cudaStreamDestroy(f));
      break;
    }
    case 2: CK(cudaEventCreate(&ev)); break;
    case 3: CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)); break;
    case 4: CK(cudaMalloc(&p, 8)); keep_ptr = p; break;
    case 5: CK(cudaMalloc(&p, (size_t)64 << 20)); CK(cudaFree(p)); break;
    case 6: CK(cudaMalloc(&p, (size_t)256 << 20)); keep_ptr = p; break;
    case 7: CK(cudaMemset(keep_ptr, 0, 8)); break;
    case 8: CK(cudaMallocHost(&p, 4096)); CK(cudaFreeHost(p)); break;
    case 9: CK(cudaFree(keep_ptr)); keep_ptr = NULL; break;
    case 10: { cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, (const void *)k_empty)); break; }
    case 11: CK(cudaStreamDestroy(s)); break;
    case 12: { /* an existing stream's (case 0's) first launch */
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      k_empty<<<1, 32, 0, s>>>();
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(s));
      break;
    }
    case 13: CK(cudaMemcpy(&p, &keep_ptr, sizeof p, cudaMemcpyHostToHost)); break;
    case 14: { /* an event recorded on a fresh stream, and waited for */
      cudaStream_t f;
      cudaEvent_t e;
      CK(cudaStreamCreateWithFlags(&f, cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      CK(cudaEventRecord(e, f));
      CK(cudaEventSynchronize(e));
      CK(cudaEventDestroy(e));
      CK(cudaStreamDestroy(f));
      break;
    }
    case 15: CK(cudaDeviceSynchronize()); break; /* a control: must wait */
  }
}
static const char *kNames[] = {"cudaStreamCreateWithFlags",
                               "new stream: first launch + its sync",
                               "cudaEventCreate",
                               "cudaEventCreateWithFlags(DisableTiming)",
                               "cudaMalloc 8 B",
                               "cudaMalloc + cudaFree 64 MB",
                               "cudaMalloc 256 MB",
                               "cudaMemset 8 B (legacy stream)",
                               "cudaMallocHost + cudaFreeHost 4 KB",
                               "cudaFree (the 256 MB)",
                               "cudaFuncGetAttributes",
                               "cudaStreamDestroy",
                               "stream made, then first launch + sync",
                               "cudaMemcpy host to host",
                               "fresh stream: event record + sync",
                               "cudaDeviceSynchronize (control: waits)"};
enum { kCalls = sizeof kNames / sizeof kNames[0] };

static void *thread_b(void *arg) {
  job *j = (job *)arg;
  CK(cudaSetDevice(0));
  const double t0 = now_ms();
  call(j->which);
  j->ms = now_ms() - t0;
  return NULL;
}

/* The spinner on stream a: returns once it runs. hflag / hstarted: the host's view of the
 * mapped words, dflag / dstarted the kernel's. */
static volatile int *hflag, *hstarted, *dflag, *dstarted;
static int g_spin_ctas = 1;
static void spinner_start(cudaStream_t a) {
  *hflag = 0;
  *hstarted = 0;
  k_spin<<<g_spin_ctas, 256, 0, a>>>(dflag, (unsigned long long)g_spin_ms * 1000000ull, dstarted);
  CK(cudaGetLastError());
  while (!*hstarted) {
  }
}

/* ---- the meeting kernels (the loopback ranks' pattern) ---------------------------------- */
enum { kRanks = 4, kTrials = 30 };
struct big_param {
  int pad[150]; /* about mokCommDev's size (~600 bytes), as the test's kernels take it */
};
__global__ void k_meet(int *count, int target, unsigned long long ns, int *timedout, big_param bp) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) {
    atomicAdd(count, 1 + bp.pad[0]);
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (atomicAdd(count, 0) < target && t - t0 < ns);
    if (atomicAdd(count, 0) < target) atomicExch(timedout, 1);
  }
  __syncthreads();
}
static int g_meet_ctas = 1, g_meet_threads = 32;
static int *g_meet; /* device: [0] the counter, [1] timed out */
static pthread_barrier_t g_bar;
static int g_use_bar, g_use_gate;
static int g_submitted[2]; /* rounds: how many ranks have queued their kernel of round r */
static void *meet_rank(void *arg) {
  (void)arg;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (g_use_bar) pthread_barrier_wait(&g_bar);
  big_param bp;
  memset(&bp, 0, sizeof bp);
  for (int r = 0; r < 2; r++) {
    /* the round gate: a rank queues its round-r kernel only once every rank has queued its
     * round r-1 kernel, so any queue holds the kernels in round order */
    if (g_use_gate && r > 0)
      while (__atomic_load_n(&g_submitted[r - 1], __ATOMIC_ACQUIRE) < kRanks) {
      }
    k_meet<<<g_meet_ctas, g_meet_threads, 0, s>>>(g_meet, kRanks * g_meet_ctas * (r + 1), 500000000ull, g_meet + 1, bp);
    __atomic_add_fetch(&g_submitted[r], 1, __ATOMIC_ACQ_REL);
  }
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
  return NULL;
}
static int meet_trial(int bar) {
  if (!g_meet) CK(cudaMalloc((void **)&g_meet, 2 * sizeof(int)));
  CK(cudaMemset(g_meet, 0, 2 * sizeof(int)));
  CK(cudaDeviceSynchronize());
  g_use_bar = bar & 1, g_use_gate = bar >> 1;
  g_submitted[0] = g_submitted[1] = 0;
  pthread_barrier_init(&g_bar, NULL, kRanks);
  pthread_t th[kRanks];
  for (int i = 0; i < kRanks; i++) pthread_create(&th[i], NULL, meet_rank, NULL);
  for (int i = 0; i < kRanks; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&g_bar);
  int h[2];
  CK(cudaMemcpy(h, g_meet, sizeof h, cudaMemcpyDeviceToHost));
  return h[1];
}

/* With the spinner running on a and an empty kernel queued behind it, an empty kernel on
 * each of ss in turn (made here if make): those not done within 5 ms share a's queue. */
static void streams_pass(cudaStream_t a, cudaStream_t *ss, int nstreams, int make, const char *what) {
  spinner_start(a);
  k_empty<<<1, 32, 0, a>>>();
  int stuck[64], nstuck = 0;
  for (int i = 0; i < nstreams; i++) {
    if (make) CK(cudaStreamCreateWithFlags(&ss[i], cudaStreamNonBlocking));
    const double t0 = now_ms();
    k_empty<<<1, 32, 0, ss[i]>>>();
    /* a bounded wait: poll, so a stream stuck behind the spinner is seen, not waited out */
    while (cudaStreamQuery(ss[i]) == cudaErrorNotReady && now_ms() - t0 < 5.0) {
    }
    if (cudaStreamQuery(ss[i]) == cudaErrorNotReady && nstuck < 64) stuck[nstuck++] = i + 1;
  }
  *hflag = 1;
  CK(cudaDeviceSynchronize());
  printf("  %s: %d of %d stuck behind a's queued kernel:", what, nstuck, nstreams);
  for (int i = 0; i < nstuck; i++) printf(" %d", stuck[i]);
  printf("\n");
}

int main(int argc, char **argv) {
  if (argc > 1) g_spin_ms = atoi(argv[1]);
  const int nstreams = argc > 2 ? atoi(argv[2]) : 40;
  if (argc > 3) g_spin_ctas = atoi(argv[3]); /* e.g. 132: one CTA an SM, as the barrier test's kernels */
  const char *q = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  CK(cudaSetDevice(0));
  int *h = NULL, *d = NULL;
  CK(cudaHostAlloc((void **)&h, 2 * sizeof(int), cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void **)&d, h, 0));
  hflag = h, hstarted = h + 1, dflag = d, dstarted = d + 1;
  cudaStream_t a;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  k_empty<<<1, 32, 0, a>>>(); /* A's own first launch, before anything is timed */
  CK(cudaStreamSynchronize(a));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("probe-hostcalls: %s, CUDA_DEVICE_MAX_CONNECTIONS=%s, spinner %d CTAs x 256, %d ms (the flag ends it at about %d ms)\n",
         prop.name, q ? q : "(unset)", g_spin_ctas, g_spin_ms, g_spin_ms / 2);
  for (int w = 0; w < kCalls && !getenv("PROBE_SKIP_CALLS"); w++) {
    spinner_start(a);
    job j = {kNames[w], w, 0};
    pthread_t th;
    pthread_create(&th, NULL, thread_b, &j);
    const double t0 = now_ms(); /* B's call runs into the spinner; one that waits ends with it */
    while (now_ms() - t0 < g_spin_ms * 0.5) {
    }
    *hflag = 1;
    pthread_join(th, NULL);
    CK(cudaStreamSynchronize(a));
    printf("  %-42s %9.3f ms%s\n", kNames[w], j.ms, j.ms > g_spin_ms * 0.25 ? "   <- waited for the spinner" : "");
  }
  /* fresh streams, one after another, each launched on while the spinner runs and an empty
   * kernel waits behind it on stream a: a fresh stream on a's hardware queue has its launch
   * behind that waiting kernel, so it does not finish until the spinner ends */
  cudaStream_t *ss = (cudaStream_t *)calloc((size_t)nstreams, sizeof *ss);
  streams_pass(a, ss, nstreams, 1, "fresh streams (1 = made right after a)");
  /* the same streams again, each used before a's kernels were queued: a stream keeps the queue
   * of its first launch if some of these are stuck now */
  streams_pass(a, ss, nstreams, 0, "the same streams, used before");
  for (int i = 0; i < nstreams; i++) cudaStreamDestroy(ss[i]);
  /* the loopback test's pattern without the library: RANKS threads, each makes a stream and
   * queues two kernels that each meet the other ranks' kernel of the same round (a counter in
   * device memory; 500 ms timeout), with or without a host barrier before the launches */
  const int shapes[][2] = {{1, 32}, {16, 512}};
  for (int sh = 0; sh < 2; sh++)
    for (int bar = 0; bar < 4; bar++) {
      g_meet_ctas = shapes[sh][0], g_meet_threads = shapes[sh][1];
      int fails = 0;
      for (int t = 0; t < kTrials; t++) fails += meet_trial(bar);
      printf("  %d ranks, 2 meeting kernels each (%d CTAs x %d), %s: %d of %d trials timed out\n", kRanks,
             g_meet_ctas, g_meet_threads, (const char *[]){"no host barrier", "host barrier before the launches", "round gate", "host barrier, round gate"}[bar], fails, kTrials);
    }
  return 0;
}
