/*
 * layer_api.cu — the GPU layer's lifecycle and public entry points (host code, no kernels):
 * mokLayerCreateOnComm and the layer's device state (mok_gpu_layer_free), the checks every
 * pass makes of its inputs (check_pass), mokLayerForward / mokLayerBackward (they pick the
 * implementation: the conventional path and mokImplNccl in baseline.cu, mokImplMega in
 * layer_mega.cu), mokLayerSetRecvCapacity and the device-memory calls (mokLayerReserve,
 * mokLayerMemoryInfo). Declarations shared with the passes: layer_gpu.h.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "comm.h"
#include "gemm.h"
#include "internal.h"
#include "schedule_dev.h"
#include "workspace.h"

#include "layer_gpu.h"
/* ---- create / free ------------------------------------------------------------------ */
void mok_gpu_layer_free(struct mokLayer *l) {
  struct mok_gpu_layer *g = l->gpu;
  if (!g) return;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(g->device);
  cudaDeviceSynchronize();
  void *dev[] = {g->d_cnt, g->d_cnt_all, g->d_pos, g->d_map, g->d_flags};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
  mok_devbuf_free(&g->saved);
  void *pinned[] = {g->h_idx, g->h_pos, g->h_cnt, g->h_cnt_all, g->h_map, g->h_flags};
  for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) cudaFreeHost(pinned[i]);
  if (g->cublas) cublasDestroy(g->cublas);
  for (int i = 0; i < NUM_GKINDS; i++)
    if (g->cublas_kind[i]) cublasDestroy(g->cublas_kind[i]);
  for (int i = 0; i < 32; i++)
    if (g->ev[i]) cudaEventDestroy(g->ev[i]);
  free(g->send_cnt); free(g->seg_cnt);
  free(g->gm); free(g->galpha); free(g->gta); free((void *)g->ops); free(g->cursor);
  cudaFreeHost(g->h_ptrs);
  cudaFree(g->d_ptrs);
  cudaFree(g->d_seg);
  cudaFree(g->d_route_row);
  cudaFree(g->d_row_tok);
  cudaFree(g->d_bad);
  cudaFree(g->d_shared_seg);
  cudaFree(g->d_sched_scratch);
  cudaFree(g->d_ep_scratch);
  cudaFree(g->d_ep_rowtok);
  cudaFree((void *)g->d_xsrc);
  cudaFree(g->d_status);
  free(g);
  l->gpu = NULL;
  if (prev >= 0) cudaSetDevice(prev);
}

