/*
 * comm.h — internal face of the multi-GPU runtime (src/comm.cu): the layout of the
 * symmetric workspace, the by-value view of a communicator that kernels take as a
 * parameter (mokCommDev), the device error word, and host helpers the layer code,
 * tests and benchmarks use. Plain C: included from .c and .cu files alike.
 *
 * Symmetric workspace of one communicator (one NCCL window, the same size on every
 * rank, registered with NCCL_WIN_COLL_SYMMETRIC):
 *
 *   offset 0                      MOK_COMM_CTRL_BYTES                 total
 *   | mokCommCtrl (flags, error) | user workspace (mokCommDev.ws_bytes) |
 *
 * Peer p's copy of the window starts at mokCommDev.peer_base[p] (p = this rank gives
 * the local copy); the user workspace of peer p starts at peer_base[p] + MOK_COMM_CTRL_BYTES.
 */
#ifndef MOK_COMM_H
#define MOK_COMM_H

#include "mok.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Ranks of one NVLink (LSA) domain the device view can address (NVL72 on paper). */
#define MOK_COMM_MAX_RANKS 72
/* Bytes reserved at the start of the symmetric window for mokCommCtrl. */
#define MOK_COMM_CTRL_BYTES 65536
/* Symmetric allocations are rounded up to this (the cuMem granularity NCCL uses). */
#define MOK_COMM_ALLOC_ALIGN ((size_t)2 << 20)
/* Defaults of mokCommConfig_t. */
#define MOK_COMM_DEFAULT_TIMEOUT_MS 10000
#define MOK_COMM_DEFAULT_WORKSPACE ((size_t)2 << 20)

/* One 128-byte line per flag so that writers on different GPUs never share a line. */
#define MOK_COMM_LINE_U32 32

/* Control block at offset 0 of every rank's window. Every field is written only as
 * documented; all counters are monotonic (wrap-safe comparisons), nothing is reset
 * while it can be read, except grid_count (see comm_device.cuh, mok_barrier).
 *   error        first device error word this rank saw (its own or one a peer pushed);
 *                0 = none. Set once by compare-and-swap, never cleared (sticky until
 *                the communicator is destroyed).
 *   grid_count   CTAs of the running kernel arrived at the current grid barrier.
 *   grid_gen     grid barriers completed on this rank (bumped by the last CTA).
 *   epoch        cross-rank barriers this rank has entered (written by the last CTA only).
 *   arrive[p]    the last epoch rank p announced to this rank (written only by rank p). */
typedef struct mokCommCtrl {
  unsigned long long error;
  uint32_t pad0_[MOK_COMM_LINE_U32 - 2];
  uint32_t grid_count;
  uint32_t pad1_[MOK_COMM_LINE_U32 - 1];
  uint32_t grid_gen;
  uint32_t pad2_[MOK_COMM_LINE_U32 - 1];
  uint32_t epoch;
  uint32_t pad3_[MOK_COMM_LINE_U32 - 1];
  uint32_t arrive[MOK_COMM_MAX_RANKS][MOK_COMM_LINE_U32]; /* arrive[p][0] is the flag */
} mokCommCtrl;

/* What a kernel needs to reach the communicator: pass it by value as a kernel
 * parameter (sizeof ~ 600 bytes). Valid until the communicator is destroyed or its
 * workspace re-reserved (mokCommReserveWorkspace). */
typedef struct mokCommDev {
  int rank;                     /* this rank, 0 <= rank < nranks */
  int nranks;
  unsigned long long timeout_ns; /* budget of one bounded wait */
  size_t ws_bytes;              /* user workspace bytes (after the control block) */
  char *peer_base[MOK_COMM_MAX_RANKS]; /* window base of every rank, as mapped here */
} mokCommDev;

/* ---- device error word ----------------------------------------------------------
 * 64 bits: kind (8) | what (8) | rank (16) | where (32), low to high. kind != 0, so a
 * recorded word is never 0. rank = the rank whose kernel recorded it; peers that stop
 * because of it keep the same word, so every rank reports the first error's origin. */
#define MOK_DEVERR_TIMEOUT 1u  /* a bounded wait ran out: maps to mokTimeout */
#define MOK_DEVERR_INPUT 2u    /* bad device-resident input: maps to mokDeviceError */
#define MOK_DEVERR_INTERNAL 3u /* an invariant broke on the device: maps to mokInternalError */

/* `what` codes (kept in one list so the host can name them). Layer kernels add theirs
 * here; where's meaning is per code. */
