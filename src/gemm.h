/*
 * gemm.h — host launchers of the grouped expert GEMMs (internal; C11-compatible).
 *
 * Row layout (DESIGN.md 2a): on an expert-owning rank, rows are expert-sorted; expert e
 * owns rows [expert_offset[e], expert_offset[e+1]) of every row-indexed tensor, a segment
 * padded with ZERO rows to a multiple of row_pad (P). expert_offset lives on the device
 * and is never read by the host: grids are sized by `capacity` and tiles past the rows in
 * use exit at once. Empty experts have empty segments.
 *
 * Tensors (bf16 = mokBf16 bit patterns, row-major, device pointers, 16-byte aligned):
 *   x    [capacity, H]    act [capacity, I]   y  [capacity, H]   dy [capacity, H]
 *   gu   [capacity, 2I]   saved pre-activations: g in columns [0, I), u in [I, 2I)
 *   dgu  [capacity, 2I]   dg in columns [0, I), du in [I, 2I)
 *   dx   [capacity, H]    routed d_x partial rows
 *   w_gate, w_up [E_l, I, H]; w_down [E_l, H, I]; weight gradients in the same shapes,
 *   bf16 or fp32 (grad_dtype), overwritten, never accumulated; an expert with no rows
 *   gets zeros.
 * Numerics: fp32 accumulation; SwiGLU with the optional clamp L (0 = off) exactly as
 * include/mok.h documents; every sum over rows runs in one fixed order (no split-K, no
 * atomics), so every output is bitwise reproducible.
 *
 * Every launcher: validates its arguments (mokInvalidArgument with a message, nothing
 * launched), sizes a persistent grid from the device's SM count, launches on `stream`
 * and checks the launch. Nothing is synchronised; no host-visible result but the status.
 * Tiles are handed to the CTAs at run time (a per-launch ticket counter), which changes
 * no result: every output element is written by one tile, reduced in a fixed order.
 * Launches may overlap on different streams.
 *
 * Device errors: every wait inside the kernels is bounded (10 s). A wait that runs out
 * records MOK_ERRWORD(MOK_DEVERR_TIMEOUT, MOK_WAIT_GEMM_*, rank, tile) into
 * rows->error_word (NULL: the GEMM module's own word, read by mok_gemm_error_word) and
 * the kernel ends; its outputs are then undefined. A recorded word also stops later
 * launches that use it at their first wait (sticky, as in the communicator).
 */
#ifndef MOK_GEMM_H
#define MOK_GEMM_H

#include "mok.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The rows the GEMMs run over. */
typedef struct mokGemmRows {
  int num_experts;              /* E_l, 1 .. MOK_GEMM_MAX_EXPERTS */
  int64_t capacity;             /* rows allocated in each row-indexed tensor; < 2^31 */
  const int32_t *expert_offset; /* device [E_l + 1]; multiples of 64, nondecreasing,
                                   expert_offset[E_l] <= capacity */
  const int32_t *expert_count;  /* device [E_l] routed rows of each expert (the first rows of
                                   its segment; the rest is zero padding), or NULL. Given, the
                                   forward GEMMs on token tiles compute only the routed rows
                                   rounded up to 32 and write zeros on the other padding rows
                                   (same results, less work); NULL: every segment row */
  unsigned long long *error_word; /* device error word for timeouts (the communicator's, so
                                     mokCommGetAsyncError reports them); NULL: the module's */
  int rank;                       /* written into an error word */
  const int32_t *expert_count_host; /* optional: expert_count's values in host memory, read during
                                       the call (the forward down GEMM picks its stage ring from them:
                                       mok_gemm_debug_tok_ring); NULL: unknown */
  int64_t input_rows; /* 0, or the rows that x (gate+up forward, gate+up wgrad) and dy (down dgrad,
                         down wgrad) hold where fewer than capacity (a one-expert problem straight
                         on the caller's tokens: the shared expert): their TMA maps end there and
                         read zeros past it, so the padding rows stay zero; 0 .. capacity */
  const int32_t *skip; /* device flag or NULL: nonzero when a backward launch (dgrad, wgrad)
                          starts = that launch writes nothing (every CTA ends at once). The
                          megakernel path's backward after a forward the device refused */
} mokGemmRows_t;

