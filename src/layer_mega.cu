/*
 * layer_mega.cu — mokImplMega, the layer's megakernel path (docs/MEGAKERNEL.md).
 *
 * One GPU (mok_lg_mega_forward / _backward): the schedule on the device (schedule_dev.cu),
 * the forward megakernel (dispatch, the shared expert's tiles, gate+up with SwiGLU, down; one
 * persistent launch, gemm/ffn_fwd.cuh), the combine; the backward in the forward's padded
 * layout on mok's GEMMs. No host wait where the shared expert runs in the launch.
 *
 * N > 1, stage A (mok_lg_mega_ep_forward / _backward): each rank's send order in the
 * communicator's symmetric window, the expert rank's schedule composed from every source's
 * (schedule_dev.h), one host read of the rows received, the megakernel reading each row from
 * its source's window, the rows pushed back to their sources' combine slots (ep_dev.h). The
 * host orchestration of the NCCL paths is in baseline.cu, the public entry points in layer_api.cu.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "bf16.h"
#include "comm.h"
#include "ep_dev.h"
#include "layer_gpu.h"
#include "route_rows.cuh" /* defines: mok_dtopk_dy_row, mok_comb_init, mok_comb_add, mok_comb_pack */
#include "schedule_dev.h"
#include "kernels_load.h"

/* ---- kernels -------------------------------------------------------------------------- */
/* mokImplMega's combine: out[t] = bf16(base[t] + sum_j w[t,j] * y[row[t,j]]) straight
 * from the padded y (row: the route's row, -1 = empty slot), 8 columns a thread; the
 * same operations in the same order as k_combine (so bitwise its result; w NULL = 1, and
 * 1.0f * v is v). The backward's d_x: base the shared dX rows, y the dX partials, w NULL.
 * Nothing when *bad (the device schedule refused the routes). */
__global__ void k_combine_rows(const uint4 *__restrict__ base, const uint4 *__restrict__ y,
                               const int32_t *__restrict__ row, const float *__restrict__ w, int T, int k, int row_u4,
                               const int32_t *bad, uint4 *__restrict__ out) {
  if (*(const volatile int32_t *)bad) return; /* the schedule refused the routes: out stays as it was */
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x)
    for (int u = threadIdx.x; u < row_u4; u += blockDim.x) {
      float acc[8];
      uint4 b;
      if (base) b = base[t * row_u4 + u];
      mok_comb_init(acc, base ? &b : NULL);
      for (int j = 0; j < k; j++) {
        const int32_t r = row[t * k + j];
        if (r < 0) continue;
        mok_comb_add(acc, y[(int64_t)r * row_u4 + u], w ? w[t * k + j] : 1.f);
      }
      out[t * row_u4 + u] = mok_comb_pack(acc);
    }
}

/* mokImplMega's backward, one pass over the routed rows: d_topk_w[q] = <d_out[t], y[row[q]]>
 * (k_dtopk's sums, in its order), then the same row becomes dY: bf16(w[q] * d_out[t])
 * (k_dy_rows' values). One warp a route; each lane reads its y elements before it
 * overwrites them. Nothing when *bad (the device refused the forward). */
__global__ void k_dtopk_dy(const uint16_t *__restrict__ dout, const float *__restrict__ w,
                           const int32_t *__restrict__ row, int64_t routes, int k, int H, const int32_t *bad,
                           uint16_t *__restrict__ rows, float *__restrict__ dw) {
  if (*(const volatile int32_t *)bad) return;
  int lane = threadIdx.x & 31;
  for (int64_t q = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; q < routes;
       q += ((int64_t)gridDim.x * blockDim.x) >> 5) {
    const int32_t r = row[q];
    const float s = r >= 0 ? mok_dtopk_dy_row(dout + (q / k) * H, rows + (int64_t)r * H, w[q], H, lane) : 0.f;
    if (lane == 0) dw[q] = s;
  }
}

/* The megakernel's CTAs: every SM, or a share where ranks share the GPU (loopback ranks
 * in tests: each rank's launch must have all its CTAs resident beside the others'); with
 * MOK_MEGA_CTAS (diagnostics) that many shared the same way instead of the SMs. */
static void mega_ctas(mokLayer_t l, int *ctas, int *comm_ctas) {
  struct mok_gpu_layer *g = l->gpu;
  const int share = mok_comm_device_share(l->comm);
  *ctas = 0, *comm_ctas = g->mega_comm_ctas;
  if (share > 1 || g->mega_ctas > 0) {
    int sms = g->mega_ctas;
    if (sms <= 0) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g->device);
    *ctas = sms / share > 0 ? sms / share : 1;
  }
  if (*ctas > 0 && *comm_ctas > *ctas / 4) *comm_ctas = *ctas / 4 > 0 ? *ctas / 4 : 1;
}

/* The forward megakernel of a pass: m names where its rows come from (row_tok, or row_route
 * and x_src); its CTAs, the refusal flag and the shared expert's tiles (where shared_in) are
 * set here. */
static mokResult_t mega_launch(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, int shared_in,
                               const mokGemmRows_t *rows, mokFfnMega_t *m, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int T = in->num_tokens;
  m->x = T ? in->x : NULL, m->bad = g->d_bad;
  mega_ctas(l, &m->ctas, &m->comm_ctas);
  if (shared_in) {
    m->s_gate = w->s_gate, m->s_up = w->s_up, m->s_down = w->s_down;
    m->s_act = g->s_act, m->s_gu = g->s_gu, m->s_y = g->s_y, m->s_seg = g->d_shared_seg, m->tokens = T;
  }
  MOK_CHECK(mok_gemm_ffn_mega(rows, c->hidden, c->inter, c->swiglu_limit, g->xg, w->w_gate, w->w_up, w->w_down, g->act,
                              g->gu, g->yp, m, st));
  mok_lg_prof_mark(g, "megakernel", st);
  return mokSuccess;
}

