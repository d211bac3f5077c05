/*
 * test_stream.cu — test_rank_stream (test.h): the stream a loopback rank's thread makes for
 * its kernels, used once before any of them, one rank at a time.
 *
 * Loopback ranks (mok_comm_create_loopback: several ranks of one process on one GPU) run
 * kernels that wait for each other, so each rank's kernels need a hardware work queue of
 * their own: a kernel queued behind a peer's waiting kernel never starts. CUDA seems to
 * place a stream on a queue at its first launch, and first launches from several threads
 * at once can share one: measured (one H100, session 37, docs/PERF.md), with every rank's
 * stream made first and then all ranks launching together, comm_loopback_ranks_1gpu timed
 * out in 24 of 40 runs under 8 or 32 queues; with each new stream's first launch taken one
 * rank at a time (a mutex, an empty kernel, a wait) before that, in 0 of 20 (and in 0 of 20
 * with that first launch and no meeting).
 */
#include "test.h"

#include <pthread.h>

__global__ void k_stream_first_use() {}

static pthread_mutex_t g_first_use = PTHREAD_MUTEX_INITIALIZER;

extern "C" cudaError_t test_rank_stream(cudaStream_t *s, unsigned int flags) {
  cudaError_t e = cudaStreamCreateWithFlags(s, flags);
  if (e != cudaSuccess) return e;
  pthread_mutex_lock(&g_first_use);
  k_stream_first_use<<<1, 32, 0, *s>>>();
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(*s);
  pthread_mutex_unlock(&g_first_use);
  return e;
}