#define MOK_WAIT_LIST(X)                                                                  \
  X(MOK_WAIT_NONE, 0, "unspecified wait", "detail")                                     \
  X(MOK_WAIT_GRID, 1, "grid barrier (waiting for the other CTAs of this rank)", "barrier") \
  X(MOK_WAIT_PEER, 2, "cross-rank barrier", "waiting for rank")                         \
  X(MOK_WAIT_FLAG, 3, "flag wait", "flag index")                                        \
  X(MOK_WAIT_TEST, 4, "test kernel (a planted error, or a barrier check that failed)", "detail") \
  X(MOK_WAIT_GEMM_LOAD, 5, "expert GEMM: wait for a stage's TMA load", "tile")          \
  X(MOK_WAIT_GEMM_SLOT, 6, "expert GEMM: wait for a free pipeline stage", "tile")       \
  X(MOK_WAIT_GEMM_SCHED, 7, "expert GEMM: wait for the tile scheduler", "slot")        \
  X(MOK_WAIT_GEMM_DEP, 8, "expert GEMM: wait for the tiles a tile reads (fused forward: an expert's gate+up tiles)", "expert") \
  X(MOK_WAIT_MEGA_X, 9, "forward megakernel: wait for an expert's dispatched token rows", "expert")        \
  X(MOK_WAIT_SCHED_INPUT, 10, "device schedule: topk_idx holds an id outside [-1, E)", "route")                 \
  X(MOK_WAIT_EP_REFUSED, 11, "expert-parallel pass: a rank refused it (a bad expert id, a refused call, or more rows than its receive capacity)", "the first such rank") \
  X(MOK_WAIT_EP_CAPACITY, 12, "expert-parallel pass: this rank received more rows than its receive capacity (mokLayerSetRecvCapacity)", "rows (padded) it received") \
  X(MOK_WAIT_MEGA_Y, 13, "forward megakernel's combine: wait for an expert's down tiles (the shared expert's: expert = the local expert count)", "expert")
#define MOK_WAIT_ENUM_(name, value, text, where) name = value,
enum { MOK_WAIT_LIST(MOK_WAIT_ENUM_) MOK_WAIT_NUM_ };
#undef MOK_WAIT_ENUM_

#define MOK_ERRWORD(kind, what, rank, where)                                          \
  ((unsigned long long)((kind) & 0xffu) | ((unsigned long long)((what) & 0xffu) << 8) | \
   ((unsigned long long)((rank) & 0xffffu) << 16) | ((unsigned long long)(uint32_t)(where) << 32))
#define MOK_ERRWORD_KIND(w) ((unsigned)((w) & 0xffu))
#define MOK_ERRWORD_WHAT(w) ((unsigned)(((w) >> 8) & 0xffu))
#define MOK_ERRWORD_RANK(w) ((int)(((w) >> 16) & 0xffffu))
#define MOK_ERRWORD_WHERE(w) ((uint32_t)((w) >> 32))

/* ---- host helpers (src/comm.cu) ------------------------------------------------- */
/* An error word in words: "rank r: <kind> in <wait>, <where> <n>". */
void mok_errword_text(unsigned long long word, char *buf, size_t n);
/* [OUT] dev: the device view of comm (see mokCommDev). */
mokResult_t mok_comm_device_view(mokComm_t comm, mokCommDev *dev);
/* The raw error word (0 = none) of this rank, read without waiting for kernels in
 * flight on other streams. [OUT] word */
mokResult_t mok_comm_read_error_word(mokComm_t comm, unsigned long long *word);
/* If [ptr, ptr+bytes) lies inside one buffer of mokCommMemAlloc, writes every rank's
 * address of ptr into peers[0..nranks) and returns 1; else returns 0 (peers untouched).
 * Host only; no device work. */
int mok_comm_find_symmetric(mokComm_t comm, const void *ptr, size_t bytes, void **peers);
/* Launches a kernel of `blocks` CTAs x `threads` threads that passes `count`
 * consecutive device barriers (mok_barrier) on the comm's device, on `stream`. With
 * check != 0, before barrier i every CTA c writes base+i into its slot of every rank's
 * first workspace bytes, and after it checks that every slot it can see holds base+i or
 * base+i+1 (anything else = early release: recorded as MOK_DEVERR_INTERNAL with where =
 * the iteration); needs nranks*blocks*4 workspace bytes. Collective: every rank
 * launches it with the same blocks and count. */