static mokResult_t gpu_alloc(mokLayer_t l) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int64_t N = c->num_ranks, E = c->num_experts, El = l->local_experts;
  const int64_t T = c->max_tokens, k = c->topk, cap = l->sched_capacity;
  g->cap = 0;
  /* (the row buffers grow with the passes: mok_lg_layout_saved, layout_scratch) */
  struct { void **p; size_t bytes; } dev[] = {
      {(void **)&g->d_cnt, 4 * (size_t)(E + CNT_EXTRA)}, {(void **)&g->d_cnt_all, 4 * (size_t)(N * (E + CNT_EXTRA))},
      {(void **)&g->d_pos, 4 * (size_t)(T * k)}, {(void **)&g->d_map, 4 * (size_t)cap},
      {(void **)&g->d_flags, 4 * (size_t)(N + 1)}};
  size_t total = 0;
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
    if (!dev[i].bytes) continue;
    cudaError_t e = cudaMalloc(dev[i].p, dev[i].bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: cannot allocate %.2f GiB of device workspace "
                       "(%.2f GiB allocated so far) for max_tokens %lld: %s", dev[i].bytes / 1073741824.0,
                       total / 1073741824.0, (long long)T, cudaGetErrorString(e));
    }
    total += dev[i].bytes;
  }
  g->fixed_bytes = mok_layer_fixed_bytes(c); /* (the arrays above and d_route_row, d_row_tok, d_seg below) */
  struct { void **p; size_t bytes; } host[] = {
      {(void **)&g->h_idx, 4 * (size_t)(T * k + 1)}, {(void **)&g->h_pos, 4 * (size_t)(T * k + 1)},
      {(void **)&g->h_cnt, 4 * (size_t)(E + CNT_EXTRA)}, {(void **)&g->h_cnt_all, 4 * (size_t)(N * (E + CNT_EXTRA))},
      {(void **)&g->h_map, 4 * (size_t)cap}, {(void **)&g->h_flags, 4 * (size_t)(N + 1)}};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
    if (cudaMallocHost(host[i].p, host[i].bytes) != cudaSuccess) {
      cudaGetLastError();
      return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: cannot allocate pinned host memory");
    }
  g->send_cnt = (int64_t *)calloc((size_t)(4 * N), sizeof(int64_t));
  g->seg_cnt = (int32_t *)calloc((size_t)(2 * El + 1), sizeof(int32_t));
  if (!g->send_cnt || !g->seg_cnt) return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: out of host memory");
  g->send_base = g->send_cnt + N, g->recv_cnt = g->send_cnt + 2 * N, g->recv_base = g->send_cnt + 3 * N;
  g->seg_off = g->seg_cnt + El;
  g->ops = (const void **)calloc((size_t)(3 * El), sizeof(void *));
  g->cursor = (int32_t *)calloc((size_t)(E + 1), sizeof(int32_t));
  if (!g->ops || !g->cursor) return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: out of host memory");
  g->gm = (int *)calloc((size_t)(7 * El), sizeof(int));
  g->galpha = (float *)calloc((size_t)(2 * El), sizeof(float));
  g->gta = (cublasOperation_t *)calloc((size_t)(2 * El), sizeof(cublasOperation_t));
  if (!g->gm || !g->galpha || !g->gta) return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: out of host memory");
  g->gn = g->gm + El, g->gk = g->gm + 2 * El, g->glda = g->gm + 3 * El, g->gldb = g->gm + 4 * El;
  g->gldc = g->gm + 5 * El, g->gsize = g->gm + 6 * El, g->gbeta = g->galpha + El, g->gtb = g->gta + El;
  if (cudaMallocHost((void **)&g->h_ptrs, sizeof(void *) * MOK_LG_SLOTS * 3 * (size_t)El) != cudaSuccess ||
      cudaMalloc((void **)&g->d_ptrs, sizeof(void *) * MOK_LG_SLOTS * 3 * (size_t)El) != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: cannot allocate GEMM pointer arrays");
  }
  g->grouped_ok = 1;
  /* Which expert GEMM kinds (bit = enum gkind) use one grouped cuBLAS call instead of a
   * call per expert; unset = the measured rule in expert_gemm. */
  const char *mask = getenv("MOK_BASELINE_GROUPED");
  g->grouped_mask = mask ? (unsigned)strtoul(mask, NULL, 0) & 0x1ffu : ~0u;
  g->prof = getenv("MOK_BASELINE_PROFILE") != NULL;
  int major = 0;
  CUDA_CHECK(l, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, g->device));
  g->sm90 = major == 9;
  if (cudaMalloc((void **)&g->d_route_row, 4 * (size_t)(T * k + 1)) != cudaSuccess ||
      cudaMalloc((void **)&g->d_row_tok, 4 * (size_t)cap) != cudaSuccess ||
      cudaMalloc((void **)&g->d_bad, sizeof(int32_t)) != cudaSuccess ||
      cudaMalloc((void **)&g->d_shared_seg, 3 * sizeof(int32_t)) != cudaSuccess ||
      cudaMalloc((void **)&g->d_sched_scratch, 4 * (size_t)mok_schedule_local_scratch((int)El)) != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: out of device memory");
  }
  {
    const char *cc = getenv("MOK_MEGA_COMM_CTAS");
    g->mega_comm_ctas = cc ? atoi(cc) : 0;
    if (g->mega_comm_ctas < 1) g->mega_comm_ctas = MEGA_COMM_CTAS;
    const char *mc = getenv("MOK_MEGA_CTAS");
    g->mega_ctas = mc ? atoi(mc) : 0;
    const char *ms = getenv("MOK_MEGA_SHARED");
    g->mega_shared = !(ms && !strcmp(ms, "0"));
    const char *mb = getenv("MOK_MEGA_COMBINE");
    g->mega_combine = !(mb && !strcmp(mb, "0"));
    const char *mp = getenv("MOK_MEGA_PUSH");
    g->mega_push = mp && !strcmp(mp, "1");
  }
  if (N > 1 && (cudaMalloc((void **)&g->d_ep_scratch, 4 * (size_t)mok_schedule_local_scratch((int)E)) != cudaSuccess ||
                cudaMalloc((void **)&g->d_ep_rowtok, 4 * (size_t)(T * k + 1)) != cudaSuccess ||
                cudaMalloc((void **)&g->d_xsrc, sizeof(void *) * (size_t)N) != cudaSuccess ||
                cudaMalloc((void **)&g->d_status, 2 * sizeof(unsigned long long)) != cudaSuccess ||
                cudaMemset(g->d_status, 0, 2 * sizeof(unsigned long long)) != cudaSuccess)) {
    cudaGetLastError();
    return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: out of device memory");
  }
  if (cudaMalloc((void **)&g->d_seg, sizeof(int32_t) * (size_t)(2 * El + 1)) != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokOutOfMemory, "mokLayerCreateOnComm: out of device memory");
  }
  CUBLAS_CHECK(l, cublasCreate(&g->cublas));
  return mokSuccess;
}