/* mokImplMega, one GPU: the schedule on the device (schedule_dev.cu), the forward
 * megakernel (dispatch, the shared expert's tiles where I_s = I and s_up follows s_gate,
 * else cuBLAS before it; gate+up, down; one launch, gemm/ffn_fwd.cuh) and the combine, a
 * token once its experts' down tiles are stored, in the same launch (MOK_MEGA_COMBINE=0:
 * k_combine_rows after it, the same sums). No host wait: a bad
 * expert id is found on the device (the schedule records it in the communicator's error
 * word, mokCommGetAsyncError reports it, the megakernel writes nothing, and so does the
 * backward: see mok_lg_mega_backward). */
mokResult_t mok_lg_mega_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, mokBf16 *out,
                                cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  static const char fn[] = "mokLayerForward";
  const int El = l->local_experts, H = c->hidden, I = c->inter, Is = c->shared_inter, T = in->num_tokens;
  g->fwd_valid = 0;
  /* the shared expert as tiles of the launch: its width is the routed experts' and s_up
   * lies right after s_gate (one 4-D weight box, as the routed experts' [W_gate | W_up]) */
  const int shared_in = g->mega_shared && Is == I && T > 0 && w->s_up == w->s_gate + (size_t)Is * H;
  const pass_shape ps = mega_shape(l, T, shared_in);
  MOK_CHECK(mok_lg_pass_buffers(l, &ps, 0, st, fn));
  mokGemmRows_t rows;
  MOK_CHECK(mok_lg_gemm_rows(l, El, g->cap, g->d_seg, &rows));
  mokLocalSchedule_t s;
  memset(&s, 0, sizeof s);
  s.topk_idx = in->topk_idx;
  s.num_tokens = T, s.topk = c->topk, s.num_experts = El, s.row_pad = c->row_pad;
  s.expert_count = g->d_seg, s.expert_offset = g->d_seg + El;
  s.send_pos = g->d_pos, s.route_row = g->d_route_row, s.row_tok = g->d_row_tok, s.row_map = g->d_map;
  s.bad = g->d_bad, s.scratch = g->d_sched_scratch, s.error_word = rows.error_word, s.rank = rows.rank;
  if (shared_in) s.shared_seg = g->d_shared_seg;
  g->fwd_shared_in = shared_in;
  mok_lg_prof_mark(g, "start", st);
  MOK_CHECK(mok_schedule_local_launch(&s, st));
  mok_lg_prof_mark(g, "schedule", st);
  if (!shared_in) MOK_CHECK(mok_lg_shared_forward(l, in, w, st));
  mok_lg_prof_mark(g, "shared", st);
  mokFfnMega_t m;
  memset(&m, 0, sizeof m);
  m.row_tok = g->d_row_tok;
  if (g->mega_combine && T) { /* the combine in the launch (MOK_MEGA_COMBINE=0: its own launch after it) */
    m.route_row = g->d_route_row, m.topk_w = in->topk_w, m.topk = c->topk, m.tokens = T;
    m.base = Is ? g->s_y : NULL, m.out = out;
  }
  MOK_CHECK(mega_launch(l, in, w, shared_in, &rows, &m, st));
  if (T && !m.out)
    k_combine_rows<<<grid_for(T, 1), 128, 0, st>>>(Is ? (const uint4 *)g->s_y : NULL, (const uint4 *)g->yp,
                                                   g->d_route_row, in->topk_w, T, c->topk, H / 8, g->d_bad,
                                                   (uint4 *)out);
  CUDA_CHECK(l, cudaGetLastError());
  mok_lg_prof_mark(g, "combine", st);
  mok_lg_prof_report(g, "fwd", rows.rank);
  g->fwd_valid = 1;
  g->fwd_tokens = T;
  return mokSuccess;
}

/* ---- mokImplMega at N > 1, stage A (docs/MEGAKERNEL.md, "More than one GPU") ----------
 * What peers read or write lies in the communicator's symmetric workspace, at the same
 * offsets on every rank (workspace.h, mok_layout_ep_window; the layers of a communicator
 * share it: nothing in it lives from one pass to the next). COMB: the y (forward) or dX
 * (backward) row of each of this rank's routes, pushed by the expert rank that ran it (one
 * writer a slot); X: its tokens (forward) or d_out (backward), read by the expert ranks.
 * A pass: its inputs into the window, its send order, a cross-rank barrier; the expert
 * rank's schedule from every source's send order (mok_schedule_ep_launch); the host reads
 * the rows it received (stage A's one wait: the row buffers are sized by them), the
 * forward megakernel reads each row from its source's X; the rows pushed back to COMB,
 * a barrier, the combine from the local COMB. Stage B (the ring) removes the host wait. */
/* The window (grown where it is smaller: collective, every rank asks the same size) and
 * rank p's pointer to offset off of rank q's window, in base[q]. */