#define MOK_GEMM_MAX_EXPERTS 1024
#define MOK_GEMM_MAX_SOURCES 72 /* the megakernel's source ranks (mokFfnMega_t's x_src) */
/* The row padding the tiles are built for: 64 (one warpgroup's rows). Larger multiples of
 * 64 work too; 64 keeps the padding waste at <= 63 rows per expert. */
#define MOK_GEMM_ROW_PAD 64

typedef enum mokGemmKind {
  mokGemmGateUpFwd = 0,   /* act = bf16(silu(g) * u), gu = bf16(g, u); [g u] = x [W_gate; W_up]^T */
  mokGemmDownFwd = 1,     /* y = bf16(act W_down^T) */
  mokGemmDownDgrad = 2,   /* da = dy W_down; dgu = bf16(SwiGLU backward(da, gu)) */
  mokGemmGateUpDgrad = 3, /* dx = bf16(dg W_gate + du W_up), one pass over K = 2I */
  mokGemmWgradGateUp = 4, /* dW_gate[e] = dg^T x, dW_up[e] = du^T x over expert e's rows */
  mokGemmWgradDown = 5,   /* dW_down[e] = dy^T act over expert e's rows */
  mokGemmNumKinds = 6
} mokGemmKind_t;

/* The tile shape of one GEMM kind, chosen by one rule from (H, I): forward gate+up and
 * down use token tiles where the weight side divides into whole 128-output (gate+up) or
 * 256-output (down) blocks; otherwise, and for the backward kinds, BM = 128 rows (two
 * consumer warpgroups of 64), BK = 64, BN from {256, 192, 128} (output columns; for
 * gate+up the tile holds BN/2 gate and BN/2 up columns) minimising the padded output
 * width, ties to the wider tile; stages = as many as fit in shared memory. */
typedef struct mokGemmTileShape {
  int token;      /* 1: token tiles (forward gate+up when I % 128 == 0, down when H % 256 == 0):
                     bm = 256 weight rows, bn = 176 = the most rows of a tile (rows are cut
                     per expert into even tiles of 16-176 rows), out_cols = 128 / 256 */
  int bm, bn, bk, stages;
  int out_cols;   /* output columns of one tile (bn, or bn/2 for gate+up) */
  int smem_bytes; /* dynamic shared memory per CTA for num_experts = MOK_GEMM_MAX_EXPERTS */
} mokGemmTileShape_t;

/* [OUT] shape. Host only, no device work. */
mokResult_t mok_gemm_tile_shape(mokGemmKind_t kind, int hidden, int inter, mokGemmTileShape_t *shape);

/* Forward gate+up with the SwiGLU epilogue. gu may be NULL (nothing saved). */
mokResult_t mok_gemm_gateup_fwd(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                const mokBf16 *x, const mokBf16 *w_gate, const mokBf16 *w_up,
                                mokBf16 *act, mokBf16 *gu, cudaStream_t stream);
/* Forward down GEMM. */
mokResult_t mok_gemm_down_fwd(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *act,
                              const mokBf16 *w_down, mokBf16 *y, cudaStream_t stream);
/* The routed experts' forward, gate+up (SwiGLU) then down, results bitwise those of the
 * two calls above: one persistent launch (src/gemm/ffn_fwd.cuh: a down tile of an expert
 * starts once that expert's gate+up tiles have stored act) where both kinds run token
 * tiles, W_up lies after W_gate (one 4-D TMA box) and the rule (mok_gemm_debug_ffn) picks
 * it, else the two launches. */
mokResult_t mok_gemm_ffn_fwd(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                             const mokBf16 *x, const mokBf16 *w_gate, const mokBf16 *w_up, const mokBf16 *w_down,
                             mokBf16 *act, mokBf16 *gu, mokBf16 *y, cudaStream_t stream);
/* The forward megakernel's part beyond the two GEMMs (src/gemm/ffn_fwd.cuh, FfnMega):
 * its last comm_ctas CTAs dispatch x's rows into the rows operand xg (row_tok: the token
 * of every row in use, -1 on padding rows, which get zeros), and the gate+up tiles of an
 * expert start once all its rows are there. */