extern "C" mokResult_t mokLayerCreateOnComm(mokLayer_t *layer, const mokConfig_t *config, mokComm_t comm) {
  static const char fn[] = "mokLayerCreateOnComm";
  mok_clear_error();
  if (!layer) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  if (!comm) return mok_error(NULL, mokInvalidArgument, "%s: comm is NULL", fn);
  mokConfig_t c;
  mokResult_t vr = mok_config_validate(config, &c);
  /* Every rank takes part in the agreement check, valid config or not, so a rank with a
   * bad config does not leave the others waiting inside NCCL. */
  mokConfig_t blob;
  memset(&blob, 0, sizeof blob);
  if (vr == mokSuccess) {
    blob.size = c.size, blob.magic = c.magic, blob.version = c.version;
    blob.num_experts = c.num_experts, blob.hidden = c.hidden, blob.inter = c.inter, blob.topk = c.topk;
    blob.shared_inter = c.shared_inter, blob.num_ranks = c.num_ranks, blob.max_tokens = c.max_tokens;
    blob.grad_dtype = c.grad_dtype, blob.swiglu_limit = c.swiglu_limit, blob.row_pad = c.row_pad;
  }
  char vmsg[MOK_ERRMSG_LEN];
  snprintf(vmsg, sizeof vmsg, "%s", mokGetLastError());
  mokResult_t ar = mokCommCheckAgreement(comm, &blob, sizeof blob, "layer config");
  if (vr != mokSuccess) return mok_error(NULL, vr, "%s: %s", fn, vmsg);
  if (ar != mokSuccess) return mok_error(NULL, ar, "%s: %s", fn, mokGetLastError());
  int rank = 0, nranks = 0, device = 0;
  MOK_CHECK(mokCommRankInfo(comm, &rank, &nranks, &device));
  if (c.num_ranks != nranks)
    return mok_error(NULL, mokInvalidArgument, "%s: config.num_ranks is %d but the communicator has %d ranks", fn,
                     c.num_ranks, nranks);
  struct mokLayer *l = (struct mokLayer *)calloc(1, sizeof *l);
  if (!l) return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn);
  mok_layer_init_host(l, &c);
  l->comm = comm;
  l->gpu = (struct mok_gpu_layer *)calloc(1, sizeof(struct mok_gpu_layer));
  if (!l->gpu) { free(l); return mok_error(NULL, mokOutOfMemory, "%s: out of host memory", fn); }
  l->gpu->device = device;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  mokResult_t rc = gpu_alloc(l);
  if (prev >= 0) cudaSetDevice(prev);
  if (rc != mokSuccess) {
    char msg[MOK_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s", mokGetLastError());
    mok_gpu_layer_free(l);
    free(l);
    return mok_error(NULL, rc, "%s", msg);
  }
  *layer = l;
  return mokSuccess;
}