static mokResult_t ep_window_bases(mokLayer_t l, size_t off[MOK_EP_NUM], char **base) {
  const size_t need = mok_layout_ep_window(&l->cfg, off);
  size_t have = 0;
  MOK_CHECK(mokCommWorkspaceSize(l->comm, &have));
  if (have < need) MOK_CHECK(mokCommReserveWorkspace(l->comm, need));
  mokCommDev cd;
  MOK_CHECK(mok_comm_device_view(l->comm, &cd));
  for (int q = 0; q < l->cfg.num_ranks; q++) base[q] = cd.peer_base[q] + MOK_COMM_CTRL_BYTES;
  return mokSuccess;
}

/* A cross-rank barrier on st (one CTA; bounded: a missing peer becomes mokTimeout). */
static mokResult_t ep_barrier(mokLayer_t l, cudaStream_t st) {
  MOK_CHECK(mok_comm_launch_barriers(l->comm, 1, 32, 1, 0, 0, st));
  l->gpu->ep_barriers++;
  return mokSuccess;
}

/* The rows buffers of a mokImplMega forward at N > 1 that received `rows` padded rows. */
static pass_shape mega_ep_shape(mokLayer_t l, int T, int shared_in, int64_t rows) {
  return mok_shape_mega_rows(&l->cfg, T, shared_in, rows);
}

/* Orders this pass after the last users of the layer's saved block and the communicator's
 * scratch block on other streams (mok_lg_pass_buffers does too, but mokImplMega at N > 1 writes the
 * window and the layer's index arrays before it: peers' kernels of the last pass on this
 * communicator, or this layer's backward, may still read them). */
static mokResult_t order_after_last_pass(mokLayer_t l, cudaStream_t st, const char *fn) {
  MOK_CHECK(mok_devbuf_reserve(l, &l->gpu->saved, 0, st, fn, "layer's saved rows"));
  return mok_devbuf_reserve(l, mok_comm_scratch(l->comm), 0, st, fn, "communicator's scratch rows");
}

__global__ void k_copy_flag(const int32_t *src, int32_t *dst) { *dst = *(const volatile int32_t *)src; }

/* *d_bad |= any rank's flag at offset `which` of its window (FLAG in the forward, BAD in the
 * backward), recording which in error_word where not NULL; and |= 1 where the comm has an
 * error (a barrier timed out somewhere: nothing this pass computes can be trusted). */
static mokResult_t ep_any_flag(mokLayer_t l, const size_t *off, char *const *base, int which,
                               unsigned long long *error_word, const unsigned long long *comm_error, int rank,
                               cudaStream_t st) {
  mokEpFlags_t f;
  memset(&f, 0, sizeof f);
  f.num_ranks = l->cfg.num_ranks, f.rank = rank, f.flag = l->gpu->d_bad, f.error_word = error_word;
  f.comm_error = comm_error;
  for (int q = 0; q < f.num_ranks; q++) f.bad[q] = (const int32_t *)(base[q] + off[which]);
  return mok_ep_any_bad_launch(&f, st);
}

/* Steps 1 and 2 of a forward at N > 1: this rank's tokens and send order where the expert
 * ranks read them, a barrier, this rank's rows from every source's send order (capacity:
 * the rows its buffers may hold; error_word: where a bad id or a refusal is recorded, NULL
 * in stage A, where the host reads the flags: a bad id then sets only this source's BAD).
 * Ends with the pass flag (d_bad) published in FLAG for every rank's combine. */
static mokResult_t ep_send_and_compose(mokLayer_t l, const mokRankInput_t *in, const size_t *off, char *const *base,
                                       int rank, int64_t capacity, unsigned long long *error_word,
                                       const unsigned long long *comm_error, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int N = c->num_ranks, E = c->num_experts, El = l->local_experts, H = c->hidden, k = c->topk;
  const int T = in->num_tokens;
  char *me = base[rank];
  if (T) CUDA_CHECK(l, cudaMemcpyAsync(me + off[MOK_EP_X], in->x, 2 * (size_t)T * H, cudaMemcpyDeviceToDevice, st));
  mokLocalSchedule_t s;
  memset(&s, 0, sizeof s);
  s.topk_idx = in->topk_idx;
  s.num_tokens = T, s.topk = k, s.num_experts = E, s.row_pad = 1;
  s.expert_count = (int32_t *)(me + off[MOK_EP_CNT]), s.expert_offset = (int32_t *)(me + off[MOK_EP_OFF]);
  s.send_pos = g->d_pos, s.route_row = g->d_route_row, s.row_tok = g->d_ep_rowtok, s.row_map = g->d_map;
  s.bad = (int32_t *)(me + off[MOK_EP_BAD]), s.scratch = g->d_ep_scratch, s.error_word = error_word, s.rank = rank;
  MOK_CHECK(mok_schedule_local_launch(&s, st));
  MOK_CHECK(mok_schedule_send_order_launch(g->d_pos, (int64_t)T * k, s.bad, (int32_t *)(me + off[MOK_EP_ORD]), st));
  MOK_CHECK(ep_barrier(l, st));
  mokEpSchedule_t es;
  memset(&es, 0, sizeof es);
  es.num_ranks = N, es.rank = rank, es.local_experts = El, es.row_pad = c->row_pad, es.t_max = c->max_tokens;
  es.topk = k;
  for (int q = 0; q < N; q++) {
    es.count[q] = (const int32_t *)(base[q] + off[MOK_EP_CNT]);
    es.off[q] = (const int32_t *)(base[q] + off[MOK_EP_OFF]);
    es.order[q] = (const int32_t *)(base[q] + off[MOK_EP_ORD]);
    es.bad[q] = (const int32_t *)(base[q] + off[MOK_EP_BAD]);
  }
  es.capacity = capacity;
  es.expert_count = g->d_seg, es.expert_offset = g->d_seg + El, es.src_count = g->d_cnt_all;
  es.row_route = g->d_row_tok, es.flag = g->d_bad, es.error_word = error_word, es.comm_error = comm_error;
  MOK_CHECK(mok_schedule_ep_launch(&es, st));
  k_copy_flag<<<1, 1, 0, st>>>(g->d_bad, (int32_t *)(me + off[MOK_EP_FLAG]));
  CUDA_CHECK(l, cudaGetLastError());
  mok_lg_prof_mark(g, "schedule", st);
  return mokSuccess;
}