typedef struct mokFfnMega {
  const mokBf16 *x;          /* [tokens, H] (device; NULL only when every row is padding) */
  const int32_t *row_tok;    /* [capacity] (device; rows past expert_offset[E_l] unread);
                                NULL where row_route is given */
  /* Expert parallel (N > 1), or row_route NULL (one GPU: row_tok): row r's route id
   * (s * t_max + t) * topk + j (mokEpSchedule_t's row_route; -1 on padding rows, which get
   * zeros) names its token, row t of source s's x, read through x_src[s] (a device array of
   * num_src pointers: the sources' copies of x in their windows, peers' over NVLink) */
  const int32_t *row_route;
  const mokBf16 *const *x_src;
  int num_src, t_max, topk;
  int ctas;                  /* CTAs of the launch, comm CTAs included; 0: one per SM (ranks
                                sharing a GPU, as loopback ranks do, take a share each) */
  const int32_t *bad;        /* device flag: nonzero = the schedule refused its input, the
                                launch writes nothing */
  int comm_ctas;             /* 1 .. SMs - 1 */
  /* The shared expert (I_s = inter) as tiles of the launch, or s_gate NULL (the caller runs
   * it): the tokens x [tokens, H] through s_gate | s_up (s_up right after s_gate) and s_down,
   * into s_act [, I], s_gu [, 2I] and s_y [, H], each of at least tokens rounded up to 64
   * rows (rows past tokens are not written); s_seg: the schedule's shared_seg (device). */
  const mokBf16 *s_gate, *s_up, *s_down;
  mokBf16 *s_act, *s_gu, *s_y;
  const int32_t *s_seg;
  int tokens;
  /* The combine inside the launch (one GPU: row_tok, not row_route), or out NULL (the
   * caller combines after it): out[t] = bf16(base[t] + sum_j topk_w[t, j] y[route_row[t,
   * j]]) over the routes with a row (k_combine_rows' sums, bitwise), a token once the down
   * tiles of every expert it routes to (and the shared expert's, where they run in the
   * launch) are stored. base: [tokens, H] or NULL (zeros); s_y where the shared expert
   * runs in the launch. topk: the routes a token. */
  const int32_t *route_row; /* [tokens * topk] (device), -1: no row */
  const float *topk_w;      /* [tokens * topk] (device) */
  const mokBf16 *base;
  mokBf16 *out;             /* [tokens, H] (device) */
  /* Expert parallel (row_route): push 1 sends every y row to its source inside the launch,
   * route (s, t, j) to slot t * topk + j of the rows that begin push_off bytes after x_src[s]
   * (mok_ep_push_launch's copy), a row once its expert's down tiles are stored, by the comm
   * CTAs after their dispatch (they then run no tiles); push 0: the caller pushes after it. */
  int push;
  long long push_off;
} mokFfnMega_t;

/* The forward megakernel's expert part on one GPU (EP1): dispatch, gate+up (SwiGLU) and
 * down in one persistent launch; act, gu and y bitwise mok_gemm_ffn_fwd's on the same
 * rows; xg is written (the gathered rows, saved for the backward). Needs token tiles for
 * both kinds (I % 128 == 0, H % 256 == 0), W_up right after W_gate (mok.h's layout hint)
 * and no GEMM diagnostics on: else mokNotSupported. */
mokResult_t mok_gemm_ffn_mega(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit, mokBf16 *xg,
                              const mokBf16 *w_gate, const mokBf16 *w_up, const mokBf16 *w_down, mokBf16 *act,
                              mokBf16 *gu, mokBf16 *y, const mokFfnMega_t *mega, cudaStream_t stream);

/* Backward: data gradient through W_down with the SwiGLU backward epilogue. */
mokResult_t mok_gemm_down_dgrad(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                const mokBf16 *dy, const mokBf16 *w_down, const mokBf16 *gu,
                                mokBf16 *dgu, cudaStream_t stream);
/* Backward: data gradient through W_gate and W_up, accumulated in one pass. */
mokResult_t mok_gemm_gateup_dgrad(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *dgu,
                                  const mokBf16 *w_gate, const mokBf16 *w_up, mokBf16 *dx,
                                  cudaStream_t stream);