/* ---- validation of a pass ------------------------------------------------------------ */
static mokResult_t check_dev_ptr(mokLayer_t l, const char *fn, const void *p, const char *name, int need) {
  if (!need) return mokSuccess;
  if (!p) return mok_error(l, mokInvalidArgument, "%s: %s is NULL", fn, name);
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokInvalidArgument, "%s: %s is not a CUDA pointer", fn, name);
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    return mok_error(l, mokInvalidArgument, "%s: %s is host memory; the GPU layer takes device pointers", fn, name);
  if (a.type == cudaMemoryTypeDevice && a.device != l->gpu->device)
    return mok_error(l, mokInvalidArgument, "%s: %s is on device %d, the layer's communicator on device %d", fn, name,
                     a.device, l->gpu->device);
  return mokSuccess;
}

/* A [T, H] token tensor (x, out, d_out, d_x): a device pointer, 16-byte aligned (the
 * permute and combine kernels move rows 16 bytes at a time). */
static mokResult_t check_tok_ptr(mokLayer_t l, const char *fn, const void *p, const char *name, int need) {
  MOK_CHECK(check_dev_ptr(l, fn, p, name, need));
  if (need && (uintptr_t)p % 16)
    return mok_error(l, mokInvalidArgument, "%s: %s is not 16-byte aligned (%p)", fn, name, p);
  return mokSuccess;
}

static mokResult_t check_pass(mokLayer_t l, const char *fn, mokImpl_t impl, const mokRankInput_t *in,
                              const mokRankWeights_t *w) {
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  if (!l->gpu) return mok_error(l, mokInvalidUsage, "%s: the layer was made by mokLayerCreate (host only); "
                                "use mokLayerCreateOnComm for GPU passes", fn);
  if (impl != mokImplAuto && impl != mokImplBaseline && impl != mokImplNccl && impl != mokImplMega)
    return mok_error(l, mokInvalidArgument, "%s: impl %d is not built (mokImplAuto, mokImplBaseline, mokImplNccl, "
                     "mokImplMega)", fn, (int)impl);
  if ((impl == mokImplNccl || impl == mokImplMega) && !l->gpu->sm90)
    return mok_error(l, mokNotSupported, "%s: %s needs a Hopper GPU (sm_90); use mokImplBaseline", fn,
                     impl == mokImplNccl ? "mokImplNccl" : "mokImplMega");
  if (impl == mokImplMega) {
    const mokConfig_t *c = &l->cfg;
    if (mok_comm_device_share(l->comm) > 16)
      return mok_error(l, mokNotSupported, "%s: mokImplMega with %d ranks sharing one GPU (loopback): at most 16 "
                       "(each launch takes a share of the SMs, its counters one of 16 slots)", fn,
                       mok_comm_device_share(l->comm));
    if (c->num_ranks > 1 && c->max_tokens > (int)(INT32_MAX / ((int64_t)c->num_ranks * c->topk)))
      return mok_error(l, mokNotSupported, "%s: mokImplMega at %d ranks needs num_ranks * max_tokens * topk below 2^31 "
                       "(its route ids); use mokImplNccl", fn, c->num_ranks);
    if (c->inter % 128 || c->hidden % 256 || c->num_experts > MOK_SCHEDULE_LOCAL_MAX_EXPERTS)
      return mok_error(l, mokNotSupported, "%s: mokImplMega needs inter %% 128 == 0, hidden %% 256 == 0 and at most %d "
                       "experts (inter %d, hidden %d, experts %d); use mokImplNccl", fn,
                       MOK_SCHEDULE_LOCAL_MAX_EXPERTS, c->inter, c->hidden, c->num_experts);
    if (w && w->w_gate && w->w_up != w->w_gate + (size_t)l->local_experts * c->inter * c->hidden)
      return mok_error(l, mokNotSupported, "%s: mokImplMega needs weights->w_up to lie right after w_gate (one "
                       "allocation [W_gate | W_up], see mokRankWeights_t); use mokImplNccl", fn);
  }
  if (!in) return mok_error(l, mokInvalidArgument, "%s: input is NULL", fn);
  if (!w) return mok_error(l, mokInvalidArgument, "%s: weights is NULL", fn);
  const mokConfig_t *c = &l->cfg;
  if (in->num_tokens < 0 || in->num_tokens > c->max_tokens)
    return mok_error(l, mokInvalidArgument, "%s: input->num_tokens is %d, it must be in [0, max_tokens=%d]", fn,
                     in->num_tokens, c->max_tokens);
  int T = in->num_tokens, Is = c->shared_inter;
  MOK_CHECK(check_tok_ptr(l, fn, in->x, "input->x", T > 0));
  MOK_CHECK(check_dev_ptr(l, fn, in->topk_idx, "input->topk_idx", T > 0));
  MOK_CHECK(check_dev_ptr(l, fn, in->topk_w, "input->topk_w", T > 0));
  MOK_CHECK(check_dev_ptr(l, fn, w->w_gate, "weights->w_gate", 1));
  MOK_CHECK(check_dev_ptr(l, fn, w->w_up, "weights->w_up", 1));
  MOK_CHECK(check_dev_ptr(l, fn, w->w_down, "weights->w_down", 1));
  MOK_CHECK(check_dev_ptr(l, fn, w->s_gate, "weights->s_gate", Is > 0));
  MOK_CHECK(check_dev_ptr(l, fn, w->s_up, "weights->s_up", Is > 0));
  MOK_CHECK(check_dev_ptr(l, fn, w->s_down, "weights->s_down", Is > 0));
  return mokSuccess;
}