mokResult_t mok_comm_launch_barriers(mokComm_t comm, int blocks, int threads, int count,
                                     int check, uint32_t base, cudaStream_t stream);
/* The row scratch block the layers of comm share (workspace.h; freed with comm). */
struct mok_devbuf *mok_comm_scratch(mokComm_t comm);
/* Tests: nranks ranks of this process on one device, without NCCL ("loopback"): windows
 * are plain allocations of the device, peers' bases the same address space, host
 * collectives meet at a barrier of the ranks' threads (run them with mokLocalRun; destroy
 * with mokLocalCommsDestroy), bounded: a rank that does not arrive within 2 + 3 x the
 * timeout's seconds fails the others' collectives (mokInternalError, saying so) and the
 * group is then unusable. What needs NCCL refuses them (mokCommGetNccl:
 * mokNotSupported). A cross-rank wait needs every rank's kernel resident at once: launch
 * grids that fit the device together (mok bench stream --two-streams checks a machine),
 * and every kernel a rank launches while another rank's kernel waits for it loaded before
 * the ranks run: with lazy loading a first launch can wait for the running kernels, and so
 * for itself. So this loads every mok kernel first (kernels_load.h; nothing to do under
 * CUDA_MODULE_LOADING=EAGER); kernels of the caller's own that a rank launches while
 * another waits must be loaded by the caller (cudaFuncGetAttributes loads one). And the
 * ranks' kernels that wait for each other must reach the device in rounds: CUDA spreads
 * streams over CUDA_DEVICE_MAX_CONNECTIONS hardware queues (default 8, at most 32) as it
 * sees fit, kernels on one queue start in issue order, and when two ranks queue two waiting
 * kernels each at once, one queue can hold rank A's second ahead of rank B's first, which
 * A's first waits for: a hang until the device timeout. scripts/probe-hostcalls.cu shows it
 * without mok (one H100, session 38: 4 threads, a stream each, two kernels each that meet the
 * other threads' kernel of the same round; launched together after a host barrier 10-22 of
 * 30 trials timed out under 32 and under 8 queues, 0-3 of 30 without the barrier; with the
 * rounds, 0 of 240). So every kernel a loopback rank queues that waits for its peers is
 * followed by mok_comm_peer_kernel_queued, which returns once every rank has queued as many:
 * no rank queues more work until the round is complete, so a queue holds the rounds in order
 * and its head can always start. mok_comm_launch_barriers does it itself; a caller's own
 * kernels that wait for peers call it (tests/test_comm.cu). Not covered: CUDA graph replays
 * (one launch queues a graph's kernels together). Under CUDA_DEVICE_MAX_CONNECTIONS=1 this
 * refuses nranks > 1 (mokNotSupported): there, every stream on one queue, the rounds carry
 * the eager passes (session 38, the refusal bypassed: every loopback test but the graph one
 * passed 3 of 3 runs, where comm_loopback_ranks_1gpu had timed out every time in session 36)
 * but the CUDA-graph loopback test timed out 3 of 3. mok_tests sets 32 where the variable is
 * unset. */
mokResult_t mok_comm_create_loopback(int nranks, int device, const mokCommConfig_t *config, mokComm_t *comms);
/* Loopback ranks: call right after queueing (on stream) a kernel that waits for the other
 * ranks' kernels; returns once every rank has queued as many such kernels (mokInternalError
 * naming the cause, and the group unusable, if one does not within 2 + 3 x the timeout's
 * seconds). Every rank queues the same such kernels. Returns at once for other comms and on a
 * stream being captured (the graph's launch is what queues it). See
 * mok_comm_create_loopback. */
mokResult_t mok_comm_peer_kernel_queued(mokComm_t comm, cudaStream_t stream);
/* Host collective: every rank's `bytes` bytes (host memory), in rank order, into all
 * (host, nranks * bytes); returns when they are there. */
mokResult_t mok_comm_host_allgather(mokComm_t comm, const void *mine, size_t bytes, void *all);
/* Ranks of comm that share its GPU (loopback ranks: all of them; else 1): a kernel that
 * needs all its CTAs resident at once takes SMs / this many. */
int mok_comm_device_share(mokComm_t comm);
/* 1: comm is a loopback rank (mok_comm_create_loopback: no NCCL). */
int mok_comm_is_loopback(mokComm_t comm);
/* Launches one CTA that records a planted error word on the device (tests). */
mokResult_t mok_comm_launch_plant_error(mokComm_t comm, unsigned long long word, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* MOK_COMM_H */