/* Backward: weight gradients of W_gate and W_up (one launch). dw_* are mokBf16 or float
 * per grad_dtype; mokDtypeFP32 | MOK_GEMM_ACCUMULATE adds them to what dw_* hold (each
 * tile's fp32 sums reach memory by a TMA reduce-add: one fp32 add an element, one writer,
 * so bitwise g + (the overwritten result)) instead of overwriting it. */
#define MOK_GEMM_ACCUMULATE 0x100
mokResult_t mok_gemm_wgrad_gateup(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *dgu,
                                  const mokBf16 *x, mokDtype_t grad_dtype, void *dw_gate, void *dw_up,
                                  cudaStream_t stream);
/* Backward: weight gradient of W_down. */
mokResult_t mok_gemm_wgrad_down(const mokGemmRows_t *rows, int hidden, int inter, const mokBf16 *dy,
                                const mokBf16 *act, mokDtype_t grad_dtype, void *dw_down,
                                cudaStream_t stream);

/* The shared expert's backward on the four backward kinds above, as a one-expert problem of
 * `tokens` rows (rows: num_experts 1, capacity >= tokens rounded up to 64, expert_count /
 * expert_offset = {tokens} / {0, capacity-or-less} on the device (the schedule's shared_seg),
 * input_rows = tokens, skip as above). dy and x: the caller's [tokens, H]; gu and act: the
 * forward's saved rows, zero on the padding rows (the megakernel's shared tiles write them so);
 * dgu [capacity, 2I] and dx [capacity, H] bf16 (scratch; dx: the shared d_x rows); weight
 * gradients [I, H], [I, H], [H, I] in grad_dtype. Results: the same tiles as the routed
 * experts', bitwise reproducible. */
mokResult_t mok_gemm_shared_backward(const mokGemmRows_t *rows, int hidden, int inter, float swiglu_limit,
                                     const mokBf16 *dy, const mokBf16 *x, const mokBf16 *s_gate,
                                     const mokBf16 *s_up, const mokBf16 *s_down, const mokBf16 *gu,
                                     const mokBf16 *act, mokBf16 *dgu, mokBf16 *dx, mokDtype_t grad_dtype,
                                     void *dw_gate, void *dw_up, void *dw_down, cudaStream_t stream);

/* [OUT] word: the module's device error word (0 = none; see above). Waits for the device
 * (cudaMemcpyFromSymbol). clear != 0 zeroes a recorded word. */
mokResult_t mok_gemm_error_word(unsigned long long *word, int clear);
/* Tests: the wait budget of later launches (0 = the default 10 s) and a tile index whose
 * loads the producer never issues (-1 = off), to provoke a timeout. Process-wide. */
mokResult_t mok_gemm_debug_set(unsigned long long timeout_ns, int stall_tile);
/* Timing diagnostics of the token-tile epilogue (forward gate+up and down; their outputs
 * are WRONG while it is on): 1 = everything but the TMA stores, 2 = no epilogue at all,
 * 0 = off (the default). Process-wide. */
mokResult_t mok_gemm_debug_epilogue(int mode);
/* Benchmarks: how tiles reach CTAs: 0 = the library's rule, 1 = static round-robin,
 * 2 = run-time tickets; split_tail: 64-row tails of 256-wide tiles split by columns over
 * both warpgroups (1, the default) or run on one. Process-wide. */
mokResult_t mok_gemm_debug_sched(int mode, int split_tail);
/* Benchmarks: the raster group of the row-grouped kinds, in row tiles of one expert (0 =
 * the default 8; 1 << 20 = plain output-block-major order), the most 16-row units of a
 * forward token tile (0 = the default 11, i.e. 176 rows), and the mix order of token tiles
 * under tickets (grouped_gemm.cuh mix_tile; 0 = the library's rule (down: on, gate+up:
 * off), 1 = on, 2 = off).
 * Process-wide. */
mokResult_t mok_gemm_debug_tiles(int raster, int tok_units, int mix);
/* Benchmarks: forward token tiles in CTA pairs (2-CTA clusters that load the operand two
 * tiles share once, by TMA multicast): 0 = the library's rule, 1 = on, 2 = off, 3 = pairs
 * without multicast (each CTA loads all it reads; diagnostics). Pairs need
 * an even number of output blocks (I / 128 for gate+up, H / 256 for down); elsewhere
 * tiles run alone whatever the mode. Process-wide. */