/* ---- public entry points ------------------------------------------------------------ */

static mokImpl_t resolve_impl(mokLayer_t l, mokImpl_t impl) {
  if (impl == mokImplAuto) return l->gpu->sm90 ? mokImplNccl : mokImplBaseline;
  return impl;
}
/* Ranks that share a GPU (loopback) and wait for each other on it need a stream each: on the
 * legacy default stream one rank's barrier would wait behind another's. */
static mokResult_t check_share_stream(mokLayer_t l, const char *fn, mokImpl_t impl, cudaStream_t st) {
  if (mok_comm_device_share(l->comm) > 1 && resolve_impl(l, impl) == mokImplMega && (st == 0 || st == cudaStreamLegacy))
    return mok_error(l, mokInvalidArgument, "%s: ranks that share a GPU need a stream each for mokImplMega, not the "
                     "legacy default stream", fn);
  return mokSuccess;
}
static const char *impl_name(mokImpl_t impl) {
  return impl == mokImplNccl       ? "mokImplNccl"
         : impl == mokImplBaseline ? "mokImplBaseline"
         : impl == mokImplMega     ? "mokImplMega"
                                   : "mokImplAuto";
}

/* A pass's start: the thread's last error cleared, the caller's device kept in *prev (put
 * back at the pass's end), the layer's made current, the inputs checked (check_pass). */
static mokResult_t pass_enter(mokLayer_t l, const char *fn, mokImpl_t impl, const mokRankInput_t *in,
                              const mokRankWeights_t *w, int *prev) {
  mok_clear_error();
  cudaGetDevice(prev);
  if (l && l->gpu) cudaSetDevice(l->gpu->device);
  return check_pass(l, fn, impl, in, w);
}

extern "C" mokResult_t mokLayerForward(mokLayer_t l, mokImpl_t impl, const mokRankInput_t *in,
                                       const mokRankWeights_t *w, mokBf16 *out, cudaStream_t st) {
  static const char fn[] = "mokLayerForward";
  int prev = -1;
  mokResult_t rc = pass_enter(l, fn, impl, in, w, &prev);
  if (rc == mokSuccess) rc = check_tok_ptr(l, fn, out, "out", in->num_tokens > 0);
  if (rc == mokSuccess) rc = check_share_stream(l, fn, impl, st);
  if (l && l->gpu && l->cfg.num_ranks > 1 && resolve_impl(l, impl) == mokImplMega) {
    /* every rank says first whether it refused, so none waits at a barrier: stage A on the
     * host, with a receive capacity through the device (mok_lg_mega_ep_refuse) */
    l->gpu->fwd_valid = 0;
    if (l->gpu->ep_recv_cap) {
      if (rc != mokSuccess) {
        rc = mok_lg_mega_ep_refuse(l, rc, st);
        mok_lg_pass_done(l, st); /* (the next pass on another stream waits for the refusal's barriers) */
      }
    } else {
      rc = mok_lg_agree_step(l, rc, mokInvalidArgument, fn, "refused its forward input", st);
    }
    if (rc == mokSuccess) {
      l->gpu->fwd_impl = mokImplMega;
      rc = mok_lg_mega_ep_complete(l, mok_lg_mega_ep_forward(l, in, w, out, st), st);
      mok_lg_pass_done(l, st);
    }
  } else if (rc == mokSuccess) {
    l->gpu->fwd_impl = resolve_impl(l, impl);
    rc = l->gpu->fwd_impl == mokImplMega ? mok_lg_mega_forward(l, in, w, out, st) : mok_lg_baseline_forward(l, in, w, out, st);
    mok_lg_pass_done(l, st);
  }
  else if (l && l->gpu) rc = mok_lg_refuse_forward(l, rc, st); /* the peers must not wait for us */
  if (prev >= 0) cudaSetDevice(prev);
  return rc;
}

