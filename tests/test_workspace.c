/*
 * test_workspace.c — the layouts of a pass's row buffers (src/workspace.c), host only:
 * on random configs and pass shapes of every path, every buffer a pass uses lies inside
 * its block, 256-byte aligned, apart from every other, with the bytes its kernels touch;
 * the buffers a path does not use are absent; the forward's scratch reservation covers
 * its backward's.
 */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "util.h"
#include "internal.h"
#include "workspace.h"

/* Bytes each buffer needs (the kernels' extents: rows x columns x element size). */
static void saved_need(const mokConfig_t *c, const mok_pass_shape *p, int64_t need[MOK_SV_NUM]) {
  const int64_t H = c->hidden, I = c->inter, Is = c->shared_inter, R = p->rows, T64 = (p->tokens + 63) / 64 * 64;
  const int mega = p->impl == mokImplMega;
  int64_t n[MOK_SV_NUM] = {2 * R * H, 4 * R * I, 2 * R * I, mega ? 2 * R * H : 0, mega ? 0 : 2 * p->routes * H,
                           4 * T64 * Is, 2 * T64 * Is};
  memcpy(need, n, sizeof n);
}

static void scratch_need(const mokConfig_t *c, const mok_pass_shape *p, int bwd, int64_t need[MOK_SC_NUM]) {
  const int64_t H = c->hidden, I = c->inter, Is = c->shared_inter, R = p->rows, T64 = (p->tokens + 63) / 64 * 64;
  const int mega = p->impl == mokImplMega, cublas = p->impl == mokImplBaseline, clamp = c->swiglu_limit > 0;
  int64_t n[MOK_SC_NUM] = {
      mega ? 0 : 2 * p->routes * H,                         /* send */
      mega ? 0 : 2 * p->recv * H,                           /* recv */
      mega ? 0 : 2 * R * H,                                 /* yp */
      !bwd && cublas && clamp ? 8 * R * I : 0,              /* gu32 */
      !bwd && Is ? 2 * T64 * H : 0,                         /* s_y */
      !bwd && Is && clamp && !p->shared_in ? 8 * T64 * Is : 0, /* s_gu32 */
      bwd ? (cublas ? 4 * R * (I > H ? I : H) : 2 * R * H) : 0, /* f32: dA / dX fp32, or bf16 dX */
      bwd ? 4 * R * I : 0,                                  /* dgu */
      bwd && Is ? 4 * T64 * (Is > H ? Is : H) : 0,          /* s_f32 */
      bwd && Is ? 4 * T64 * Is : 0};                        /* s_dgu */
  memcpy(need, n, sizeof n);
}

/* off/need of n buffers inside [0, total): aligned, disjoint, absent where need is 0. */
static void check_block(test_ctx *t, const size_t *off, const int64_t *need, int n, size_t total, const char *what) {
  for (int i = 0; i < n; i++) {
    if (!need[i]) {
      CHECK_MSG(off[i] == MOK_LAYOUT_NONE, "%s buffer %d: present (offset %zu) where the pass has none", what, i, off[i]);
      continue;
    }
    CHECK_MSG(off[i] != MOK_LAYOUT_NONE, "%s buffer %d: absent, needs %lld bytes", what, i, (long long)need[i]);
    CHECK_MSG(off[i] % 256 == 0 && off[i] + (size_t)need[i] <= total, "%s buffer %d: [%zu, +%lld) in %zu bytes", what,
              i, off[i], (long long)need[i], total);
    for (int j = 0; j < i; j++)
      if (need[j])
        CHECK_MSG(off[i] >= off[j] + (size_t)need[j] || off[j] >= off[i] + (size_t)need[i],
                  "%s buffers %d and %d overlap", what, j, i);
  }
}

_Static_assert(MOK_SV_NUM <= 16 && MOK_SC_NUM <= 16, "the test's arrays");