mokResult_t mok_gemm_debug_pairs(int mode);
/* Diagnostics: later forward token-tile launches append one record per tile to buf (device
 * memory of 1 + 4 * cap words, buf[0] zeroed by the caller: it counts the records taken):
 * record i at buf + 1 + 4i = {start ns, end ns (%globaltimer), CTA << 32 | tile index,
 * expert << 32 | rows << 16 | output block (of 128 columns)}; records past cap are dropped.
 * NULL turns it off. Process-wide. */
mokResult_t mok_gemm_debug_trace(unsigned long long *buf, int cap);
/* Benchmarks: forward token tiles of expert 0 cut half as large (at most (U + 1) / 2 units
 * of 16 rows), so that the CTAs running them go out of step with the others: 0 = the
 * library's rule, 1 = on, 2 = off. Process-wide. */
mokResult_t mok_gemm_debug_stagger(int mode);
/* mok_gemm_ffn_fwd: 0 = the rule (fused where the down GEMM takes its 176-row stages:
 * gemm.cu ffn_rule), 1 = one fused launch wherever it can run, 2 = two launches.
 * Process-wide. */
mokResult_t mok_gemm_debug_ffn(int mode);
/* [OUT] n: fused launches mok_gemm_ffn_fwd made so far in this process (tests). */
mokResult_t mok_gemm_debug_ffn_launches(unsigned long long *n);
/* Benchmarks: forward token tiles load their rows in 128-row TMA boxes first, then 32-row
 * ones and a 16 (1), or in 32-row boxes (2); 0 = the library's rule (gate+up 128, down 32).
 * Process-wide. */
mokResult_t mok_gemm_debug_row_box128(int mode);
/* Benchmarks: L2 promotion of the forward token tiles' TMA loads, in bytes (0, 64, 128 or
 * 256), of the weights and of the rows; -1 = the library's rule (256). Process-wide. */
mokResult_t mok_gemm_debug_l2_promotion(int weights, int rows);
/* Diagnostics: mix order of token tiles (not pairs) splits the CTAs: about `ctas` of them
 * run the tiles of experts of one tile per output block, the others the rest, each class
 * from its own ticket counter; 0 = the library's rule for how many, -1 = no split (those
 * tiles spread evenly over the one order). Process-wide. */
mokResult_t mok_gemm_debug_mix_ctas(int ctas);
/* Diagnostics: launches run on at most `ctas` CTAs (0 = the default: one an SM, or fewer
 * where there are fewer tiles), e.g. to time a few SMs' streams with the rest of the chip
 * idle. CTA pairs keep an even count. Process-wide. */
mokResult_t mok_gemm_debug_grid(int ctas);
/* Benchmarks: forward token tiles of at most `rows` rows (and at most 96) give each pipeline
 * stage back as soon as their own MMAs on it are done (one more stage of loads in flight);
 * 0 = never, -1 = the library's rule. Process-wide. */
mokResult_t mok_gemm_debug_eager_rows(int rows);
/* Benchmarks: the split mix order's tiles of experts with one token tile per output block
 * load their weights with an L2 evict-first policy (1) or plainly (2); 0 = the library's
 * rule. Process-wide. */
mokResult_t mok_gemm_debug_cold_evict(int mode);
/* Token tiles under tickets: experts with most rows first (1) or in index order (2);
 * 0 = the library's rule. */
mokResult_t mok_gemm_debug_expert_order(int mode);
/* Benchmarks: gate+up token tiles (CTAs alone) load a stage's weights as one 4-D TMA box
 * over W_gate and W_up (1; only where W_up lies after W_gate, else four boxes), four 64-row
 * boxes (2) or two 3-D boxes (3); 0 = the library's rule (1). Process-wide. */
mokResult_t mok_gemm_debug_gu_box(int mode);
/* Experiment: the down dgrad GEMM on token tiles (1; where I is a multiple of 256), as
 * row-grouped 128 x 128 tiles (2), or by the library's rule (0: row-grouped). Token tiles
 * ran qwen3.5 R320 +7% and kimi +4%, glm -7%, deepseek-v4-pro -4% and qwen3.5 under Zipf
 * routing -18% (docs/PERF.md, session 17), so the rule does not pick them. Process-wide. */