extern "C" mokResult_t mokLayerBackward(mokLayer_t l, mokImpl_t impl, const mokRankInput_t *in,
                                        const mokRankWeights_t *w, const mokBf16 *d_out, const mokRankGrads_t *gr,
                                        cudaStream_t st) {
  static const char fn[] = "mokLayerBackward";
  int prev = -1;
  mokResult_t rc = pass_enter(l, fn, impl, in, w, &prev);
  const int T = in ? in->num_tokens : 0, Is = l ? l->cfg.shared_inter : 0;
  if (rc == mokSuccess && !gr) rc = mok_error(l, mokInvalidArgument, "%s: grads is NULL", fn);
  if (rc == mokSuccess) rc = mok_check_accumulate(l, fn, -1, gr->accumulate);
  if (rc == mokSuccess && (!l->gpu->fwd_valid || l->gpu->fwd_tokens != T))
    rc = mok_error(l, mokInvalidUsage, "%s: no forward of these %d tokens precedes this backward (the layer keeps "
                   "the context of its last forward)", fn, T);
  if (rc == mokSuccess && resolve_impl(l, impl) != l->gpu->fwd_impl)
    rc = mok_error(l, mokInvalidUsage, "%s: %s resolves to %s, but the forward ran %s; the backward runs its "
                   "forward's implementation", fn, impl_name(impl), impl_name(resolve_impl(l, impl)),
                   impl_name(l->gpu->fwd_impl));
  if (rc == mokSuccess) rc = check_tok_ptr(l, fn, d_out, "d_out", T > 0);
  if (rc == mokSuccess) rc = check_share_stream(l, fn, impl, st);
  if (rc == mokSuccess) rc = check_tok_ptr(l, fn, gr->d_x, "grads->d_x", T > 0);
  if (rc == mokSuccess) rc = check_dev_ptr(l, fn, gr->d_topk_w, "grads->d_topk_w", T > 0);
  if (rc == mokSuccess) rc = check_dev_ptr(l, fn, gr->d_w_gate, "grads->d_w_gate", 1);
  if (rc == mokSuccess) rc = check_dev_ptr(l, fn, gr->d_w_up, "grads->d_w_up", 1);
  if (rc == mokSuccess) rc = check_dev_ptr(l, fn, gr->d_w_down, "grads->d_w_down", 1);
  if (rc == mokSuccess) rc = check_dev_ptr(l, fn, gr->d_s_gate, "grads->d_s_gate", Is > 0);
  if (rc == mokSuccess) rc = check_dev_ptr(l, fn, gr->d_s_up, "grads->d_s_up", Is > 0);
  if (rc == mokSuccess) rc = check_dev_ptr(l, fn, gr->d_s_down, "grads->d_s_down", Is > 0);
  if (rc == mokSuccess) { /* (the forward reserved this scratch: nothing grows here) */
    const pass_shape fs = mok_lg_fwd_shape(l);
    rc = mok_lg_pass_buffers(l, &fs, 1, st, fn);
  }
  /* mokImplMega: a forward the device refused is checked on the host only where cuBLAS runs
   * the shared expert (it cannot read the flag) and no host read it (one GPU, or a receive
   * capacity); else every kernel reads it (mok_lg_mega_backward) */
  const int device_only = l && l->gpu && l->cfg.num_ranks > 1 && l->gpu->ep_recv_cap &&
                          resolve_impl(l, impl) == mokImplMega; /* (mokLayerSetRecvCapacity) */
  if (rc == mokSuccess && l->gpu->fwd_impl == mokImplMega && (l->cfg.num_ranks == 1 || device_only) && Is && T &&
      !l->gpu->fwd_shared_in)
    rc = mok_lg_mega_backward_check(l, st);
  if (device_only) {
    if (rc != mokSuccess) rc = mok_lg_mega_ep_refuse(l, rc, st); /* (through the device: no host wait) */
  } else if (l && l->gpu && !(rc == mokSuccess && l->gpu->fwd_impl == mokImplMega && l->cfg.num_ranks == 1)) {
    /* every rank says whether it refused, so none waits inside NCCL (one rank: no peer) */
    rc = mok_lg_agree_step(l, rc, mokInvalidArgument, fn, "refused its backward input", st);
  }
  if (rc == mokSuccess)
    rc = l->gpu->fwd_impl != mokImplMega ? mok_lg_baseline_backward(l, in, w, d_out, gr, st)
         : l->cfg.num_ranks > 1     ? mok_lg_mega_ep_complete(l, mok_lg_mega_ep_backward(l, in, w, d_out, gr, st), st)
                                    : mok_lg_mega_backward(l, in, w, d_out, gr, st);
  /* mokImplMega's backward writes dY over the forward's y rows (d_topk_w reads them first):
   * another backward needs the forward again */
  if (rc == mokSuccess && l->gpu->fwd_impl == mokImplMega) l->gpu->fwd_valid = 0;
  if (l && l->gpu) mok_lg_pass_done(l, st);
  if (prev >= 0) cudaSetDevice(prev);
  return rc;
}

