/*
 * comm_device.cuh — device primitives of the multi-GPU runtime, header-only, for use
 * INSIDE persistent kernels (megakernels, benchmarks, tests):
 *   - PTX wrappers named after their semantics (scope .gpu = this GPU, .sys = every GPU
 *     and the host; release = earlier memory operations become visible first;
 *     acquire = later ones cannot move above it);
 *   - mok_wait_geq: a bounded spin-wait (%globaltimer deadline, __nanosleep backoff)
 *     that records an error word and returns false instead of hanging or trapping;
 *   - the device error word: record (first one wins, pushed to every peer) and check;
 *   - mok_barrier: grid-wide + cross-rank barrier on flags in the symmetric window;
 *   - peer pointers into the symmetric workspace.
 * The communicator reaches a kernel as a mokCommDev passed by value (src/comm.h).
 *
 * Rules for kernels that use mok_barrier: every CTA of the grid calls it the same
 * number of times; all CTAs are co-resident (one wave); at most one kernel using the
 * barrier runs on a communicator at a time (same stream, or ordered streams); every
 * rank runs the same number of barriers. After any wait returns false the kernel must
 * stop writing its outputs and return: the communicator is then dead until re-created.
 */
#pragma once

#include "comm.h"

#include <stdint.h>

// ---- PTX wrappers -----------------------------------------------------------------
// defines: ld_acquire_sys_u32, ld_acquire_gpu_u32, ld_relaxed_gpu_u32,
// ld_relaxed_sys_u64, st_release_sys_u32, st_release_gpu_u32, st_relaxed_gpu_u32,
// red_release_sys_add_u32, red_release_gpu_add_u32, atom_add_acq_rel_sys_u32,
// atom_cas_relaxed_sys_u64, fence_acq_rel_sys, fence_acq_rel_gpu, globaltimer_ns