MOK_TEST(workspace_layouts_fit_every_path) {
  rng_t r = {test_seed() ^ 0x3a7};
  static const mokImpl_t impls[] = {mokImplMega, mokImplNccl, mokImplBaseline};
  for (int it = 0; it < 400 && !t->failed; it++) {
    mokConfig_t c = MOK_CONFIG_INITIALIZER;
    c.num_ranks = 1 << rng_int(&r, 4);
    c.num_experts = c.num_ranks * (1 + rng_int(&r, 64));
    c.hidden = 64 * (1 + rng_int(&r, 120)), c.inter = 64 * (1 + rng_int(&r, 50));
    c.shared_inter = rng_int(&r, 3) ? 64 * rng_int(&r, 50) : 0;
    c.topk = 1 + rng_int(&r, 8 < c.num_experts ? 8 : c.num_experts);
    c.max_tokens = 1 + rng_int(&r, 9000);
    c.swiglu_limit = rng_int(&r, 2) ? 7.0f : 0.f;
    mokConfig_t v;
    CHECK_MSG(mok_config_validate(&c, &v) == mokSuccess, "%s", mokGetLastError());
    const mokImpl_t impl = impls[rng_int(&r, v.num_ranks > 1 ? 2 : 3) + (v.num_ranks > 1)];
    const int64_t T = rng_int(&r, v.max_tokens + 1);
    const int worst = rng_int(&r, 2);
    mok_pass_shape p = impl == mokImplMega
                           ? mok_shape_mega(&v, T, rng_int(&r, 2))
                           : mok_shape_spread(&v, impl, T, (worst ? v.num_ranks : 1) * T * v.topk, worst);
    if (impl != mokImplMega && rng_int(&r, 2)) p.routes -= rng_int(&r, (int)p.routes + 1); /* (-1 slots) */
    CHECK_MSG(p.rows >= v.row_pad && p.rows % v.row_pad == 0 && p.rows >= p.recv, "rows %lld recv %lld",
              (long long)p.rows, (long long)p.recv);
    size_t off[16];
    int64_t need[16];
    size_t total = mok_layout_saved(&v, &p, off);
    CHECK(total == mok_layout_saved(&v, &p, NULL));
    saved_need(&v, &p, need);
    check_block(t, off, need, MOK_SV_NUM, total, "saved");
    if (t->failed) return;
    size_t most = 0;
    for (int bwd = 0; bwd < 2; bwd++) {
      total = mok_layout_scratch(&v, &p, bwd, off);
      most = total > most ? total : most;
      scratch_need(&v, &p, bwd, need);
      check_block(t, off, need, MOK_SC_NUM, total, bwd ? "backward scratch" : "forward scratch");
      if (t->failed) return;
    }
    CHECK(mok_scratch_need(&v, &p) == most);
  }
}

/* mokImplMega's window at N > 1 (mok_layout_ep_window): every region 256-byte aligned, in
 * order, each at least its bytes (BAD, FLAG at fixed offsets, CNT [E], OFF [E + 1], ORD [T_max k] int32; X
 * [T_max, H] bf16; W, DW [T_max k] f32; COMB [T_max k, H] bf16), the total past the last;
 * and mok_shape_mega_rows keeps at least row_pad rows. */
MOK_TEST(workspace_ep_window_layout) {
  rng_t r = {test_seed() ^ 0xe9};
  for (int it = 0; it < 200 && !t->failed; it++) {
    mokConfig_t c = MOK_CONFIG_INITIALIZER;
    c.num_experts = 1 + rng_int(&r, 512), c.hidden = 64 * (1 + rng_int(&r, 128)), c.topk = 1 + rng_int(&r, 16);
    c.max_tokens = rng_int(&r, 20000), c.row_pad = 64;
    size_t off[MOK_EP_NUM];
    const size_t total = mok_layout_ep_window(&c, off);
    CHECK(total == mok_layout_ep_window(&c, NULL));
    const size_t Q = (size_t)c.max_tokens * c.topk, H = (size_t)c.hidden, E = (size_t)c.num_experts;
    const size_t need[MOK_EP_NUM] = {4, 4, 4 * E, 4 * (E + 1), 4 * Q, 2 * (size_t)c.max_tokens * H, 4 * Q, 4 * Q,
                                     2 * Q * H};
    for (int i = 0; i < MOK_EP_NUM; i++) {
      const size_t end = i + 1 < MOK_EP_NUM ? off[i + 1] : total;
      CHECK_MSG(off[i] % 256 == 0 && end >= off[i] + need[i], "E %d H %d k %d T %d: region %d at %zu..%zu needs %zu",
                c.num_experts, c.hidden, c.topk, c.max_tokens, i, off[i], end, need[i]);
    }
    CHECK(off[MOK_EP_BAD] == 0 && off[MOK_EP_FLAG] == 256); /* (the same for every config) */
    const mok_pass_shape p = mok_shape_mega_rows(&c, c.max_tokens, 0, rng_int(&r, 3) ? rng_int(&r, 100000) : 0);
    CHECK(p.rows >= c.row_pad && p.impl == mokImplMega && p.tokens == c.max_tokens);
  }
}