extern "C" mokResult_t mokLayerSetRecvCapacity(mokLayer_t l, int64_t routes) {
  static const char fn[] = "mokLayerSetRecvCapacity";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  if (!l->gpu) return mok_error(l, mokInvalidUsage, "%s: the layer was made by mokLayerCreate (host only)", fn);
  const mokConfig_t *c = &l->cfg;
  const int64_t most = (int64_t)c->num_ranks * c->max_tokens * c->topk, El = l->local_experts, P = c->row_pad;
  const int bad = routes < 0 || routes > most;
  /* collective: every rank the same value (a rank with a bad one takes part, so none waits) */
  const int64_t blob = bad ? -1 : routes;
  const mokResult_t ar = mokCommCheckAgreement(l->comm, &blob, sizeof blob, "mokLayerSetRecvCapacity's routes");
  if (bad)
    return mok_error(l, mokInvalidArgument, "%s: routes %lld outside [0, num_ranks * max_tokens * topk = %lld]", fn,
                     (long long)routes, (long long)most);
  if (ar != mokSuccess) return mok_error(l, ar, "%s", mokGetLastError());
  l->gpu->ep_recv_cap = routes ? (routes + El * (P - 1) + P - 1) / P * P : 0;
  l->gpu->fwd_valid = 0; /* (a backward runs the protocol of its forward: it needs a forward again) */
  return mokSuccess;
}

/* d_status[1] = d_status[0], d_status[0] = 0, atomically. */