/* Stage A's host wait: into g->h_cnt the rows received, the EP schedule's flag and this
 * rank's own refusal flag. */
static mokResult_t ep_read_rows(mokLayer_t l, const char *me, const size_t *off, cudaStream_t st) {
  struct mok_gpu_layer *g = l->gpu;
  const int El = l->local_experts;
  CUDA_CHECK(l, cudaMemcpyAsync(g->h_cnt, g->d_seg + 2 * El, sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(l, cudaMemcpyAsync(g->h_cnt + 1, g->d_bad, sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(l, cudaMemcpyAsync(g->h_cnt + 2, me + off[MOK_EP_BAD], sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(l, cudaStreamSynchronize(st));
  return mokSuccess;
}

/* The sources' x table the megakernel reads (d_xsrc): written only where the window moved
 * since (never inside a CUDA graph capture: a pass before it wrote it). */
static mokResult_t ep_xsrc_table(mokLayer_t l, const size_t *off, char *const *base, cudaStream_t st, const char *fn) {
  struct mok_gpu_layer *g = l->gpu;
  const int N = l->cfg.num_ranks;
  int same = g->xsrc_n == N;
  for (int q = 0; q < N && same; q++) same = g->xsrc[q] == (const mokBf16 *)(base[q] + off[MOK_EP_X]);
  if (same) return mokSuccess;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return mok_error(l, mokInvalidUsage, "%s: mokImplMega at %d ranks: the communicator's workspace moved (or no pass "
                     "ran yet) and the stream captures a CUDA graph: run one pass before capturing", fn, N);
  }
  for (int q = 0; q < N; q++) g->xsrc[q] = (const mokBf16 *)(base[q] + off[MOK_EP_X]);
  g->xsrc_n = 0; /* (on st, not the legacy stream: a loopback peer's barrier may be waiting on it) */
  CUDA_CHECK(l, cudaMemcpyAsync((void *)g->d_xsrc, g->xsrc, sizeof(void *) * (size_t)N, cudaMemcpyHostToDevice, st));
  g->xsrc_n = N;
  return mokSuccess;
}

/* The forward's refusal of a bad expert id (every rank sees the EP schedule's flag): this
 * rank names its first bad route (topk_idx read back: an error path). */
static mokResult_t ep_refuse_ids(mokLayer_t l, const mokRankInput_t *in, int rank, cudaStream_t st, const char *fn) {
  const int E = l->cfg.num_experts, k = l->cfg.topk;
  const int64_t routes = (int64_t)in->num_tokens * k;
  int first_bad = -1; /* (which rank: every rank takes part, as every rank saw the flag) */
  MOK_CHECK(mok_lg_exchange_refusals(l, l->gpu->h_cnt[2] != 0, &first_bad, st));
  if (first_bad < 0) { /* (no rank's ids: the comm's error made the schedule refuse) */
    mokResult_t async = mokSuccess;
    mokCommGetAsyncError(l->comm, &async);
    return mok_error(l, async != mokSuccess ? async : mokInternalError, "%s: the pass was refused on the device "
                     "without a bad id (mokCommGetAsyncError: %s); nothing was written", fn, mokCommGetLastError(l->comm));
  }
  if (!l->gpu->h_cnt[2])
    return mok_error(l, mokInvalidArgument, "%s: rank %d's topk_idx held an expert id outside [-1, %d) (its "
                     "mokGetLastError says where); nothing was written", fn, first_bad, E);
  if (routes &&
      cudaMemcpyAsync(l->gpu->h_idx, in->topk_idx, 4 * (size_t)routes, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
      cudaStreamSynchronize(st) == cudaSuccess)
    for (int64_t q = 0; q < routes; q++)
      if (l->gpu->h_idx[q] < -1 || l->gpu->h_idx[q] >= E)
        return mok_error(l, mokInvalidArgument, "%s: rank %d: topk_idx[%lld, %lld] = %d is not an expert id in [0, "
                         "%d) or -1; nothing was written", fn, rank, (long long)(q / k), (long long)(q % k),
                         (int)l->gpu->h_idx[q], E);
  cudaGetLastError();
  return mok_error(l, mokInvalidArgument, "%s: rank %d: topk_idx held an expert id outside [-1, %d); nothing was "
                   "written", fn, rank, E);
}

__global__ void k_shared_seg(int32_t *seg, int T, int T_pad) { seg[0] = T, seg[1] = 0, seg[2] = T_pad; }

/* This rank's window word `which` set (all bits) on st, then `barriers` barriers launched:
 * what its peers still expect of a pass it refused or failed in. Its own errors are ignored
 * (the peers' barriers then time out, and the communicator reports that). */
static void ep_signal(mokLayer_t l, int which, int barriers, cudaStream_t st) {
  size_t off[MOK_EP_NUM];
  char *base[MOK_COMM_MAX_RANKS];
  int rank = 0;
  mokCommRankInfo(l->comm, &rank, NULL, NULL);
  if (ep_window_bases(l, off, base) != mokSuccess) return;
  if (which == MOK_EP_BAD) (void)order_after_last_pass(l, st, "mokLayer (refusal)"); /* (a pass of its own) */
  cudaMemsetAsync(base[rank] + off[which], 0xff, sizeof(int32_t), st);
  for (int b = 0; b < barriers && ep_barrier(l, st) == mokSuccess; b++) {
  }
}

/* A refusal where no host exchanges it (mokLayerSetRecvCapacity): this rank's BAD set and
 * the pass's two barriers run, so its peers see it (the forward's schedule, the backward's
 * check after its first barrier: they write nothing and record mokDeviceError) and every
 * rank's barriers stay in step. Not FLAG: a peer may still read this rank's FLAG of the last
 * forward after that forward's second barrier (BAD is read only before a pass's second
 * barrier, and written only after the previous pass's second). Ordered after the last pass,
 * and the caller's stream after it (the entry points then record pass_done). Returns rc,
 * message kept. */
mokResult_t mok_lg_mega_ep_refuse(mokLayer_t l, mokResult_t rc, cudaStream_t st) {
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  l->gpu->fwd_valid = 0;
  l->gpu->ep_barriers = 0;
  /* (on the legacy stream a loopback peer's barrier could wait behind ours: a stream of its own) */
  cudaStream_t own = NULL, caller = st;
  if ((st == 0 || st == cudaStreamLegacy) && cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) == cudaSuccess)
    st = own;
  ep_signal(l, MOK_EP_BAD, 2, st);
  if (own) { /* the caller's stream (and so the next pass, through pass_done) after these barriers */
    cudaEvent_t ev;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess) {
      if (cudaEventRecord(ev, own) == cudaSuccess) cudaStreamWaitEvent(caller, ev, 0);
      cudaEventDestroy(ev);
    }
    cudaStreamDestroy(own); /* (its work completes first) */
  }
  cudaGetLastError();
  return mok_error(l, rc, "%s", msg);
}

mokResult_t mok_lg_mega_ep_complete(mokLayer_t l, mokResult_t rc, cudaStream_t st) {
  struct mok_gpu_layer *g = l->gpu;
  if (rc == mokSuccess || !g->ep_recv_cap || g->ep_barriers >= 2) return rc;
  if (g->ep_barriers == 0) return mok_lg_mega_ep_refuse(l, rc, st);
  char msg[MOK_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", mokGetLastError());
  g->fwd_valid = 0;
  ep_signal(l, MOK_EP_FLAG, 1, st); /* (FLAG: read by the peers after the second barrier) */
  cudaGetLastError();
  return mok_error(l, rc, "%s", msg);
}

mokResult_t mok_lg_mega_ep_forward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w, mokBf16 *out,
                                   cudaStream_t st) {
  static const char fn[] = "mokLayerForward";
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int N = c->num_ranks, El = l->local_experts, H = c->hidden, I = c->inter;
  const int Is = c->shared_inter, k = c->topk, T = in->num_tokens, Tm = c->max_tokens;
  const int device_only = g->ep_recv_cap > 0; /* (mokLayerSetRecvCapacity: no host wait) */
  g->ep_barriers = 0;
  int rank = 0;
  mokCommRankInfo(l->comm, &rank, NULL, NULL);
  g->fwd_valid = 0;
  size_t off[MOK_EP_NUM];
  char *base[MOK_COMM_MAX_RANKS];
  mok_lg_prof_mark(g, "start", st);
  const int shared_in = g->mega_shared && Is == I && T > 0 && w->s_up == w->s_gate + (size_t)Is * H;
  mokResult_t ar = ep_window_bases(l, off, base);
  if (ar == mokSuccess) ar = order_after_last_pass(l, st, fn);
  if (ar == mokSuccess) ar = ep_xsrc_table(l, off, base, st, fn);
  if (device_only) {
    /* the buffers hold the capacity; a rank that cannot run refuses through the device */
    if (ar == mokSuccess) {
      const pass_shape ps = mega_ep_shape(l, T, shared_in, g->ep_recv_cap);
      ar = mok_lg_pass_buffers(l, &ps, 0, st, fn);
    }
    if (ar != mokSuccess) return mok_lg_mega_ep_refuse(l, ar, st);
    mokGemmRows_t er;
    MOK_CHECK(mok_lg_gemm_rows(l, El, g->cap, g->d_seg, &er));
    MOK_CHECK(ep_send_and_compose(l, in, off, base, rank, g->cap, g->d_status, er.error_word, st));
  } else {
    /* stage A: steps 1-3 end in an exchange of whether each rank got through them, so that
     * a rank that fails in one never leaves its peers in a host collective (a failed barrier
     * launch still makes theirs time out: the communicator then reports it) */
    mokGemmRows_t er;
    if (ar == mokSuccess) ar = mok_lg_gemm_rows(l, El, l->sched_capacity, g->d_seg, &er);
    if (ar == mokSuccess)
      ar = ep_send_and_compose(l, in, off, base, rank, l->sched_capacity, NULL, er.error_word, st);
    if (ar == mokSuccess) ar = ep_read_rows(l, base[rank], off, st);
    if (ar == mokSuccess && g->h_cnt[1] == 2) /* (cannot happen: the capacity is the worst routing's) */
      ar = mok_error(l, mokInternalError, "%s: rank %d: the expert-parallel schedule's rows exceed its capacity %lld",
                     fn, rank, (long long)l->sched_capacity);
    const int refused = ar == mokSuccess && g->h_cnt[1] == 1; /* (the same on every rank: any source's BAD) */
    if (ar == mokSuccess && !refused) { /* 3. the row buffers, sized by the rows received */
      const pass_shape ps = mega_ep_shape(l, T, shared_in, g->h_cnt[0]);
      ar = mok_lg_pass_buffers(l, &ps, 0, st, fn);
    }
    MOK_CHECK(mok_lg_agree_step(l, ar, mokInvalidArgument, fn, "failed in this forward's schedule or row buffers "
                                "(its mokGetLastError says why)", st));
    if (refused) return ep_refuse_ids(l, in, rank, st, fn);
  }
  char *me = base[rank];
  mokGemmRows_t rows;
  MOK_CHECK(mok_lg_gemm_rows(l, El, g->cap, g->d_seg, &rows));
  /* 4. the shared expert (in the launch or on cuBLAS) and the megakernel, rows read from their sources */
  if (shared_in) {
    k_shared_seg<<<1, 1, 0, st>>>(g->d_shared_seg, T, (T + c->row_pad - 1) / c->row_pad * c->row_pad);
    CUDA_CHECK(l, cudaGetLastError());
  } else {
    MOK_CHECK(mok_lg_shared_forward(l, in, w, st));
  }
  g->fwd_shared_in = shared_in;
  mokFfnMega_t m;
  memset(&m, 0, sizeof m);
  m.row_route = g->d_row_tok, m.x_src = g->d_xsrc, m.num_src = N, m.t_max = Tm, m.topk = k;
  /* 5. every y row to its source's COMB slot: inside the launch (MOK_MEGA_PUSH=1: the comm
   * CTAs push an expert's rows once its down tiles are stored), or after it */
  m.push = g->mega_push;
  m.push_off = (long long)off[MOK_EP_COMB] - (long long)off[MOK_EP_X]; /* (every rank's window alike) */
  MOK_CHECK(mega_launch(l, in, w, shared_in, &rows, &m, st));
  if (!m.push) {
    mokEpPush_t p;
    memset(&p, 0, sizeof p);
    p.num_ranks = N, p.t_max = Tm, p.topk = k, p.hidden = H, p.max_rows = g->cap;
    p.row_route = g->d_row_tok, p.rows = g->d_seg + 2 * El, p.flag = g->d_bad, p.y = g->yp;
    for (int q = 0; q < N; q++) p.dst[q] = (mokBf16 *)(base[q] + off[MOK_EP_COMB]);
    MOK_CHECK(mok_ep_push_launch(&p, st));
  }
  /* the slot map of this rank's routes */
  if (T) MOK_CHECK(mok_ep_slots_launch(in->topk_idx, (int64_t)T * k, g->d_route_row, NULL, st));
  MOK_CHECK(ep_barrier(l, st));
  /* every rank's pass flag (a rank whose rows overflowed its capacity pushed nothing) */
  MOK_CHECK(ep_any_flag(l, off, base, MOK_EP_FLAG, device_only ? g->d_status : NULL, rows.error_word, rank, st));
  mok_lg_prof_mark(g, "push", st);
  /* 6. the combine from this rank's COMB */
  if (T)
    k_combine_rows<<<grid_for(T, 1), 128, 0, st>>>(Is ? (const uint4 *)g->s_y : NULL,
                                                   (const uint4 *)(me + off[MOK_EP_COMB]), g->d_route_row,
                                                   in->topk_w, T, k, H / 8, g->d_bad, (uint4 *)out);
  CUDA_CHECK(l, cudaGetLastError());
  mok_lg_prof_mark(g, "combine", st);
  mok_lg_prof_report(g, "fwd", rank);
  g->fwd_valid = 1;
  g->fwd_tokens = T;
  return mokSuccess;
}

/* Before a backward of mokImplMega's forward whose shared expert ran on cuBLAS: a forward
 * whose routes the device schedule refused is refused here (one 4-byte read, a wait on the
 * device; the exchange of refusals has been made already). */
mokResult_t mok_lg_mega_backward_check(mokLayer_t l, cudaStream_t st) {
  static const char fn[] = "mokLayerBackward";
  struct mok_gpu_layer *g = l->gpu;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return mok_error(l, mokInvalidUsage, "%s: mokImplMega with the shared expert on cuBLAS (s_up not right after "
                     "s_gate) reads the forward's flag on the host: its backward cannot be captured in a CUDA graph; "
                     "keep [s_gate | s_up] in one allocation", fn);
  }
  CUDA_CHECK(l, cudaMemcpyAsync(g->h_cnt, g->d_bad, sizeof(int32_t), cudaMemcpyDeviceToHost, st)); /* (pinned) */
  CUDA_CHECK(l, cudaStreamSynchronize(st));
  if (g->h_cnt[0]) {
    g->fwd_valid = 0;
    if (l->cfg.num_ranks > 1)
      return mok_error(l, mokInvalidArgument, "%s: the forward was refused on the device (a rank's bad expert id or "
                       "refusal, an overflow of a receive capacity, or a comm error: mokLayerGetAsyncError and "
                       "mokCommGetAsyncError say which); it wrote nothing", fn);
    return mok_error(l, mokInvalidArgument, "%s: the forward's topk_idx held an expert id outside [-1, %d) (found on "
                     "the device; the forward wrote nothing, mokCommGetAsyncError reports where)", fn,
                     l->cfg.num_experts);
  }
  return mokSuccess;
}

/* mokImplMega's backward after dY: the four expert GEMMs (the dX rows into dxb) and the
 * shared expert: on mok's GEMMs where the forward ran it as tiles of its launch (a one-expert
 * problem over the tokens, mok_gemm_shared_backward; its dX rows bf16 in s_f32), else cuBLAS
 * (mok_lg_shared_backward, dX fp32). */
static mokResult_t mega_backward_gemms(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                       const mokBf16 *dout, const mokRankGrads_t *gr, mokBf16 *dxb, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int H = c->hidden, Is = c->shared_inter, T = in->num_tokens;
  MOK_CHECK(mok_lg_expert_backward(l, w, gr, dxb, g->d_bad, st));
  if (!(Is && T && g->fwd_shared_in)) return mok_lg_shared_backward(l, in, w, dout, gr, st);
  mokGemmRows_t sr;
  MOK_CHECK(mok_lg_gemm_rows(l, 1, (int64_t)(T + 63) / 64 * 64, g->d_shared_seg, &sr)); /* {T}, {0, T64} */
  sr.input_rows = T;
  sr.skip = g->d_bad;
  return mok_gemm_shared_backward(&sr, H, Is, c->swiglu_limit, dout, in->x, w->s_gate, w->s_up, w->s_down, g->s_gu,
                                  g->s_act, g->s_dgu, (mokBf16 *)g->s_f32, mok_lg_wgrad_dtype(l, gr), gr->d_s_gate,
                                  gr->d_s_up, gr->d_s_down, st);
}

/* d_x = bf16(the shared dX rows + the dX rows of each route): rows[d_route_row[t k + j]]
 * (the padded rows at N = 1, the COMB slots at N > 1). Nothing when the forward was refused. */
static void mega_combine_dx(mokLayer_t l, int T, const mokBf16 *rows, mokBf16 *d_x, cudaStream_t st) {
  struct mok_gpu_layer *g = l->gpu;
  const int H = l->cfg.hidden, Is = l->cfg.shared_inter, k = l->cfg.topk;
  if (!T) return;
  if (Is && g->fwd_shared_in) /* (8 columns a thread: H % 256 == 0 here) */
    k_combine_rows<<<grid_for(T, 1), 128, 0, st>>>((const uint4 *)g->s_f32, (const uint4 *)rows, g->d_route_row, NULL,
                                                   T, k, H / 8, g->d_bad, (uint4 *)d_x);
  else
    mok_lg_combine_f32(Is ? g->s_f32 : NULL, rows, g->d_route_row, T, k, H, g->d_bad, d_x, st);
}

/* mokImplMega's backward, one GPU: every row stays in the forward's padded layout (no
 * all-to-all, gather or scatter): d_topk_w from y in its rows, dY written straight into
 * them (their padding rows are zero since the forward), mok's four GEMMs, the shared
 * expert, and d_x combined from the padded dX partials through each route's row.
 * The shared expert: where the forward ran it as tiles of its launch, on mok's four GEMMs
 * too (a one-expert problem over the tokens, mok_gemm_shared_backward; its dX rows bf16);
 * else cuBLAS (mok_lg_shared_backward, dX fp32) — then the routed part is mokImplNccl's backward on
 * the same rows, and every result bitwise its.
 * No host wait where the shared expert ran in the launch or there is none: every kernel
 * reads the schedule's refusal flag (d_bad) at its start and writes nothing when it is set.
 * With the shared expert on cuBLAS the caller first checks the flag on the host
 * (mok_lg_mega_backward_check). */
mokResult_t mok_lg_mega_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                 const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int H = c->hidden, k = c->topk;
  const int T = in->num_tokens;
  const int64_t routes = (int64_t)T * k;
  mok_lg_prof_mark(g, "start", st);
  if (routes)
    k_dtopk_dy<<<grid_for(routes * 32, 256), 256, 0, st>>>(dout, in->topk_w, g->d_route_row, routes, k, H, g->d_bad,
                                                            g->yp, gr->d_topk_w);
  mok_lg_prof_mark(g, "dtopk+dy", st);
  mokBf16 *dxb = (mokBf16 *)g->f32;
  MOK_CHECK(mega_backward_gemms(l, in, w, dout, gr, dxb, st));
  mega_combine_dx(l, T, dxb, gr->d_x, st);
  CUDA_CHECK(l, cudaGetLastError());
  mok_lg_prof_mark(g, "shared+combine", st);
  int rank = 0;
  mokCommRankInfo(l->comm, &rank, NULL, NULL);
  mok_lg_prof_report(g, "bwd", rank);
  return mokSuccess;
}

/* mokImplMega's backward at N > 1 (stage A; the window as in mok_lg_mega_ep_forward): d_out and
 * topk_w where the expert ranks read them (the dropped routes' d_topk_w zeroed here, the
 * routed ones written by the expert ranks), a barrier; on every expert rank d_topk_w and dY
 * from its rows' sources (mok_ep_dtopk_dy_launch: k_dtopk_dy's arithmetic), the four GEMMs
 * and the shared expert as at N = 1, the dX rows pushed to their sources' COMB; a barrier;
 * d_x combined from the local COMB with weights 1, d_topk_w copied out; all of it nothing
 * where the forward or a rank's backward was refused (d_bad). No host wait of its own
 * (mokLayerBackward's exchange of refusals before it waits, unless a receive capacity is
 * set: then a refusing rank sets its BAD flag, mok_lg_mega_ep_refuse). */
mokResult_t mok_lg_mega_ep_backward(mokLayer_t l, const mokRankInput_t *in, const mokRankWeights_t *w,
                                    const mokBf16 *dout, const mokRankGrads_t *gr, cudaStream_t st) {
  const mokConfig_t *c = &l->cfg;
  struct mok_gpu_layer *g = l->gpu;
  const int N = c->num_ranks, El = l->local_experts, H = c->hidden, k = c->topk;
  const int T = in->num_tokens, Tm = c->max_tokens;
  const int64_t routes = (int64_t)T * k;
  int rank = 0;
  mokCommRankInfo(l->comm, &rank, NULL, NULL);
  g->ep_barriers = 0;
  size_t off[MOK_EP_NUM];
  char *base[MOK_COMM_MAX_RANKS];
  MOK_CHECK(ep_window_bases(l, off, base));
  char *me = base[rank];
  mok_lg_prof_mark(g, "start", st);
  if (T) {
    CUDA_CHECK(l, cudaMemcpyAsync(me + off[MOK_EP_X], dout, 2 * (size_t)T * H, cudaMemcpyDeviceToDevice, st));
    CUDA_CHECK(l, cudaMemcpyAsync(me + off[MOK_EP_W], in->topk_w, 4 * (size_t)routes, cudaMemcpyDeviceToDevice, st));
    MOK_CHECK(mok_ep_slots_launch(in->topk_idx, routes, g->d_route_row, (float *)(me + off[MOK_EP_DW]), st));
  }
  /* this rank's d_out is there (a rank that refuses its backward sets BAD instead:
   * mok_lg_mega_ep_refuse; where no host exchanged refusals, every rank then writes nothing) */
  CUDA_CHECK(l, cudaMemsetAsync(me + off[MOK_EP_BAD], 0, sizeof(int32_t), st));
  MOK_CHECK(ep_barrier(l, st));
  mokGemmRows_t er;
  MOK_CHECK(mok_lg_gemm_rows(l, El, g->cap, g->d_seg, &er));
  MOK_CHECK(ep_any_flag(l, off, base, MOK_EP_BAD, g->ep_recv_cap ? g->d_status : NULL, er.error_word, rank, st));
  k_copy_flag<<<1, 1, 0, st>>>(g->d_bad, (int32_t *)(me + off[MOK_EP_FLAG])); /* (for the check after barrier 2) */
  CUDA_CHECK(l, cudaGetLastError());
  mokEpPull_t p;
  memset(&p, 0, sizeof p);
  p.num_ranks = N, p.t_max = Tm, p.topk = k, p.hidden = H, p.max_rows = g->cap;
  p.row_route = g->d_row_tok, p.rows = g->d_seg + 2 * El, p.flag = g->d_bad, p.y = g->yp;
  for (int q = 0; q < N; q++) {
    p.d_out[q] = (const mokBf16 *)(base[q] + off[MOK_EP_X]), p.topk_w[q] = (const float *)(base[q] + off[MOK_EP_W]);
    p.d_topk_w[q] = (float *)(base[q] + off[MOK_EP_DW]);
  }
  MOK_CHECK(mok_ep_dtopk_dy_launch(&p, st));
  mok_lg_prof_mark(g, "dtopk+dy", st);
  mokBf16 *dxb = (mokBf16 *)g->f32;
  MOK_CHECK(mega_backward_gemms(l, in, w, dout, gr, dxb, st));
  mokEpPush_t q;
  memset(&q, 0, sizeof q);
  q.num_ranks = N, q.t_max = Tm, q.topk = k, q.hidden = H, q.max_rows = g->cap;
  q.row_route = g->d_row_tok, q.rows = g->d_seg + 2 * El, q.flag = g->d_bad, q.y = dxb;
  for (int r = 0; r < N; r++) q.dst[r] = (mokBf16 *)(base[r] + off[MOK_EP_COMB]);
  MOK_CHECK(mok_ep_push_launch(&q, st));
  MOK_CHECK(ep_barrier(l, st));
  /* every rank's pass flag again: a rank that failed between the barriers pushed nothing */
  MOK_CHECK(ep_any_flag(l, off, base, MOK_EP_FLAG, g->ep_recv_cap ? g->d_status : NULL, er.error_word, rank, st));
  mok_lg_prof_mark(g, "push", st);
  mega_combine_dx(l, T, (const mokBf16 *)(me + off[MOK_EP_COMB]), gr->d_x, st);
  MOK_CHECK(mok_ep_copy_f32_launch((const float *)(me + off[MOK_EP_DW]), gr->d_topk_w, routes, g->d_bad, st));
  CUDA_CHECK(l, cudaGetLastError());
  mok_lg_prof_mark(g, "shared+combine", st);
  mok_lg_prof_report(g, "bwd", rank);
  return mokSuccess;
}

/* Its kernels and device variables, for mok_kernels_load (kernels_load.h). */
extern "C" mokKernelAnchor mok_anchor_layer_mega(void) {
  mokKernelAnchor a = {"src/layer_mega.cu", (const void *)k_copy_flag, {NULL}};
  return a;
}