mokResult_t mok_gemm_debug_ddown_tok(int mode);
/* Benchmarks: the forward gate+up GEMM's tiles where I % 128 == 0 (token tiles by the rule):
 * 1 the row-grouped tiles (128 rows x 256 weight rows, the rows as wgmma M, 64-row tails)
 * that shapes with I % 128 != 0 run (mok_gemm_gateup_fwd only, not the fused forward);
 * 2 token tiles, those of 128 rows with the rows as wgmma N like the others; 3 token
 * tiles, those of 128 rows with the rows as wgmma M (mok_gemm_gateup_fwd's launches and the
 * megakernel's on the 176-row ring; not mok_gemm_ffn_fwd's fused kernel); 0 the rules (3's
 * tiles: docs/PERF.md, session 41; bitwise the same results as 2). Process-wide. */
mokResult_t mok_gemm_debug_gu_rows(int mode);
/* Benchmarks: the forward down GEMM's token tiles of exactly 128 rows with the rows as wgmma
 * N like the others (1), with the rows as wgmma M (2: each warpgroup 64 rows x all 256 weight
 * rows), or by the rule (0: 2; docs/PERF.md, session 42; bitwise the same results as 1).
 * mok_gemm_down_fwd's launches on the 128-row ring (mok_gemm_debug_tok_ring) only; the
 * 176-row ring's, the fused forward's and the megakernel's tiles keep the rows as N.
 * Process-wide. */
mokResult_t mok_gemm_debug_dn_rows(int mode);
/* Benchmarks: the forward down GEMM's token tiles in a ring of 128-row stages with an
 * epilogue area of their own (1; tiles cut at <= 128 rows, the last stage given back
 * before the epilogue), in the 176-row stages whose epilogue holds the tile's last stage
 * (2), or by the library's rule (0): 128-row stages where expert_count_host is given and
 * every expert's tiles are <= 128 rows anyway (e.g. 512 or 256 rows an expert), else 176.
 * Process-wide. */
mokResult_t mok_gemm_debug_tok_ring(int mode);
/* Diagnostics (mok bench stream): encodes into `map` (a CUtensorMap: 128 bytes, 64-byte
 * aligned) the TMA map the GEMM tiles use for a row-major bf16 [outer, inner] tensor at
 * ptr: boxes of 64 elements (128 bytes) x box_outer rows, 128-byte swizzle, 256-byte L2
 * promotion. */
mokResult_t mok_gemm_tma_map(void *map, const void *ptr, uint64_t inner, uint64_t outer, uint32_t box_outer);
/* Diagnostics: forward token tiles add to buf (device, 67 zeroed words; NULL = off) how
 * long each pipeline stage took from its loads' issue to its use, in SM cycles (layout:
 * grouped_gemm.cuh tok_sclk_record). Process-wide. */
mokResult_t mok_gemm_debug_stage_clock(unsigned long long *buf);
/* Tests: how many forward token-tile launches (CTAs alone) so far took the lean kernel
 * instance (no diagnostic on, the weight- and row-box knobs at the library's rules: the
 * instance compiled without them, grouped_gemm.cuh TokKnobs) and how many the instance
 * with diagnostics. Process-wide counters, never reset. */
mokResult_t mok_gemm_debug_lean_launches(unsigned long long *lean, unsigned long long *diag);

/* ---- helpers for tests and benchmarks (device work on `stream`, no sync) ---------- */
/* Fills rows [0, capacity) x cols of a bf16 tensor: rows inside expert e's first
 * expert_count[e] rows of its segment get scale * U(-sqrt3, sqrt3) from a hash of
 * (seed, element index); every other row (padding, unused) gets zeros.
 * With expert_offset == NULL every row is filled (weights). */
mokResult_t mok_gemm_fill_rows(mokBf16 *dst, int64_t rows, int cols, uint64_t seed, float scale,
                               int num_experts, const int32_t *expert_offset,
                               const int32_t *expert_count, cudaStream_t stream);
/* [OUT] *bad (device int): number of elements among rows [0, rows) x cols whose bf16
 * pattern is a NaN (finds elements a kernel never wrote over a 0xFFFF poison). */
mokResult_t mok_gemm_count_nan(const void *src, int64_t rows, int cols, int fp32, int *bad,
                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* MOK_GEMM_H */