__device__ __forceinline__ uint32_t ld_acquire_sys_u32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_acquire_gpu_u32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_gpu_u32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_sys_u64(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys_u32(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu_u32(uint32_t *p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_gpu_u32(uint32_t *p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_sys_add_u32(uint32_t *p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_gpu_add_u32(uint32_t *p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t atom_add_acq_rel_sys_u32(uint32_t *p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.sys.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned long long atom_cas_relaxed_sys_u64(unsigned long long *p,
                                                                       unsigned long long cmp,
                                                                       unsigned long long val) {
  unsigned long long old;
  asm volatile("atom.relaxed.sys.global.cas.b64 %0, [%1], %2, %3;"
               : "=l"(old)
               : "l"(p), "l"(cmp), "l"(val)
               : "memory");
  return old;
}
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- communicator view ------------------------------------------------------------
__device__ __forceinline__ mokCommCtrl *mok_ctrl(const mokCommDev &c, int rank) {
  return reinterpret_cast<mokCommCtrl *>(c.peer_base[rank]);
}
// Address of byte `offset` of rank `peer`'s user workspace (peer == c.rank: local).
// Plain loads/stores through it go over NVLink for a peer.
__device__ __forceinline__ void *mok_peer_ptr(const mokCommDev &c, int peer, size_t offset) {
  return c.peer_base[peer] + MOK_COMM_CTRL_BYTES + offset;
}
__device__ __forceinline__ void *mok_local_ptr(const mokCommDev &c, size_t offset) {
  return mok_peer_ptr(c, c.rank, offset);
}

// ---- device error word ------------------------------------------------------------
// True once any rank recorded an error (ours, or one a peer pushed into our control
// block). One relaxed load of local memory: cheap enough to poll inside waits.
__device__ __forceinline__ bool mok_error_seen(const mokCommDev &c) {
  return ld_relaxed_sys_u64(&mok_ctrl(c, c.rank)->error) != 0ull;
}

// Records `word` (MOK_ERRWORD) as this rank's error unless one is there already, then
// offers it to every peer (a peer keeps the first word it got). Any thread may call
// it, any number of times. The sys fence makes the word visible to peers' waits and
// the host before the caller stops. The kernel must return soon after: its outputs
// are undefined from here on.
__device__ __forceinline__ void mok_record_error(const mokCommDev &c, unsigned long long word) {
  atom_cas_relaxed_sys_u64(&mok_ctrl(c, c.rank)->error, 0ull, word);
  for (int p = 0; p < c.nranks; ++p)
    if (p != c.rank) atom_cas_relaxed_sys_u64(&mok_ctrl(c, p)->error, 0ull, word);
  fence_acq_rel_sys();
}

__device__ __forceinline__ unsigned long long mok_deadline(const mokCommDev &c) {
  return globaltimer_ns() + c.timeout_ns;
}

// ---- bounded wait -----------------------------------------------------------------
// Spins until *p >= target (wrap-safe: the difference read as signed), with acquire
// at system scope: once it returns true, every write that the flag's writer made
// before its release (st_release_sys_u32 / red_release_sys_add_u32), on any GPU, is
// visible to the calling thread. Returns false, without trapping, when
//   - the %globaltimer passes `deadline`: records MOK_ERRWORD(TIMEOUT, what, rank, where);
//   - any rank recorded an error (mok_error_seen): records nothing more.
// Backoff: busy for the first polls (low latency), then __nanosleep doubling to 1 us.
__device__ __forceinline__ bool mok_wait_geq(const uint32_t *p, uint32_t target, const mokCommDev &c,
                                             unsigned long long deadline, uint32_t what,
                                             uint32_t where) {
  uint32_t ns = 0;
  for (uint32_t spin = 0;; ++spin) {
    if ((int32_t)(ld_acquire_sys_u32(p) - target) >= 0) return true;
    if ((spin & 15u) == 15u) {
      if (mok_error_seen(c)) return false;
      if (globaltimer_ns() > deadline) {
        mok_record_error(c, MOK_ERRWORD(MOK_DEVERR_TIMEOUT, what, c.rank, where));
        return false;
      }
    }
    if (spin >= 64) {
      ns = ns ? (ns < 1024u ? ns * 2u : 1024u) : 32u;
      __nanosleep(ns);
    }
  }
}

// ---- grid-wide + cross-rank barrier -----------------------------------------------
// Called by every thread of every CTA of the grid. Returns true on every thread once
// all CTAs of this kernel on this rank AND on every other rank have called it; false
// (on every thread of the CTA) after a timeout or a recorded error.
//
// Algorithm (per rank, all state in this rank's mokCommCtrl):
//  1. Each CTA: __syncthreads, then thread 0 reads grid_gen (gen) and arrives with an
//     acq_rel.sys add on grid_count.
//  2. The CTA that brings grid_count to gridDim (the leader) resets grid_count to 0,
//     bumps its epoch e, stores e into arrive[rank] of every peer with release.sys,
//     waits (bounded) until arrive[p] >= e for every peer p, then releases
//     grid_gen = gen + 1 (release.sys).
//  3. Every other CTA waits (bounded) until grid_gen != gen.
//
// Why it is correct:
//  - No early release within a rank: grid_gen moves only when the leader saw all
//    gridDim arrivals (the atomic add's return value), and each CTA read gen before
//    arriving, so it cannot mistake an older bump for this one.
//  - grid_count reset has no race: nobody touches grid_count for the next barrier
//    before observing the new grid_gen, which the leader releases after the reset.
//  - No early release across ranks: a peer stores epoch e only when all of its CTAs
//    arrived at its e-th barrier; epochs only grow (monotonic, wrap-safe compare), so
//    arrive[p] >= e proves peer p reached barrier e; nothing is ever reset.
//  - Memory ordering (what a barrier promises: all writes any thread of any rank made
//    before the barrier, to any GPU's memory, are visible to every thread of every rank
//    after it). Chain: writer's stores -> bar.sync -> its CTA's thread 0 atom.acq_rel.sys
//    (release, cumulative over the CTA by bar.sync) -> the leader's atom (acquire, same
//    location: release sequence) -> leader's st.release.sys of arrive -> remote leader's
//    ld.acquire.sys in mok_wait_geq -> remote leader's st.release.sys of grid_gen ->
//    remote CTA's ld.acquire.sys of grid_gen -> bar.sync -> its threads' loads. Each
//    arrow is either program order + a fence-carrying operation or a release/acquire
//    pair at .sys scope, and causality order is transitive (PTX memory model), so the
//    remote loads observe the stores. System scope everywhere on the cross-GPU path:
//    data crosses NVLink, whose writes a .gpu fence does not wait for.
//  - Epoch continuity across kernels: epoch is only written by leaders; consecutive
//    leaders are ordered by the grid barrier (within a kernel) or kernel boundaries.
__device__ __forceinline__ bool mok_barrier(const mokCommDev &c) {
  __shared__ int s_ok;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    mokCommCtrl *me = mok_ctrl(c, c.rank);
    const uint32_t nblocks = gridDim.x * gridDim.y * gridDim.z;
    const uint32_t gen = ld_acquire_sys_u32(&me->grid_gen);
    int ok = 1;
    if (atom_add_acq_rel_sys_u32(&me->grid_count, 1u) == nblocks - 1u) {
      // Leader: every CTA of this rank has arrived.
      st_relaxed_gpu_u32(&me->grid_count, 0u);
      const uint32_t e = ld_relaxed_gpu_u32(&me->epoch) + 1u;
      st_relaxed_gpu_u32(&me->epoch, e);
      for (int p = 0; p < c.nranks; ++p)
        if (p != c.rank) st_release_sys_u32(&mok_ctrl(c, p)->arrive[c.rank][0], e);
      const unsigned long long deadline = mok_deadline(c);
      for (int p = 0; p < c.nranks && ok; ++p)
        if (p != c.rank) ok = mok_wait_geq(&me->arrive[p][0], e, c, deadline, MOK_WAIT_PEER, (uint32_t)p);
      if (ok) st_release_sys_u32(&me->grid_gen, gen + 1u);
    } else {
      // The leader's own wait is bounded by timeout_ns; give it that plus a margin so
      // its precise error (which peer) is the one recorded, not ours.
      const unsigned long long deadline = mok_deadline(c) + c.timeout_ns;
      ok = mok_wait_geq(&me->grid_gen, gen + 1u, c, deadline, MOK_WAIT_GRID, 0u);
    }
    s_ok = ok;
  }
  __syncthreads();
  const bool ok = s_ok != 0;
  __syncthreads();  // s_ok may be rewritten by the next barrier
  return ok;
}