/* ---- device memory ------------------------------------------------------------------- */
extern "C" mokResult_t mokLayerReserve(mokLayer_t l, int num_tokens, cudaStream_t st) {
  static const char fn[] = "mokLayerReserve";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  if (!l->gpu) return mok_error(l, mokInvalidUsage, "%s: the layer was made by mokLayerCreate (host only)", fn);
  if (num_tokens < 0 || num_tokens > l->cfg.max_tokens)
    return mok_error(l, mokInvalidArgument, "%s: num_tokens %d is outside [0, max_tokens %d]", fn, num_tokens,
                     l->cfg.max_tokens);
  struct mok_gpu_layer *g = l->gpu;
  const int64_t N = l->cfg.num_ranks, k = l->cfg.topk;
  /* the worst routing: every route of every rank on this rank's experts */
  const int64_t worst = N * num_tokens * k;
  /* (mokImplMega at N > 1 is covered only with a receive capacity: else its forward reads the
   * rows on the host and grows its blocks to them; reserving its worst case, N T k rows of y in
   * the saved block, would cost every NCCL user GiBs a layer) */
  const int64_t cap = g->ep_recv_cap; /* (with a receive capacity: its rows) */
  const pass_shape sh[6] = {mega_shape(l, num_tokens, 0), mega_shape(l, num_tokens, 1),
                            mok_shape_spread(&l->cfg, mokImplNccl, num_tokens, worst, 1),
                            mok_shape_spread(&l->cfg, mokImplBaseline, num_tokens, worst, 1),
                            mok_shape_mega_rows(&l->cfg, num_tokens, 0, cap),
                            mok_shape_mega_rows(&l->cfg, num_tokens, 1, cap)};
  size_t saved = 0, scratch = 0;
  for (int q = 0; q < (cap ? 6 : 4); q++) {
    const size_t a = mok_lg_layout_saved(l, &sh[q], NULL), b = mok_lg_scratch_need(l, &sh[q]);
    if (a > saved) saved = a;
    if (b > scratch) scratch = b;
  }
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(g->device);
  const size_t had = g->saved.bytes;
  mokResult_t rc = mok_devbuf_reserve(l, &g->saved, saved, st, fn, "layer's saved rows");
  if (g->saved.bytes != had) g->fwd_valid = 0; /* (the last forward's context is gone) */
  if (rc == mokSuccess) rc = mok_devbuf_reserve(l, mok_comm_scratch(l->comm), scratch, st, fn, "communicator's scratch rows");
  if (rc == mokSuccess) mok_lg_pass_done(l, st);
  if (prev >= 0) cudaSetDevice(prev);
  return rc;
}

extern "C" mokResult_t mokLayerTrim(mokLayer_t l, unsigned what, cudaStream_t st) {
  static const char fn[] = "mokLayerTrim";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  if (!l->gpu) return mok_error(l, mokInvalidUsage, "%s: the layer was made by mokLayerCreate (host only)", fn);
  if (what & ~(MOK_TRIM_SAVED | MOK_TRIM_SCRATCH))
    return mok_error(l, mokInvalidArgument, "%s: what = 0x%x: MOK_TRIM_SAVED (1) and MOK_TRIM_SCRATCH (2) or'ed", fn,
                     what);
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaError_t qe = cudaStreamIsCapturing(st, &cs);
  if (qe != cudaSuccess) {
    cudaGetLastError();
    return mok_error(l, mokInvalidArgument, "%s: cannot ask the stream whether it captures a CUDA graph: %s", fn,
                     cudaGetErrorString(qe));
  }
  if (cs != cudaStreamCaptureStatusNone)
    return mok_error(l, mokInvalidUsage, "%s: the stream is capturing a CUDA graph: free the blocks outside a capture",
                     fn);
  struct mok_gpu_layer *g = l->gpu;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(g->device);
  cudaError_t e = cudaSuccess, e2 = cudaSuccess;
  if ((what & MOK_TRIM_SAVED) && mok_devbuf_trim(&g->saved, st, &e)) g->fwd_valid = 0; /* (its context is gone) */
  if (what & MOK_TRIM_SCRATCH) mok_devbuf_trim(mok_comm_scratch(l->comm), st, &e2);
  if (e == cudaSuccess) e = e2;
  if (prev >= 0) cudaSetDevice(prev);
  if (e != cudaSuccess) return mok_error(l, mokCudaError, "%s: freeing the blocks failed: %s", fn, cudaGetErrorString(e));
  return mokSuccess;
}

extern "C" mokResult_t mokLayerMemoryInfo(mokLayer_t l, size_t *layer_bytes, size_t *comm_scratch_bytes) {
  static const char fn[] = "mokLayerMemoryInfo";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  if (!l->gpu) return mok_error(l, mokInvalidUsage, "%s: the layer was made by mokLayerCreate (host only)", fn);
  if (layer_bytes) *layer_bytes = l->gpu->fixed_bytes + mok_devbuf_held(&l->gpu->saved);
  if (comm_scratch_bytes) *comm_scratch_bytes = mok_devbuf_held(mok_comm_scratch(l->comm));
  return mokSuccess;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
