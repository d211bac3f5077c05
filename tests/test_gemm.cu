/*
 * test_gemm.cu — the grouped expert GEMMs (src/gemm.cu) against a float64 host reference
 * (src/gemm_check.h), every kind, on awkward row layouts: empty experts, one row, rows
 * not a multiple of the tile, one hot expert, one expert, I = 2880 and H = 2880, with and
 * without the SwiGLU clamp, bf16 and fp32 weight gradients. Every output is poisoned
 * with 0xFFFF (bf16 NaN) before each run and scanned for NaN after it over every row in
 * use; every row (or a sample of rows on the large shapes) is compared with the
 * reference; weight gradients are bitwise identical across two runs.
 * CPU-only tests cover the tile rule, argument validation and the tile schedule (the
 * device decode function run on the host against a brute-force enumeration).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm.h"
#include "gemm/grouped_gemm.cuh" /* defines: mok_sm90::gemm_decode_tile (host-callable) */
#include "gemm_check.h"
#include "test.h"
#include "util.h"

/* ---- CPU: tile rule and validation -------------------------------------------------- */
MOK_TEST(gemm_tile_rule) {
  mokGemmTileShape_t s;
  /* forward gate+up and down: token tiles where the weight side divides into whole tiles */
  CHECK_OK(mok_gemm_tile_shape(mokGemmGateUpFwd, 7168, 2048, &s));
  CHECK(s.token == 1 && s.bm == 256 && s.bn == 176 && s.out_cols == 128 && s.bk == 64 && s.stages == 4);
  CHECK_OK(mok_gemm_tile_shape(mokGemmDownFwd, 7168, 2048, &s));
  CHECK(s.token == 1 && s.bm == 256 && s.out_cols == 256 && s.stages == 4);
  CHECK_OK(mok_gemm_tile_shape(mokGemmGateUpFwd, 2880, 2880, &s)); /* I = 2880: 22.5 x 128 */
  CHECK(s.token == 0 && s.bm == 128 && s.bn == 256 && s.out_cols == 128); /* 2944 padded: 2.2%, within 3% */
  CHECK_OK(mok_gemm_tile_shape(mokGemmGateUpFwd, 2048, 704, &s));
  CHECK(s.token == 0 && s.bn == 128 && s.out_cols == 64); /* 704: 768 for 128 columns (9% over) */
  CHECK_OK(mok_gemm_tile_shape(mokGemmDownFwd, 2880, 2880, &s));
  CHECK(s.token == 0 && s.bn == 192 && s.stages == 4); /* 2880 = 15 x 192; 256 would pad 6.7% */
  CHECK_OK(mok_gemm_tile_shape(mokGemmDownFwd, 2112, 2048, &s)); /* 2112 = 11 x 192: classic */
  CHECK(s.token == 0 && s.bn == 192);
  CHECK_OK(mok_gemm_tile_shape(mokGemmDownDgrad, 2048, 768, &s));
  CHECK(s.bn == 128 && s.stages == 5); /* always 128: its g and u are staged beside the ring */
  CHECK_OK(mok_gemm_tile_shape(mokGemmWgradDown, 4096, 320, &s));
  CHECK(s.bn == 192); /* 320: 384 for 128 and 192, 512 for 256 -> the wider of the tie */
  CHECK_OK(mok_gemm_tile_shape(mokGemmWgradGateUp, 4096, 320, &s));
  CHECK(s.bn == 256 && s.stages == 4);
  CHECK_OK(mok_gemm_tile_shape(mokGemmGateUpDgrad, 2048, 768, &s));
  CHECK(s.bn == 256 && s.stages == 4);
  CHECK_OK(mok_gemm_tile_shape(mokGemmGateUpFwd, 64, 64, &s));
  CHECK(s.token == 0 && s.out_cols == 64 && s.bn == 128 && s.stages == 6);
  CHECK(s.smem_bytes <= 227 * 1024);
  for (int k = 0; k < mokGemmNumKinds; ++k) /* every plan fits, at every width the rule picks */
    for (int n = 64; n <= 4096; n += 64) {
      CHECK_OK(mok_gemm_tile_shape((mokGemmKind_t)k, n, n, &s));
      CHECK(s.smem_bytes <= 227 * 1024 && s.stages >= 3);
    }
  CHECK_STATUS(mok_gemm_tile_shape(mokGemmDownFwd, 100, 64, &s), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "multiples of 64") != NULL);
  CHECK_STATUS(mok_gemm_tile_shape((mokGemmKind_t)17, 64, 64, &s), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_tile_shape(mokGemmDownFwd, 64, 64, NULL), mokInvalidArgument);
}

MOK_TEST(gemm_validation) {
  /* Fake, aligned, never dereferenced: validation fails before anything touches them. */
  const mokBf16 *p = (const mokBf16 *)(uintptr_t)0x10000;
  mokBf16 *q = (mokBf16 *)(uintptr_t)0x20000;
  const int32_t *off = (const int32_t *)(uintptr_t)0x30000;
  mokGemmRows_t rows = {4, 1024, off};
  /* debug knobs refuse values out of range */
  CHECK_STATUS(mok_gemm_debug_epilogue(3), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_eager_rows(-2), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_gu_box(4), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_epilogue(-1), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_tiles(0, 0, 3), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_pairs(4), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_pairs(-1), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_stagger(3), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_row_box128(3), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_cold_evict(-1), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_gu_rows(4), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_dn_rows(3), mokInvalidArgument);
  {
    unsigned long long l = 0;
    CHECK_STATUS(mok_gemm_debug_lean_launches(NULL, &l), mokInvalidArgument);
    CHECK_STATUS(mok_gemm_debug_lean_launches(&l, NULL), mokInvalidArgument);
    CHECK_STATUS(mok_gemm_debug_ffn_launches(NULL), mokInvalidArgument);
    CHECK_STATUS(mok_gemm_debug_ffn(3), mokInvalidArgument);
  }
  CHECK_STATUS(mok_gemm_debug_l2_promotion(32, -1), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_l2_promotion(-1, 512), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_mix_ctas(-2), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_debug_grid(-1), mokInvalidArgument);
  CHECK_STATUS(mok_gemm_gateup_fwd(NULL, 256, 256, 0.f, p, p, p, q, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "rows is NULL") != NULL);
  mokGemmRows_t bad = rows;
  bad.num_experts = 0;
  CHECK_STATUS(mok_gemm_down_fwd(&bad, 256, 256, p, p, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "num_experts") != NULL);
  bad = rows;
  bad.capacity = 1000;
  CHECK_STATUS(mok_gemm_down_fwd(&bad, 256, 256, p, p, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "capacity") != NULL);
  bad = rows;
  bad.input_rows = 1025;
  CHECK_STATUS(mok_gemm_down_dgrad(&bad, 256, 256, 0.f, p, p, p, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "input_rows") != NULL);
  /* the shared expert's backward: one expert of input_rows > 0 rows, every pointer given */
  CHECK_STATUS(mok_gemm_shared_backward(&rows, 256, 256, 0.f, p, p, p, p, p, p, p, q, q, mokDtypeBF16, q, q, q, 0),
               mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "one expert") != NULL);
  bad = rows;
  bad.num_experts = 1, bad.input_rows = 100;
  CHECK_STATUS(mok_gemm_shared_backward(&bad, 256, 256, 0.f, p, NULL, p, p, p, p, p, q, q, mokDtypeBF16, q, q, q, 0),
               mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "x is NULL") != NULL);
  CHECK_STATUS(mok_gemm_shared_backward(&bad, 256, 256, 0.f, p, p, p, p, p, p, p, q, q, (mokDtype_t)9, q, q, q, 0),
               mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "grad_dtype") != NULL);
  bad = rows;
  bad.expert_offset = NULL;
  CHECK_STATUS(mok_gemm_down_dgrad(&bad, 256, 256, 0.f, p, p, p, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "expert_offset") != NULL);
  CHECK_STATUS(mok_gemm_gateup_fwd(&rows, 200, 256, 0.f, p, p, p, q, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "hidden") != NULL);
  CHECK_STATUS(mok_gemm_gateup_fwd(&rows, 256, 256, -1.f, p, p, p, q, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "swiglu_limit") != NULL);
  CHECK_STATUS(mok_gemm_gateup_fwd(&rows, 256, 256, 0.f, p + 1, p, p, q, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "16-byte aligned") != NULL);
  CHECK_STATUS(mok_gemm_gateup_dgrad(&rows, 256, 256, p, p, NULL, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "w_up is NULL") != NULL);
  CHECK_STATUS(mok_gemm_wgrad_gateup(&rows, 256, 256, p, p, (mokDtype_t)7, q, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "grad_dtype") != NULL);
  CHECK_STATUS(mok_gemm_wgrad_down(&rows, 256, 256, p, p, mokDtypeBF16, NULL, 0), mokInvalidArgument);
  /* the fused forward checks both kinds' arguments before it launches either */
  CHECK_STATUS(mok_gemm_ffn_fwd(&rows, 256, 256, 0.f, p, p, p, NULL, q, q, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "mok_gemm_ffn_fwd") != NULL && strstr(mokGetLastError(), "w_down is NULL") != NULL);
  CHECK_STATUS(mok_gemm_ffn_fwd(&rows, 256, 256, -1.f, p, p, p, p, q, q, q, 0), mokInvalidArgument);
  CHECK(strstr(mokGetLastError(), "swiglu_limit") != NULL);
}

/* ---- CPU: the tile schedule ---------------------------------------------------------
 * gemm_decode_tile walks a cursor over the segment offsets; here it runs on the host and
 * must list exactly the tiles of a brute-force enumeration (experts in order; in an expert,
 * groups of `raster` m-blocks, in a group n-block major, m-block minor; 128-row m-blocks,
 * the last one of a segment maybe 64 rows; or token tiles of 16-row units, at most
 * tok_units of them, over the whole segment or, with expert counts, over the routed rows
 * rounded up to 16, the last tile
 * owning the zero rows after them; with stagger, expert 0's tiles at most (units + 1) / 2
 * units), in order, in a persistent CTA's strided order, and in random order (the cursor
 * walks either way). TOK 2 (CTA pairs): the units are pairs (rows of pairs sharing the
 * weight block, then an odd last tile's output blocks in twos sharing its rows), each
 * rank's tile decoded from a cursor of its own. Token tiles with counts, half the time:
 * experts in the order of most rows first (tok_expert_rank), the enumeration in that order. */
template <int KIND, int BN, int TOK = 0>
static int check_schedule(rng_t *r, char *why, size_t n) {
  using namespace mok_sm90;
  enum { kMaxE = 40, kMaxTiles = 32768 };
  const int E = 1 + (int)(rng_next(r) % kMaxE);
  int32_t off[kMaxE + 1], cnt[kMaxE];
  off[0] = 0;
  for (int e = 0; e < E; ++e) { /* empty, one 64-row block, or up to 40 blocks */
    const int kind = (int)(rng_next(r) % 5);
    const int blocks = kind == 0 ? 0 : kind == 1 ? 1 : kind == 4 ? 1 + (int)(rng_next(r) % 40) : 1 + (int)(rng_next(r) % 9);
    off[e + 1] = off[e] + 64 * blocks;
    /* routed rows: the segment's own (0 .. seg, usually > seg - 64), or more than fit (clamped) */
    const int seg = 64 * blocks, pick = (int)(rng_next(r) % 8);
    cnt[e] = pick == 0 ? 0 : pick == 1 ? seg + 1 + (int)(rng_next(r) % 100) : pick == 2 ? (int)(rng_next(r) % (seg + 1))
                                                                        : seg - (int)(rng_next(r) % 64);
    if (cnt[e] < 0) cnt[e] = 0;
  }
  GemmTileArgs a;
  memset(&a, 0, sizeof a);
  a.expert_offset = off;
  const int with_counts = TOK && (rng_next(r) & 1);
  a.expert_count = with_counts ? cnt : NULL;
  static const int kRasters[5] = {1, 2, 3, 8, 1 << 20};
  a.raster = kRasters[rng_next(r) % 5];
  a.tok_units = rng_next(r) % 3 ? 11 : 1 + (int)(rng_next(r) % 11);
  a.stagger = TOK && (rng_next(r) & 1); /* expert 0's tiles at most (tok_units + 1) / 2 units */
  a.num_experts = E;
  a.n_out = 64 * (1 + (int)(rng_next(r) % 40));
  a.k_len = 64 * (1 + (int)(rng_next(r) % 8));
  a.m_w = 64 * (1 + (int)(rng_next(r) % 6));
  const int oc = TOK ? tok_out_cols<KIND>() : tile_out_cols<KIND, BN>();
  if (TOK == 2 && (a.n_out + oc - 1) / oc % 2) a.n_out += oc; /* pairs: an even number of output blocks */
  const int n_tiles = (a.n_out + oc - 1) / oc;
  /* TOK 1 with counts, half the time: the experts in the order of most rows first
   * (tok_expert_rank, as the kernel under tickets with a.expert_order) */
  static uint16_t order[kMaxE];
  const uint16_t *ordp = NULL;
  if (TOK == 1 && with_counts && (rng_next(r) & 1)) {
    int rows_e[kMaxE + 3];
    for (int e = 0; e < E + 3; ++e) rows_e[e] = e < E ? tok_rows(a, e, off[e + 1] - off[e]) : -1; /* padded to 4 */
    unsigned char seen[kMaxE] = {0};
    for (int e = 0; e < E; ++e) {
      const int k = tok_expert_rank(rows_e, E, e);
      if (k < 0 || k >= E || seen[k])
        return snprintf(why, n, "expert order: rank %d of expert %d out of range or taken twice", k, e), 0;
      seen[k] = 1;
      order[k] = (uint16_t)e;
    }
    for (int i = 1; i < E; ++i)
      if (rows_e[order[i]] > rows_e[order[i - 1]] ||
          (rows_e[order[i]] == rows_e[order[i - 1]] && order[i] < order[i - 1]))
        return snprintf(why, n, "expert order: position %d (expert %d, %d rows) after expert %d (%d rows)", i,
                        order[i], rows_e[order[i]], order[i - 1], rows_e[order[i - 1]]), 0;
    ordp = order;
  }
  static TileCoord want[kMaxTiles], want1[kMaxTiles]; /* TOK 2: a pair's rank 0 and rank 1 tiles */
  static unsigned char single[kMaxTiles]; /* the tile's expert has one tile per output block (mix order) */
  int total = 0;
  for (int pos = 0; pos < E; ++pos) {
    const int e = ordp ? ordp[pos] : pos;
    const int seg = off[e + 1] - off[e];
    /* rows the token tiles cover: the segment, or its routed rows (at least 1, at most
     * seg) rounded up to 16 */
    int rows = seg;
    if (with_counts && seg > 0) {
      rows = cnt[e] < 1 ? 1 : cnt[e] > seg ? seg : cnt[e];
      rows = (rows + 15) / 16 * 16;
    }
    /* token tiles, brute force: ceil(units / tok_units) tiles of 16-row units, or one
     * more if that makes them equal and keeps them >= 8 units, each taking ceil(units left
     * / tiles left), so sizes differ by <= 16 rows, larger first */
    int tok_n = 0, tok_off[2600], tok_nt[2600];
    const int units = a.stagger && pos == 0 ? (a.tok_units + 1) / 2 : a.tok_units;
    const int tu = rows / 16, tn0 = (tu + units - 1) / units;
    const int tn1 = tn0 && tu % tn0 && tu % (tn0 + 1) == 0 && tu >= 8 * (tn0 + 1) ? tn0 + 1 : tn0;
    for (int u = tu, left = u, i = 0, tn = tn1; i < tn; ++i) {
      const int take = (left + (tn - i) - 1) / (tn - i);
      tok_off[i] = 16 * (u - left);
      tok_nt[i] = 16 * take;
      left -= take;
      tok_n = tn;
    }
    for (int i = 0; i < tok_n; ++i)
      if (tok_nt[i] < 16 || tok_nt[i] > 16 * units || (i && tok_nt[i] > tok_nt[i - 1]) ||
          (!with_counts && units == 11 && tok_nt[i] < 64))
        return snprintf(why, n, "token split of %d rows: tile %d has %d rows", rows, i, tok_nt[i]), 0;
    const int mt = KindTraits<KIND>::kWgrad ? (a.m_w + 127) / 128 : TOK ? tok_n : (seg + 127) / 128;
    const int raster = KindTraits<KIND>::kWgrad ? 1 << 30 : a.raster; /* wgrad: no groups */
    /* pairs: rows of pairs (token tiles 2j, 2j + 1) in raster / 2 groups, then the odd last
     * tile's output blocks in twos */
    if constexpr (TOK == 2) {
      auto tile = [&](int mb, int nb, int share) {
        TileCoord c;
        memset(&c, 0, sizeof c);
        c.expert = e, c.n0 = nb * oc, c.m0 = off[e] + tok_off[mb], c.m_end = c.m0 + tok_nt[mb], c.nt = tok_nt[mb];
        c.k_blocks = a.k_len / 64, c.z_end = mb == mt - 1 ? off[e + 1] : c.m_end, c.share = share;
        return c;
      };
      const int ras = raster > 1 ? raster / 2 : 1;
      for (int g0 = 0; g0 < mt / 2; g0 += ras)
        for (int nb = 0; nb < n_tiles; ++nb)
          for (int j = g0; j < mt / 2 && j < g0 + ras && total < kMaxTiles; ++j) {
            single[total] = 0;
            want1[total] = tile(2 * j + 1, nb, kShareW);
            want[total++] = tile(2 * j, nb, kShareW);
          }
      if (mt & 1)
        for (int i = 0; i < n_tiles / 2 && total < kMaxTiles; ++i) {
          single[total] = mt == 1;
          want1[total] = tile(mt - 1, 2 * i + 1, kShareRows);
          want[total++] = tile(mt - 1, 2 * i, kShareRows);
        }
    } else {
      for (int g0 = 0; g0 < mt; g0 += raster)
      for (int nb = 0; nb < n_tiles; ++nb)
        for (int mb = g0; mb < mt && mb < g0 + raster && total < kMaxTiles; ++mb) {
          TileCoord c;
          memset(&c, 0, sizeof c);
          c.expert = e;
          c.n0 = nb * oc;
          if (TOK) {
            c.m0 = off[e] + tok_off[mb], c.m_end = c.m0 + tok_nt[mb], c.nt = tok_nt[mb], c.k_blocks = a.k_len / 64;
            c.z_end = mb == mt - 1 ? off[e + 1] : c.m_end;
            if (c.m_end > off[e + 1]) return snprintf(why, n, "token tile past its segment"), 0;
          } else if (KindTraits<KIND>::kWgrad) {
            c.m0 = mb * 128, c.m_end = a.m_w, c.k0 = off[e], c.k_blocks = (off[e + 1] - off[e]) / 64;
            c.z_end = c.m_end;
          } else {
            c.m0 = off[e] + mb * 128, c.m_end = off[e + 1], c.k0 = 0, c.k_blocks = a.k_len / 64;
            c.z_end = c.m_end;
          }
          single[total] = mt == 1;
          want[total++] = c;
        }
    }
  }
  if (total >= kMaxTiles) return 1; /* layout too big for the table: skip it */
  auto same = [](const TileCoord &x, const TileCoord &y) {
    return x.expert == y.expert && x.m0 == y.m0 && x.m_end == y.m_end && x.n0 == y.n0 && x.k0 == y.k0 &&
           x.k_blocks == y.k_blocks && x.nt == y.nt && x.z_end == y.z_end && (TOK != 2 || x.share == y.share);
  };
  /* TOK 2: the pair's rank 1 tile, from a cursor of its own (the other CTA's) */
  GemmCursor cu, cu1;
  TileCoord c, c1;
  auto rank1_ok = [&](int t, int cls) {
    return TOK != 2 || (gemm_decode_tile<KIND, BN, TOK>(a, cu1, t, c1, cls, 1) && same(c1, want1[t]));
  };
  gemm_cursor_init(a, cu, ordp);
  gemm_cursor_init(a, cu1, ordp);
  for (int t = 0; t < total; ++t)
    if (!gemm_decode_tile<KIND, BN, TOK>(a, cu, t, c) || !same(c, want[t]) || !rank1_ok(t, -1))
      return snprintf(why, n, "in order: tile %d of %d (E %d) decoded wrong", t, total, E), 0;
  if (gemm_decode_tile<KIND, BN, TOK>(a, cu, total, c) || gemm_decode_tile<KIND, BN, TOK>(a, cu, total + 7, c))
    return snprintf(why, n, "tile %d past the last (%d) decoded as a tile", total, total - 1), 0;
  const int grid = 1 + (int)(rng_next(r) % 132);
  for (int b = 0; b < grid; ++b) { /* a persistent CTA's order, fresh cursor */
    gemm_cursor_init(a, cu, ordp);
    gemm_cursor_init(a, cu1, ordp);
    int t = b;
    for (; gemm_decode_tile<KIND, BN, TOK>(a, cu, t, c); t += grid)
      if (t >= total || !same(c, want[t]) || !rank1_ok(t, -1))
        return snprintf(why, n, "CTA %d of %d: tile %d wrong", b, grid, t), 0;
    if (t < total) return snprintf(why, n, "CTA %d of %d stopped at tile %d of %d", b, grid, t, total), 0;
  }
  gemm_cursor_init(a, cu, ordp);
  gemm_cursor_init(a, cu1, ordp);
  for (int t = total - 1; t >= 0; --t) /* backwards: the cursor steps back one expert at a time */
    if (!gemm_decode_tile<KIND, BN, TOK>(a, cu, t, c) || !same(c, want[t]) || !rank1_ok(t, -1))
      return snprintf(why, n, "backwards: tile %d of %d wrong", t, total), 0;
  gemm_cursor_init(a, cu, ordp);
  gemm_cursor_init(a, cu1, ordp);
  for (int q = 0; q < 200 && total > 0; ++q) { /* random order: the cursor walks either way */
    const int t = (int)(rng_next(r) % (uint64_t)total);
    if (!gemm_decode_tile<KIND, BN, TOK>(a, cu, t, c) || !same(c, want[t]) || !rank1_ok(t, -1))
      return snprintf(why, n, "random order: tile %d of %d wrong", t, total), 0;
  }
  /* mix order (token tiles; the data gradients' 128-row tiles): the single-tile experts'
   * tiles merged evenly into the others', each class from a cursor of its own */
  if ((TOK || KIND == mok_sm90::kDownDgrad || KIND == mok_sm90::kGateUpDgrad) && total > 0) {
    int C = 0;
    for (int t = 0; t < total; ++t) C += single[t];
    static TileCoord list[2][kMaxTiles], merged[kMaxTiles], list1[2][kMaxTiles], merged1[kMaxTiles];
    int len[2] = {0, 0};
    for (int t = 0; t < total; ++t) {
      list1[single[t]][len[single[t]]] = want1[t];
      list[single[t]][len[single[t]]++] = want[t];
    }
    for (int t = 0, taken = 0; t < total; ++t) { /* Bresenham: C of them by t + 1 == (t + 1) C / T */
      const int pick = (int64_t)(t + 1) * C / total > taken;
      merged[t] = list[pick][pick ? taken : t - taken];
      merged1[t] = list1[pick][pick ? taken : t - taken];
      taken += pick;
    }
    GemmCursor cur[2], cur1[2];
    for (int k = 0; k < 2; ++k) {
      gemm_cursor_init(a, cur[k], ordp);
      gemm_cursor_init(a, cur1[k], ordp);
    }
    for (int q = 0; q < total + 200; ++q) { /* in order, then random */
      const int t = q < total ? q : (int)(rng_next(r) % (uint64_t)total);
      int cls, idx;
      mix_tile(t, total, C, cls, idx);
      if (!gemm_decode_tile<KIND, BN, TOK>(a, cur[cls], idx, c, cls) || !same(c, merged[t]) ||
          (TOK == 2 && (!gemm_decode_tile<KIND, BN, TOK>(a, cur1[cls], idx, c1, cls, 1) || !same(c1, merged1[t]))))
        return snprintf(why, n, "mix order: tile %d of %d (%d single) wrong", t, total, C), 0;
    }
  }
  return 1;
}

MOK_TEST(gemm_schedule_decode_matches_enumeration) {
  rng_t r = {test_seed() ^ 0x5c4edu};
  char why[256] = "";
  for (int it = 0; it < 300; ++it) {
    CHECK_MSG((check_schedule<mok_sm90::kGateUpFwd, 256>(&r, why, sizeof why)), "gate+up fwd: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kDownFwd, 192>(&r, why, sizeof why)), "down fwd: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kDownDgrad, 128>(&r, why, sizeof why)), "down dgrad: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kGateUpDgrad, 256>(&r, why, sizeof why)), "gate+up dgrad: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kWgradGateUp, 256>(&r, why, sizeof why)), "wgrad: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kGateUpFwd, 256, 1>(&r, why, sizeof why)), "gate+up token tiles: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kDownFwd, 256, 1>(&r, why, sizeof why)), "down token tiles: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kGateUpFwd, 256, 2>(&r, why, sizeof why)), "gate+up token pairs: %s", why);
    CHECK_MSG((check_schedule<mok_sm90::kDownFwd, 256, 2>(&r, why, sizeof why)), "down token pairs: %s", why);
    if (t->failed) break;
  }
}

/* ---- CPU: which down launches take the 128-row stage ring (tok_tiles_fit_ring128) ---- */
MOK_TEST(gemm_tok_ring128_rule) {
  using mok_sm90::tok_tiles_fit_ring128;
  /* every tile <= 128 rows under the 176-row cut: 512 -> 4 x 128, 256 -> 2 x 128, 128, 1,
   * 0 (empty), 384 -> 3 x 128, 100 -> 112 */
  static const int32_t yes[] = {512, 256, 128, 1, 0, 384, 100};
  CHECK(tok_tiles_fit_ring128(yes, (int)(sizeof yes / sizeof yes[0])));
  /* one expert whose tiles exceed 128 rows is enough to keep the 176-row ring: 320 -> 2 x
   * 160, 341 (352) -> 2 x 176, 129 (144) -> 144, 1024 -> 6 x 160-176 */
  static const int32_t no[][2] = {{512, 320}, {341, 0}, {129, 64}, {256, 1024}};
  for (int i = 0; i < 4; ++i) CHECK_MSG(!tok_tiles_fit_ring128(no[i], 2), "case %d", i);
  CHECK(tok_tiles_fit_ring128(no[0], 1)); /* 512 alone fits */
}

/* ---- GPU: one whole forward + backward chain on a row layout ----------------------- */
typedef struct gemm_case {
  int E, H, I;
  const int *counts; /* [E] rows of each expert */
  float limit;
  int sample_rows;   /* 0: check every row; else this many rows per expert (first, last, spread) */
  int sample_wrows;  /* weight rows checked per expert and matrix (0 = all) */
  int no_counts;     /* 1: the GEMMs get no expert_count (token tiles cover whole segments) */
  int fused;         /* 1: the forward through mok_gemm_ffn_fwd with the fused launch on;
                        2: the same with the counts on the host too (the ring rule's input) */
} gemm_case;

typedef struct gemm_bufs {
  int32_t *off, *cnt;
  mokBf16 *x, *wg, *wu, *wd, *act, *gu, *y, *dy, *dgu, *dx;
  void *dwg, *dwu, *dwd, *dwg2, *dwu2, *dwd2;
  int *bad;
} gemm_bufs;

static void free_bufs(gemm_bufs *b) {
  void **p = (void **)b;
  for (size_t i = 0; i < sizeof *b / sizeof(void *); ++i)
    if (p[i]) cudaFree(p[i]);
  memset(b, 0, sizeof *b);
}

static char g_err[512];
#define FAIL(...) (snprintf(g_err, sizeof g_err, __VA_ARGS__), g_err)
#define TRY_CUDA(call)                                                                       \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) return FAIL("%s:%d %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)
#define TRY_MOK(call)                                                                        \
  do {                                                                                       \
    mokResult_t r_ = (call);                                                                 \
    if (r_ != mokSuccess) return FAIL("%s:%d %s: %s", __FILE__, __LINE__, #call, mokGetLastError()); \
  } while (0)

static const char *copy_down(void *dst, const void *src, size_t bytes) {
  TRY_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return NULL;
}

static const char *nan_scan(const char *what, const void *p, int64_t rows, int cols, int fp32, int *bad) {
  TRY_MOK(mok_gemm_count_nan(p, rows, cols, fp32, bad, 0));
  int h = 0;
  TRY_CUDA(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  if (h) return FAIL("%s: %d elements unwritten (NaN poison left) or NaN", what, h);
  return NULL;
}

/* Rows of expert e to check: all, or a spread sample including the first and last. */
static int pick_rows(int count, int sample, int *out) {
  if (sample == 0 || count <= sample) {
    for (int i = 0; i < count; ++i) out[i] = i;
    return count;
  }
  for (int i = 0; i < sample; ++i) out[i] = (int)((int64_t)i * (count - 1) / (sample - 1));
  return sample;
}

static const char *run_case_impl(const gemm_case *c, uint64_t seed, gemm_bufs *b) {
  const int E = c->E, H = c->H, I = c->I;
  int32_t *off_h = (int32_t *)calloc((size_t)E + 1, sizeof(int32_t));
  for (int e = 0; e < E; ++e) off_h[e + 1] = off_h[e] + (c->counts[e] + 63) / 64 * 64;
  const int64_t used = off_h[E];
  const int64_t cap = used + 128; /* room past the rows in use: those tiles must exit */
  TRY_CUDA(cudaMalloc(&b->off, sizeof(int32_t) * (E + 1)));
  TRY_CUDA(cudaMalloc(&b->cnt, sizeof(int32_t) * E));
  TRY_CUDA(cudaMemcpy(b->off, off_h, sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice));
  TRY_CUDA(cudaMemcpy(b->cnt, c->counts, sizeof(int32_t) * E, cudaMemcpyHostToDevice));
  const size_t wsz = (size_t)E * I * H;
  TRY_CUDA(cudaMalloc(&b->x, cap * H * 2));
  TRY_CUDA(cudaMalloc(&b->dy, cap * H * 2));
  TRY_CUDA(cudaMalloc(&b->y, cap * H * 2));
  TRY_CUDA(cudaMalloc(&b->dx, cap * H * 2));
  TRY_CUDA(cudaMalloc(&b->act, cap * I * 2));
  TRY_CUDA(cudaMalloc(&b->gu, cap * I * 4));
  TRY_CUDA(cudaMalloc(&b->dgu, cap * I * 4));
  if (c->fused) { /* W_up right after W_gate (the fused launch's 4-D weight box); freed with it */
    TRY_CUDA(cudaMalloc(&b->wg, wsz * 4));
  } else {
    TRY_CUDA(cudaMalloc(&b->wg, wsz * 2));
    TRY_CUDA(cudaMalloc(&b->wu, wsz * 2));
  }
  TRY_CUDA(cudaMalloc(&b->wd, wsz * 2));
  mokBf16 *const wu = c->fused ? b->wg + wsz : b->wu;
  TRY_CUDA(cudaMalloc(&b->dwg, wsz * 4));
  TRY_CUDA(cudaMalloc(&b->dwu, wsz * 4));
  TRY_CUDA(cudaMalloc(&b->dwd, wsz * 4));
  TRY_CUDA(cudaMalloc(&b->dwg2, wsz * 4));
  TRY_CUDA(cudaMalloc(&b->dwu2, wsz * 4));
  TRY_CUDA(cudaMalloc(&b->dwd2, wsz * 4));
  TRY_CUDA(cudaMalloc(&b->bad, sizeof(int)));

  TRY_MOK(mok_gemm_fill_rows(b->x, cap, H, seed + 1, 1.0f, E, b->off, b->cnt, 0));
  TRY_MOK(mok_gemm_fill_rows(b->dy, cap, H, seed + 2, 1.0f, E, b->off, b->cnt, 0));
  TRY_MOK(mok_gemm_fill_rows(b->wg, (int64_t)E * I, H, seed + 3, 1.0f / sqrtf((float)H), 0, NULL, NULL, 0));
  TRY_MOK(mok_gemm_fill_rows(wu, (int64_t)E * I, H, seed + 4, 1.0f / sqrtf((float)H), 0, NULL, NULL, 0));
  TRY_MOK(mok_gemm_fill_rows(b->wd, (int64_t)E * H, I, seed + 5, 1.0f / sqrtf((float)I), 0, NULL, NULL, 0));
  /* poison every output */
  TRY_CUDA(cudaMemset(b->act, 0xFF, cap * I * 2));
  TRY_CUDA(cudaMemset(b->gu, 0xFF, cap * I * 4));
  TRY_CUDA(cudaMemset(b->y, 0xFF, cap * H * 2));
  TRY_CUDA(cudaMemset(b->dgu, 0xFF, cap * I * 4));
  TRY_CUDA(cudaMemset(b->dx, 0xFF, cap * H * 2));
  TRY_CUDA(cudaMemset(b->dwg, 0xFF, wsz * 4));
  TRY_CUDA(cudaMemset(b->dwu, 0xFF, wsz * 4));
  TRY_CUDA(cudaMemset(b->dwd, 0xFF, wsz * 4));
  TRY_CUDA(cudaMemset(b->dwg2, 0xFF, wsz * 4));
  TRY_CUDA(cudaMemset(b->dwu2, 0xFF, wsz * 4));
  TRY_CUDA(cudaMemset(b->dwd2, 0xFF, wsz * 4));

  mokGemmRows_t rows = {E, cap, b->off, c->no_counts ? NULL : b->cnt};
  if (c->fused == 2) rows.expert_count_host = c->counts;
  if (c->fused) {
    unsigned long long n0 = 0, n1 = 0;
    TRY_MOK(mok_gemm_debug_ffn_launches(&n0));
    TRY_MOK(mok_gemm_debug_ffn(1));
    const mokResult_t r = mok_gemm_ffn_fwd(&rows, H, I, c->limit, b->x, b->wg, wu, b->wd, b->act, b->gu, b->y, 0);
    TRY_MOK(mok_gemm_debug_ffn(0));
    TRY_MOK(r);
    TRY_MOK(mok_gemm_debug_ffn_launches(&n1));
    if (n1 != n0 + 1) return FAIL("mok_gemm_ffn_fwd made %llu fused launches, want 1", n1 - n0);
  } else {
    TRY_MOK(mok_gemm_gateup_fwd(&rows, H, I, c->limit, b->x, b->wg, wu, b->act, b->gu, 0));
    TRY_MOK(mok_gemm_down_fwd(&rows, H, I, b->act, b->wd, b->y, 0));
  }
  TRY_MOK(mok_gemm_down_dgrad(&rows, H, I, c->limit, b->dy, b->wd, b->gu, b->dgu, 0));
  TRY_MOK(mok_gemm_gateup_dgrad(&rows, H, I, b->dgu, b->wg, wu, b->dx, 0));
  /* bf16 weight grads twice (bitwise check), fp32 once */
  TRY_MOK(mok_gemm_wgrad_gateup(&rows, H, I, b->dgu, b->x, mokDtypeBF16, b->dwg, b->dwu, 0));
  TRY_MOK(mok_gemm_wgrad_down(&rows, H, I, b->dy, b->act, mokDtypeBF16, b->dwd, 0));
  TRY_MOK(mok_gemm_wgrad_gateup(&rows, H, I, b->dgu, b->x, mokDtypeBF16, b->dwg2, b->dwu2, 0));
  TRY_MOK(mok_gemm_wgrad_down(&rows, H, I, b->dy, b->act, mokDtypeBF16, b->dwd2, 0));
  TRY_CUDA(cudaDeviceSynchronize());
  unsigned long long word = 0;
  TRY_MOK(mok_gemm_error_word(&word, 1));
  if (word) return FAIL("a GEMM recorded device error word 0x%llx (a wait ran out)", word);

  const char *err;
  if ((err = nan_scan("act", b->act, used, I, 0, b->bad))) return err;
  if ((err = nan_scan("gu", b->gu, used, 2 * I, 0, b->bad))) return err;
  if ((err = nan_scan("y", b->y, used, H, 0, b->bad))) return err;
  if ((err = nan_scan("dgu", b->dgu, used, 2 * I, 0, b->bad))) return err;
  if ((err = nan_scan("dx", b->dx, used, H, 0, b->bad))) return err;
  if ((err = nan_scan("dW_gate bf16", b->dwg, (int64_t)E * I, H, 0, b->bad))) return err;
  if ((err = nan_scan("dW_up bf16", b->dwu, (int64_t)E * I, H, 0, b->bad))) return err;
  if ((err = nan_scan("dW_down bf16", b->dwd, (int64_t)E * H, I, 0, b->bad))) return err;

  /* host copies */
  const size_t nx = (size_t)used * H, na = (size_t)used * I;
  uint16_t *hx = (uint16_t *)malloc(nx * 2 + 1), *hdy = (uint16_t *)malloc(nx * 2 + 1);
  uint16_t *hy = (uint16_t *)malloc(nx * 2 + 1), *hdx = (uint16_t *)malloc(nx * 2 + 1);
  uint16_t *hact = (uint16_t *)malloc(na * 2 + 1), *hgu = (uint16_t *)malloc(na * 4 + 1);
  uint16_t *hdgu = (uint16_t *)malloc(na * 4 + 1);
  uint16_t *hwg = (uint16_t *)malloc(wsz * 2), *hwu = (uint16_t *)malloc(wsz * 2), *hwd = (uint16_t *)malloc(wsz * 2);
  uint16_t *hdwg = (uint16_t *)malloc(wsz * 2), *hdwu = (uint16_t *)malloc(wsz * 2), *hdwd = (uint16_t *)malloc(wsz * 2);
  uint16_t *hdwg2 = (uint16_t *)malloc(wsz * 2), *hdwu2 = (uint16_t *)malloc(wsz * 2), *hdwd2 = (uint16_t *)malloc(wsz * 2);
  if ((err = copy_down(hx, b->x, nx * 2)) || (err = copy_down(hdy, b->dy, nx * 2)) ||
      (err = copy_down(hy, b->y, nx * 2)) || (err = copy_down(hdx, b->dx, nx * 2)) ||
      (err = copy_down(hact, b->act, na * 2)) || (err = copy_down(hgu, b->gu, na * 4)) ||
      (err = copy_down(hdgu, b->dgu, na * 4)) || (err = copy_down(hwg, b->wg, wsz * 2)) ||
      (err = copy_down(hwu, wu, wsz * 2)) || (err = copy_down(hwd, b->wd, wsz * 2)) ||
      (err = copy_down(hdwg, b->dwg, wsz * 2)) || (err = copy_down(hdwu, b->dwu, wsz * 2)) ||
      (err = copy_down(hdwd, b->dwd, wsz * 2)) || (err = copy_down(hdwg2, b->dwg2, wsz * 2)) ||
      (err = copy_down(hdwu2, b->dwu2, wsz * 2)) || (err = copy_down(hdwd2, b->dwd2, wsz * 2)))
    return err;
  if (memcmp(hdwg, hdwg2, wsz * 2) || memcmp(hdwu, hdwu2, wsz * 2) || memcmp(hdwd, hdwd2, wsz * 2))
    return FAIL("weight gradients differ between two identical runs");

  mokGemmErr_t e_g = {0}, e_u = {0}, e_a = {0}, e_y = {0}, e_dg = {0}, e_du = {0}, e_dx = {0};
  mokGemmErr_t e_wg = {0}, e_wu = {0}, e_wd = {0}, e_pad = {0};
  int64_t boundary = 0, checked = 0; /* g, u values clamped on one side only, at the limit */
  const int maxd = (H > 2 * I ? H : 2 * I);
  double *r1 = (double *)malloc(sizeof(double) * maxd), *r2 = (double *)malloc(sizeof(double) * maxd),
         *r3 = (double *)malloc(sizeof(double) * maxd);
  int *pick = (int *)malloc(sizeof(int) * (size_t)(maxd + 70000));
  for (int e = 0; e < E; ++e) {
    const uint16_t *wg = hwg + (size_t)e * I * H, *wu = hwu + (size_t)e * I * H, *wd = hwd + (size_t)e * H * I;
    const int n = pick_rows(c->counts[e], c->sample_rows, pick);
    for (int k = 0; k < n; ++k) {
      const int64_t r = off_h[e] + pick[k];
      mok_ref_gateup_row(hx + r * H, wg, wu, H, I, c->limit, r1, r2, r3);
      for (int i = 0; i < I; ++i) {
        const double gg = MOK_B2D(hgu[r * 2 * I + i]), gu_ = MOK_B2D(hgu[r * 2 * I + I + i]);
        if (mok_clamp_boundary(gg, r1[i], hx + r * H, wg + (size_t)i * H, H, c->limit)) ++boundary;
        else mok_gemm_err_add(&e_g, gg, r1[i]);
        if (mok_clamp_boundary(gu_, r2[i], hx + r * H, wu + (size_t)i * H, H, c->limit)) ++boundary;
        else mok_gemm_err_add(&e_u, gu_, r2[i]);
        mok_gemm_err_add(&e_a, MOK_B2D(hact[r * I + i]), r3[i]);
        checked += 2;
      }
      mok_ref_down_row(hact + r * I, wd, H, I, r1);
      for (int h = 0; h < H; ++h) mok_gemm_err_add(&e_y, MOK_B2D(hy[r * H + h]), r1[h]);
      mok_ref_down_dgrad_row(hdy + r * H, wd, hgu + r * 2 * I, H, I, c->limit, r1, r2);
      for (int i = 0; i < I; ++i) {
        mok_gemm_err_add(&e_dg, MOK_B2D(hdgu[r * 2 * I + i]), r1[i]);
        mok_gemm_err_add(&e_du, MOK_B2D(hdgu[r * 2 * I + I + i]), r2[i]);
      }
      mok_ref_gateup_dgrad_row(hdgu + r * 2 * I, wg, wu, H, I, r1);
      for (int h = 0; h < H; ++h) mok_gemm_err_add(&e_dx, MOK_B2D(hdx[r * H + h]), r1[h]);
    }
    /* padding rows of every output must be exactly zero */
    for (int64_t r = off_h[e] + c->counts[e]; r < off_h[e + 1]; ++r) {
      for (int i = 0; i < 2 * I; ++i) mok_gemm_err_add(&e_pad, MOK_B2D(hgu[r * 2 * I + i]) + MOK_B2D(hdgu[r * 2 * I + i]), 0.0);
      for (int i = 0; i < I; ++i) mok_gemm_err_add(&e_pad, MOK_B2D(hact[r * I + i]), 0.0);
      for (int h = 0; h < H; ++h) mok_gemm_err_add(&e_pad, MOK_B2D(hy[r * H + h]) + MOK_B2D(hdx[r * H + h]), 0.0);
    }
    /* weight gradients over this expert's rows (all of the segment: padding is zero) */
    const int64_t seg = off_h[e + 1] - off_h[e];
    const uint16_t *xe = hx + off_h[e] * H, *dye = hdy + off_h[e] * H;
    const uint16_t *dgue = hdgu + off_h[e] * 2 * I, *acte = hact + off_h[e] * I;
    const int nwi = pick_rows(I, c->sample_wrows, pick);
    for (int k = 0; k < nwi; ++k) {
      const int m = pick[k];
      mok_ref_wgrad_row(dgue, 2 * I, m, xe, H, seg, r1);
      mok_ref_wgrad_row(dgue, 2 * I, I + m, xe, H, seg, r2);
      for (int h = 0; h < H; ++h) {
        mok_gemm_err_add(&e_wg, MOK_B2D(hdwg[((size_t)e * I + m) * H + h]), r1[h]);
        mok_gemm_err_add(&e_wu, MOK_B2D(hdwu[((size_t)e * I + m) * H + h]), r2[h]);
      }
    }
    const int nwh = pick_rows(H, c->sample_wrows, pick);
    for (int k = 0; k < nwh; ++k) {
      const int m = pick[k];
      mok_ref_wgrad_row(dye, H, m, acte, I, seg, r1);
      for (int i = 0; i < I; ++i) mok_gemm_err_add(&e_wd, MOK_B2D(hdwd[((size_t)e * H + m) * I + i]), r1[i]);
    }
  }
  free(r1); free(r2); free(r3); free(pick);
  free(hx); free(hdy); free(hy); free(hdx); free(hact); free(hgu); free(hdgu);
  free(hwg); free(hwu); free(hwd); free(hdwg); free(hdwu); free(hdwd); free(hdwg2); free(hdwu2); free(hdwd2);
  free(off_h);

  if (e_pad.diff2 != 0.0 || e_pad.nan) return FAIL("padding rows of an output are not zero");
  if (boundary * 1000 > checked)
    return FAIL("%lld of %lld g, u values clamped on one side only (more than rounding at the limit explains)",
                (long long)boundary, (long long)checked);
  struct { const char *name; mokGemmErr_t *e; } all[] = {
      {"g", &e_g}, {"u", &e_u}, {"act", &e_a}, {"y", &e_y}, {"dg", &e_dg}, {"du", &e_du},
      {"dx", &e_dx}, {"dW_gate", &e_wg}, {"dW_up", &e_wu}, {"dW_down", &e_wd}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
    const double rel = mok_gemm_err_rel(all[i].e);
    /* an all-zero reference (no rows at all) must give exact zeros */
    if (!(rel < 1e-2)) return FAIL("%s: relative L2 error %.3g >= 1e-2 (E=%d H=%d I=%d)", all[i].name, rel, E, H, I);
  }

  /* fp32 weight gradients: same rows, compare with the bf16 ones (both against fp32 sums) */
  TRY_CUDA(cudaMemset(b->dwg, 0xFF, wsz * 4));
  TRY_CUDA(cudaMemset(b->dwd, 0xFF, wsz * 4));
  TRY_MOK(mok_gemm_wgrad_gateup(&rows, H, I, b->dgu, b->x, mokDtypeFP32, b->dwg, b->dwu, 0));
  TRY_MOK(mok_gemm_wgrad_down(&rows, H, I, b->dy, b->act, mokDtypeFP32, b->dwd, 0));
  TRY_CUDA(cudaDeviceSynchronize());
  if ((err = nan_scan("dW_gate fp32", b->dwg, (int64_t)E * I, H, 1, b->bad))) return err;
  if ((err = nan_scan("dW_up fp32", b->dwu, (int64_t)E * I, H, 1, b->bad))) return err;
  if ((err = nan_scan("dW_down fp32", b->dwd, (int64_t)E * H, I, 1, b->bad))) return err;
  {
    float *f = (float *)malloc(wsz * 4);
    uint16_t *h16 = (uint16_t *)malloc(wsz * 2);
    TRY_CUDA(cudaMemcpy(f, b->dwd, wsz * 4, cudaMemcpyDeviceToHost));
    TRY_CUDA(cudaMemcpy(h16, b->dwd2, wsz * 2, cudaMemcpyDeviceToHost));
    /* the bf16 output must be exactly the fp32 output rounded once */
    size_t mism = 0;
    for (size_t i = 0; i < wsz; ++i) mism += mok_f32_to_bf16(f[i]) != h16[i];
    free(f);
    free(h16);
    if (mism) return FAIL("dW_down: %zu bf16 elements are not the rounded fp32 result", mism);
  }
  return NULL;
}

static const char *run_case(const gemm_case *c, uint64_t seed) {
  gemm_bufs b;
  memset(&b, 0, sizeof b);
  const char *err = run_case_impl(c, seed, &b);
  free_bufs(&b);
  return err;
}

MOK_GPU_TEST(gemm_gpu_awkward_rows, 1) {
  /* empty expert, one row, rows not a multiple of the tile (or of 64), I and H not
   * multiples of the tile width */
  static const int counts[5] = {0, 1, 130, 77, 64};
  gemm_case c = {5, 320, 192, counts, 0.0f, 0, 0};
  const char *err = run_case(&c, test_seed());
  CHECK_MSG(err == NULL, "%s", err);
}

MOK_GPU_TEST(gemm_gpu_token_tiles_awkward_rows, 1) {
  /* forward gate+up (I = 256) and down (H = 512) on token tiles of every width. With
   * expert counts the tiles cover the routed rows rounded up to 16: 1 -> 16, 20 -> 32,
   * 40 -> 48, 64, 70 -> 80, 90 -> 96, 100 -> 112, 128, 140 -> 144, 150 -> 160, 170 -> 176,
   * 341 -> 176 + 176, 300 -> 160 + 144, 1000 -> 7 x 144, and the rest of each
   * segment is written as zeros (the outputs start as NaN poison). Without counts they
   * cover the segments (multiples of 64): 64, 64, 64, 64, 128, 128, 128, 128, 192 -> 96 +
   * 96, 192, 192, 384 -> 3 x 128, 320 -> 160 + 160, 1024 -> 6 x 160-176. The backward
   * kinds then read what they wrote. */
  static const int counts[15] = {0, 1, 20, 40, 64, 70, 90, 100, 128, 140, 150, 170, 341, 300, 1000};
  mokGemmTileShape_t s1, s2;
  CHECK_OK(mok_gemm_tile_shape(mokGemmGateUpFwd, 512, 256, &s1));
  CHECK_OK(mok_gemm_tile_shape(mokGemmDownFwd, 512, 256, &s2));
  CHECK_MSG(s1.token && s2.token, "the shape does not select token tiles");
  for (int no_counts = 0; no_counts < 2; ++no_counts) {
    gemm_case c = {15, 512, 256, counts, 0.0f, 24, 32, no_counts};
    const char *err = run_case(&c, test_seed() ^ 0x70c ^ (uint64_t)no_counts);
    CHECK_MSG(err == NULL, "%s expert counts: %s", no_counts ? "without" : "with", err);
  }
}

/* Each case's whole chain against float64 with a diagnostics knob set to `mode` (back to 0,
 * the rule, after each); salt picks the cases' seeds. */
static void run_cases_with_knob(test_ctx *t, mokResult_t (*knob)(int), int mode, const gemm_case *cases, int n,
                                uint64_t salt) {
  for (int i = 0; i < n; ++i) {
    CHECK_OK(knob(mode));
    const char *err = run_case(&cases[i], test_seed() ^ salt ^ (uint64_t)i);
    CHECK_OK(knob(0));
    CHECK_MSG(err == NULL, "case %d: %s", i, err);
  }
}

MOK_GPU_TEST(gemm_gpu_ddown_token_tiles, 1) {
  /* The experiment mok_gemm_debug_ddown_tok: down dgrad on token tiles (W_down^T as the
   * MN-major A operand, the expert's rows as N, g and u read back in 32-row pieces), the
   * whole chain checked against float64: token tiles of every width with expert counts,
   * without counts (whole segments), I of one and of three 256-column blocks, and with a
   * SwiGLU limit on a hot expert (cut values saved as +-inf). */
  static const int counts[15] = {0, 1, 20, 40, 64, 70, 90, 100, 128, 140, 150, 170, 341, 300, 1000};
  static const int hot[3] = {0, 700, 33};
  const gemm_case cases[4] = {{15, 512, 256, counts, 0.0f, 24, 32, 0}, {15, 512, 256, counts, 0.0f, 24, 32, 1},
                              {6, 256, 768, counts + 9, 0.0f, 0, 32, 0}, {3, 256, 256, hot, 1.0f, 40, 0, 0}};
  run_cases_with_knob(t, mok_gemm_debug_ddown_tok, 1, cases, 4, 0xdd70c);
}

MOK_GPU_TEST(gemm_gpu_gateup_row_tiles, 1) {
  /* The diagnostics knob mok_gemm_debug_gu_rows: the forward gate+up of an I % 128 == 0
   * shape on the row-grouped 128-row tiles (rows as wgmma M, 64-row tails) instead of token
   * tiles, the whole chain checked against float64: every tile width with and without
   * expert counts, and a SwiGLU limit on a hot expert. */
  static const int counts[15] = {0, 1, 20, 40, 64, 70, 90, 100, 128, 140, 150, 170, 341, 300, 1000};
  static const int hot[3] = {0, 700, 33};
  const gemm_case cases[3] = {{15, 512, 256, counts, 0.0f, 24, 32, 0}, {15, 512, 256, counts, 0.0f, 24, 32, 1},
                              {3, 256, 256, hot, 1.0f, 40, 0, 0}};
  run_cases_with_knob(t, mok_gemm_debug_gu_rows, 1, cases, 3, 0x9a70c);
}

MOK_GPU_TEST(gemm_gpu_gateup_rows_m, 1) {
  /* Gate+up token tiles of exactly 128 rows with the rows as wgmma M (mok_gemm_debug_gu_rows
   * 3, tok_consume_rows_m) beside the other widths, the whole chain checked against
   * float64: experts of 128, 256, 384, 512 rows and of 120 and 250 (their last 128-row tile
   * partly padding), with and without expert counts, and a SwiGLU limit on a hot expert
   * (cut values saved as +-inf); and the fused forward, whose kernels leave the knob alone. */
  static const int counts[12] = {128, 256, 120, 250, 512, 100, 0, 384, 1000, 64, 1, 170};
  static const int hot[3] = {0, 768, 33};
  const gemm_case cases[4] = {{12, 512, 256, counts, 0.0f, 24, 32, 0, 0}, {12, 512, 256, counts, 0.0f, 24, 32, 1, 0},
                              {12, 512, 256, counts, 0.0f, 24, 32, 0, 1}, {3, 256, 384, hot, 1.0f, 40, 0, 0, 0}};
  run_cases_with_knob(t, mok_gemm_debug_gu_rows, 3, cases, 4, 0x9a7e);
}

/* The rows-as-M tests' layout: experts of 128, 256 and 512 rows (tiles of exactly 128 rows)
 * beside others, 64-row segments; offsets and counts on the device. Returns the capacity
 * (0: a CUDA call failed). */
enum { kRowsMExperts = 6 };
static int64_t rows_m_layout(int32_t **off, int32_t **cnt) {
  static const int counts[kRowsMExperts] = {128, 256, 90, 512, 0, 200};
  int32_t off_h[kRowsMExperts + 1], cnt_h[kRowsMExperts];
  off_h[0] = 0;
  for (int e = 0; e < kRowsMExperts; ++e) off_h[e + 1] = off_h[e] + (counts[e] + 63) / 64 * 64, cnt_h[e] = counts[e];
  if (cudaMalloc(off, sizeof off_h) != cudaSuccess || cudaMalloc(cnt, sizeof cnt_h) != cudaSuccess ||
      cudaMemcpy(*off, off_h, sizeof off_h, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(*cnt, cnt_h, sizeof cnt_h, cudaMemcpyHostToDevice) != cudaSuccess)
    return 0;
  return off_h[kRowsMExperts];
}

MOK_GPU_TEST(gemm_gpu_gateup_rows_m_bitwise, 1) {
  /* The rows as wgmma M or as N in the 128-row gate+up token tiles: act and g|u bitwise the
   * same (each output element's products summed in the same k order either way), so the
   * layer's results do not depend on which kernel ran a tile (the megakernel has the rows-as-M
   * path, the fused forward's kernel not). Experts of 128, 256 and 512 rows beside others,
   * with and without a SwiGLU limit. */
  enum { E = kRowsMExperts, H = 512, I = 384 };
  int32_t *off = NULL, *cnt = NULL;
  const int64_t cap = rows_m_layout(&off, &cnt);
  mokBf16 *x = NULL, *w = NULL, *out[2][2] = {{NULL, NULL}, {NULL, NULL}};
  CHECK(cap > 0);
  CHECK(cudaMalloc(&x, (size_t)cap * H * 2) == cudaSuccess && cudaMalloc(&w, 2 * (size_t)E * I * H * 2) == cudaSuccess);
  for (int v = 0; v < 2; ++v) {
    CHECK(cudaMalloc(&out[v][0], (size_t)cap * I * 2) == cudaSuccess);
    CHECK(cudaMalloc(&out[v][1], (size_t)cap * 2 * I * 2) == cudaSuccess);
  }
  if (t->failed) return;
  const uint64_t seed = test_seed() ^ 0xb17;
  CHECK_OK(mokGenerateBf16Device(seed, mokTensorX, 0, 0, cap * H, 1.0f, x, 0));
  CHECK_OK(mokGenerateBf16Device(seed, mokTensorWGate, 0, 0, 2 * (int64_t)E * I * H, 0.05f, w, 0));
  mokGemmRows_t rows = {E, cap, off};
  rows.expert_count = cnt;
  for (int lim = 0; lim < 2 && !t->failed; ++lim) {
    for (int v = 0; v < 2; ++v) {
      CHECK(cudaMemset(out[v][0], 0x7f, (size_t)cap * I * 2) == cudaSuccess);
      CHECK(cudaMemset(out[v][1], 0x7f, (size_t)cap * 2 * I * 2) == cudaSuccess);
      CHECK_OK(mok_gemm_debug_gu_rows(v ? 3 : 2));
      CHECK_OK(mok_gemm_gateup_fwd(&rows, H, I, lim ? 1.0f : 0.0f, x, w, w + (size_t)E * I * H, out[v][0], out[v][1], 0));
      CHECK_OK(mok_gemm_debug_gu_rows(0));
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    for (int o = 0; o < 2 && !t->failed; ++o) {
      const size_t n = (size_t)cap * (o ? 2 * I : I);
      uint16_t *a = (uint16_t *)malloc(n * 2), *b = (uint16_t *)malloc(n * 2);
      CHECK(cudaMemcpy(a, out[0][o], n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK(cudaMemcpy(b, out[1][o], n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
      size_t diff = 0, first = 0;
      for (size_t i = 0; i < n; ++i)
        if (a[i] != b[i] && !diff++) first = i;
      CHECK_MSG(diff == 0, "limit %d, %s: %zu of %zu values differ (first at row %zu col %zu: %04x vs %04x)", lim,
                o ? "g|u" : "act", diff, n, first / (o ? 2 * I : I), first % (o ? 2 * I : I), a[first], b[first]);
      free(a);
      free(b);
    }
  }
  cudaFree(off); cudaFree(cnt); cudaFree(x); cudaFree(w);
  for (int v = 0; v < 2; ++v) cudaFree(out[v][0]), cudaFree(out[v][1]);
}

MOK_GPU_TEST(gemm_gpu_down_rows_m_bitwise, 1) {
  /* The down GEMM's 128-row token tiles with the rows as wgmma M (the rule,
   * mok_gemm_debug_dn_rows 2; the 128-row ring's instance) give y bitwise as with the rows as
   * N (1); on the 176-row ring (rows as N either way) the knob changes nothing. Experts of
   * 128, 256 and 512 rows beside others. */
  enum { E = kRowsMExperts, H = 512, I = 384 };
  int32_t *off = NULL, *cnt = NULL;
  const int64_t cap = rows_m_layout(&off, &cnt);
  mokBf16 *act = NULL, *w = NULL, *y[2] = {NULL, NULL};
  CHECK(cap > 0);
  CHECK(cudaMalloc(&act, (size_t)cap * I * 2) == cudaSuccess && cudaMalloc(&w, (size_t)E * H * I * 2) == cudaSuccess);
  for (int v = 0; v < 2; ++v) CHECK(cudaMalloc(&y[v], (size_t)cap * H * 2) == cudaSuccess);
  if (t->failed) return;
  const uint64_t seed = test_seed() ^ 0xd0b17;
  CHECK_OK(mokGenerateBf16Device(seed, mokTensorX, 0, 0, cap * I, 1.0f, act, 0));
  CHECK_OK(mokGenerateBf16Device(seed, mokTensorWDown, 0, 0, (int64_t)E * H * I, 0.05f, w, 0));
  mokGemmRows_t rows = {E, cap, off};
  rows.expert_count = cnt;
  const size_t n = (size_t)cap * H;
  uint16_t *a = (uint16_t *)malloc(n * 2), *b = (uint16_t *)malloc(n * 2);
  for (int ring = 0; ring < 2 && !t->failed; ++ring) {
    for (int v = 0; v < 2; ++v) {
      CHECK(cudaMemset(y[v], 0x7f, n * 2) == cudaSuccess);
      CHECK_OK(mok_gemm_debug_tok_ring(ring ? 1 : 2));
      CHECK_OK(mok_gemm_debug_dn_rows(v + 1));
      CHECK_OK(mok_gemm_down_fwd(&rows, H, I, act, w, y[v], 0));
      CHECK_OK(mok_gemm_debug_dn_rows(0));
      CHECK_OK(mok_gemm_debug_tok_ring(0));
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaMemcpy(a, y[0], n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(b, y[1], n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (a[i] != b[i] && !diff++) first = i;
    CHECK_MSG(diff == 0, "ring %d: %zu of %zu values of y differ (first at row %zu col %zu: %04x vs %04x)",
              ring ? 128 : 176, diff, n, first / H, first % H, a[first], b[first]);
  }
  free(a);
  free(b);
  cudaFree(off); cudaFree(cnt); cudaFree(act); cudaFree(w); cudaFree(y[0]); cudaFree(y[1]);
}

MOK_GPU_TEST(gemm_gpu_clamp_hot_expert, 1) {
  /* one hot expert holds every row; SwiGLU clamp L = 1 cuts many g and u */
  static const int counts[3] = {0, 1500, 0};
  gemm_case c = {3, 256, 128, counts, 1.0f, 40, 0};
  const char *err = run_case(&c, test_seed() ^ 0x1234);
  CHECK_MSG(err == NULL, "%s", err);
}

MOK_GPU_TEST(gemm_gpu_one_expert, 1) {
  static const int counts[1] = {200};
  gemm_case c = {1, 2880, 256, counts, 0.0f, 24, 64}; /* H = 2880: 192-wide tiles, half M tile */
  const char *err = run_case(&c, test_seed() ^ 0x777);
  CHECK_MSG(err == NULL, "%s", err);
}

MOK_GPU_TEST(gemm_gpu_inter_2880, 1) {
  static const int counts[2] = {70, 203};
  gemm_case c = {2, 512, 2880, counts, 7.0f, 12, 48}; /* gpt-oss I, clamp 7 as gpt-oss */
  const char *err = run_case(&c, test_seed() ^ 0x2880);
  CHECK_MSG(err == NULL, "%s", err);
}

MOK_GPU_TEST(gemm_gpu_many_experts, 1) {
  /* more experts than one warp scans in one step, uneven, several empty */
  int counts[100];
  for (int e = 0; e < 100; ++e) counts[e] = (e % 7 == 3) ? 0 : (e * 37) % 150 + 1;
  gemm_case c = {100, 256, 128, counts, 0.0f, 3, 16};
  const char *err = run_case(&c, test_seed() ^ 0x100);
  CHECK_MSG(err == NULL, "%s", err);
}

/* ---- GPU: the fused forward (gate+up then down in one launch) --------------------- */
MOK_GPU_TEST(gemm_gpu_ffn_fused_matches_float64, 1) {
  /* mok_gemm_ffn_fwd with the fused launch on, then the backward kinds on its outputs,
   * everything against float64 (run_case): token tiles of every width with an empty
   * expert, uneven experts (tickets, experts with most rows first), a hot expert with the
   * SwiGLU limit, whole segments without counts, and one balanced layout (static schedule,
   * expert 0 cut in half: stagger); then with the counts on the host as the layer gives
   * them, so that the ring rule picks the 128-row stages (every tile <= 128 rows, a SwiGLU
   * limit: gate+up's epilogue in its own area) or the 176-row ones. */
  static const int counts[15] = {0, 1, 20, 40, 64, 70, 90, 100, 128, 140, 150, 170, 341, 300, 1000};
  static const int hot[3] = {0, 700, 33};
  static const int even[8] = {320, 320, 320, 320, 320, 320, 320, 320};
  static const int small[6] = {256, 512, 100, 0, 128, 33}; /* every tile <= 128 rows */
  const gemm_case cases[6] = {{15, 512, 256, counts, 0.0f, 24, 32, 0, 1},
                              {15, 512, 256, counts, 0.0f, 24, 32, 1, 1},
                              {3, 256, 256, hot, 1.0f, 40, 0, 0, 1},
                              {8, 512, 384, even, 0.0f, 12, 24, 0, 1},
                              {6, 512, 256, small, 2.0f, 16, 24, 0, 2},
                              {15, 512, 256, counts, 0.0f, 24, 32, 0, 2}};
  for (int i = 0; i < 6; ++i) {
    const char *err = run_case(&cases[i], test_seed() ^ 0xff17 ^ (uint64_t)i);
    CHECK_MSG(err == NULL, "case %d: %s", i, err);
  }
}

/* act, g|u and y of one forward (ffn: mok_gemm_ffn_fwd with the knob `ffn`; else the two
 * calls) into host buffers. */
static const char *ffn_outputs(int ffn, int sched, const mokGemmRows_t *rows, int H, int I, float limit, int64_t cap,
                               const mokBf16 *x, const mokBf16 *wg, const mokBf16 *wu, const mokBf16 *wd,
                               mokBf16 *act, mokBf16 *gu, mokBf16 *y, uint16_t *h) {
  const char *err = NULL;
  cudaMemset(act, 0xFF, (size_t)cap * I * 2);
  cudaMemset(gu, 0xFF, (size_t)cap * I * 4);
  cudaMemset(y, 0xFF, (size_t)cap * H * 2);
  if (mok_gemm_debug_sched(sched, 1) != mokSuccess || mok_gemm_debug_ffn(ffn) != mokSuccess ||
      mok_gemm_ffn_fwd(rows, H, I, limit, x, wg, wu, wd, act, gu, y, 0) != mokSuccess)
    err = FAIL("launch failed: %s", mokGetLastError());
  else if (cudaMemcpy(h, act, (size_t)cap * I * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
           cudaMemcpy(h + (size_t)cap * I, gu, (size_t)cap * I * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
           cudaMemcpy(h + (size_t)cap * I * 3, y, (size_t)cap * H * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
    err = "cudaMemcpy failed";
  mok_gemm_debug_sched(0, 1);
  mok_gemm_debug_ffn(0);
  return err;
}

MOK_GPU_TEST(gemm_gpu_ffn_fused_is_bitwise_two_launches, 1) {
  /* The fused launch against the two launches it replaces, every bit of act, g|u and y
   * (padding rows included: both write zeros there), on balanced experts (static
   * schedule, stagger), uneven ones with an empty expert and a one-row one (tickets, the
   * split mix order: experts of one and of several tiles), many small experts (one tile
   * each), tiles of <= 128 rows with the counts on the host
   * (the 128-row ring, a SwiGLU limit), and each layout also under the other schedule. */
  enum { H = 512, I = 256, kLayouts = 4 };
  static const int bal[8] = {320, 320, 320, 320, 320, 320, 320, 320};
  static const int uneven[7] = {700, 0, 1, 190, 64, 33, 341};
  static const int small[6] = {256, 512, 100, 0, 128, 33}; /* host counts: the 128-row ring */
  int many[40];
  for (int e = 0; e < 40; ++e) many[e] = (e * 53) % 97 + (e % 5 == 0 ? 0 : 17);
  const int *layouts[kLayouts] = {bal, uneven, many, small};
  const int nexp[kLayouts] = {8, 7, 40, 6};
  const float limit[kLayouts] = {0.0f, 0.0f, 0.0f, 1.5f};
  for (int l = 0; l < kLayouts && !t->failed; ++l) {
    const int E = nexp[l];
    int32_t *off_h = (int32_t *)calloc((size_t)E + 1, sizeof(int32_t));
    for (int e = 0; e < E; ++e) off_h[e + 1] = off_h[e] + (layouts[l][e] + 63) / 64 * 64;
    const int64_t cap = off_h[E] + 64;
    int32_t *off = NULL, *cnt = NULL;
    mokBf16 *x = NULL, *wg = NULL, *wu = NULL, *wd = NULL, *act = NULL, *gu = NULL, *y = NULL;
    const size_t wsz = (size_t)E * I * H, per = (size_t)cap * (I * 3 + H);
    uint16_t *h[2] = {(uint16_t *)malloc(per * 2), (uint16_t *)malloc(per * 2)};
    CHECK(cudaMalloc(&off, sizeof(int32_t) * (E + 1)) == cudaSuccess);
    CHECK(cudaMalloc(&cnt, sizeof(int32_t) * E) == cudaSuccess);
    CHECK(cudaMalloc(&x, (size_t)cap * H * 2) == cudaSuccess);
    CHECK(cudaMalloc(&wg, wsz * 4) == cudaSuccess); /* W_up right after W_gate: the fused launch's 4-D box */
    wu = wg + wsz;
    CHECK(cudaMalloc(&wd, wsz * 2) == cudaSuccess);
    CHECK(cudaMalloc(&act, (size_t)cap * I * 2) == cudaSuccess);
    CHECK(cudaMalloc(&gu, (size_t)cap * I * 4) == cudaSuccess);
    CHECK(cudaMalloc(&y, (size_t)cap * H * 2) == cudaSuccess);
    CHECK(cudaMemcpy(off, off_h, sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(cnt, layouts[l], sizeof(int32_t) * E, cudaMemcpyHostToDevice) == cudaSuccess);
    const uint64_t seed = test_seed() ^ 0xf00d ^ (uint64_t)l;
    CHECK_OK(mok_gemm_fill_rows(x, cap, H, seed + 1, 1.0f, E, off, cnt, 0));
    CHECK_OK(mok_gemm_fill_rows(wg, (int64_t)E * I, H, seed + 2, 1.0f / sqrtf((float)H), 0, NULL, NULL, 0));
    CHECK_OK(mok_gemm_fill_rows(wu, (int64_t)E * I, H, seed + 3, 1.0f / sqrtf((float)H), 0, NULL, NULL, 0));
    CHECK_OK(mok_gemm_fill_rows(wd, (int64_t)E * H, I, seed + 4, 1.0f / sqrtf((float)I), 0, NULL, NULL, 0));
    mokGemmRows_t rows = {E, cap, off, cnt};
    if (l == 3) rows.expert_count_host = layouts[l];
    for (int sched = 0; sched < 3 && !t->failed; ++sched) { /* the rule, static, tickets */
      unsigned long long n0 = 0, n1 = 0, n2 = 0;
      CHECK_OK(mok_gemm_debug_ffn_launches(&n0));
      const char *err = ffn_outputs(2, sched, &rows, H, I, limit[l], cap, x, wg, wu, wd, act, gu, y, h[0]);
      CHECK_OK(mok_gemm_debug_ffn_launches(&n1));
      if (!err) err = ffn_outputs(1, sched, &rows, H, I, limit[l], cap, x, wg, wu, wd, act, gu, y, h[1]);
      CHECK_OK(mok_gemm_debug_ffn_launches(&n2));
      CHECK_MSG(err == NULL, "layout %d, schedule %d: %s", l, sched, err);
      if (err) break;
      CHECK_MSG(n1 == n0 && n2 == n1 + 1, "layout %d, schedule %d: fused launches %llu, %llu (want 0 then 1)", l,
                sched, n1 - n0, n2 - n1);
      size_t diff = 0, first = per;
      for (size_t i = 0; i < per; ++i)
        if (h[0][i] != h[1][i]) diff += 1, first = first < i ? first : i;
      CHECK_MSG(diff == 0, "layout %d, schedule %d: %zu of %zu outputs differ (first at %zu: %04x vs %04x)", l, sched,
                diff, per, first, first < per ? h[0][first] : 0, first < per ? h[1][first] : 0);
    }
    unsigned long long word = 0;
    CHECK_OK(mok_gemm_error_word(&word, 1));
    CHECK_MSG(word == 0, "layout %d: device error word 0x%llx", l, word);
    free(h[0]); free(h[1]); free(off_h);
    cudaFree(off); cudaFree(cnt); cudaFree(x); cudaFree(wg); cudaFree(wd);
    cudaFree(act); cudaFree(gu); cudaFree(y);
  }
}

/* The segment offsets of these routed-row counts (each padded to 64) on the device, their
 * total rows in *cap; NULL if cudaMalloc or the copy failed. */
static int32_t *dev_offsets(const int *counts, int E, int64_t *cap) {
  int32_t *off_h = (int32_t *)calloc((size_t)E + 1, sizeof(int32_t)), *off = NULL;
  for (int e = 0; e < E; ++e) off_h[e + 1] = off_h[e] + (counts[e] + 63) / 64 * 64;
  *cap = off_h[E];
  if (cudaMalloc(&off, sizeof(int32_t) * (E + 1)) != cudaSuccess ||
      cudaMemcpy(off, off_h, sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaFree(off);
    off = NULL;
  }
  free(off_h);
  return off;
}

/* Waits (polling, at most 10 s) for stream s; a launch still running then means a wait
 * that is not bounded: the test run ends there (the GPU cannot be reclaimed). */
static cudaError_t poll_stream(cudaStream_t s, const char *test) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cudaError_t q;
  while ((q = cudaStreamQuery(s)) == cudaErrorNotReady) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) > 10.0) {
      printf("FAIL  %-52s  the GEMM with a lost load still runs after 10 s: its waits are not bounded. "
             "Ending the test run here.\n", test);
      fflush(stdout);
      _Exit(1);
    }
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
  return q;
}

/* ---- GPU: a lost load becomes a reported timeout, and the next launches still work -- */
MOK_GPU_TEST(gemm_gpu_stalled_load_times_out, 1) {
  /* The producer of tile 2 (gate+up alone, then in CTA pairs: pair 2, then the fused
   * forward: a gate+up tile of expert 0) never issues its loads (test knob): its
   * consumers' wait must run out after the 50 ms budget, record TIMEOUT / GEMM load / tile
   * 2 in the module's error word (the fused forward: that, or its down tiles' wait on
   * expert 0's gate+up tiles, whichever is recorded first) and end the kernel (polled for
   * at most 10 s, never synchronised blindly). Then, knob off and word cleared, a full
   * chain of every kind must be right again, through the two launches and the fused one:
   * the aborted launches left their counters zeroed. */
  enum { E = 3, H = 256, I = 256 };
  static const int counts[E] = {300, 0, 200};
  int64_t cap = 0;
  int32_t *off = dev_offsets(counts, E, &cap);
  mokBf16 *x = NULL, *wg = NULL, *act = NULL, *y = NULL;
  cudaStream_t s = NULL;
  const size_t wsz = (size_t)E * I * H;
  CHECK(off != NULL);
  CHECK(cudaMalloc(&x, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&wg, wsz * 4) == cudaSuccess); /* W_gate (= W_down), then W_up: the fused 4-D box */
  CHECK(cudaMalloc(&act, (size_t)cap * I * 2) == cudaSuccess);
  CHECK(cudaMalloc(&y, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaMemset(x, 0, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMemset(wg, 0, wsz * 4) == cudaSuccess);
  unsigned long long word = 0;
  CHECK_OK(mok_gemm_error_word(&word, 1)); /* start clean */
  for (int mode = 0; mode < 3 && !t->failed; ++mode) { /* alone, CTA pairs, fused */
    unsigned long long n0 = 0, n1 = 0;
    CHECK_OK(mok_gemm_debug_ffn_launches(&n0));
    CHECK_OK(mok_gemm_debug_pairs(mode == 1 ? 1 : 2));
    CHECK_OK(mok_gemm_debug_ffn(1));
    CHECK_OK(mok_gemm_debug_set(50000000ull, 2));
    const mokGemmRows_t rows = {E, cap, off};
    const mokResult_t launched = mode < 2 ? mok_gemm_gateup_fwd(&rows, H, I, 0.0f, x, wg, wg + wsz, act, NULL, s)
                                          : mok_gemm_ffn_fwd(&rows, H, I, 0.0f, x, wg, wg + wsz, wg, act, NULL, y, s);
    CHECK_OK(mok_gemm_debug_set(0, -1));
    CHECK_OK(mok_gemm_debug_ffn(0));
    CHECK_OK(mok_gemm_debug_pairs(0));
    CHECK_OK(launched);
    CHECK_OK(mok_gemm_debug_ffn_launches(&n1));
    CHECK_MSG(n1 - n0 == (mode == 2), "mode %d: %llu fused launches", mode, n1 - n0);
    const cudaError_t q = poll_stream(s, "gemm_gpu_stalled_load_times_out");
    CHECK_MSG(q == cudaSuccess, "the aborted GEMM launch failed: %s (it must end cleanly)", cudaGetErrorString(q));
    CHECK_OK(mok_gemm_error_word(&word, 1));
    CHECK_MSG(MOK_ERRWORD_KIND(word) == MOK_DEVERR_TIMEOUT, "mode %d: error word 0x%llx: kind %u, want timeout (%u)",
              mode, word, MOK_ERRWORD_KIND(word), MOK_DEVERR_TIMEOUT);
    const unsigned what = MOK_ERRWORD_WHAT(word), where = MOK_ERRWORD_WHERE(word);
    CHECK_MSG((what == MOK_WAIT_GEMM_LOAD && where == 2) || (mode == 2 && what == MOK_WAIT_GEMM_DEP && where == 0),
              "mode %d: error word 0x%llx: what %u where %u, want a GEMM load wait (%d) of tile 2 (fused: or a "
              "dependency wait (%d) of expert 0)",
              mode, word, what, where, MOK_WAIT_GEMM_LOAD, MOK_WAIT_GEMM_DEP);
    CHECK_OK(mok_gemm_error_word(&word, 0));
    CHECK_MSG(word == 0, "the error word was not cleared: 0x%llx", word);
  }
  cudaStreamDestroy(s);
  cudaFree(off); cudaFree(x); cudaFree(wg); cudaFree(act); cudaFree(y);
  static const int again[4] = {130, 0, 64, 257};
  for (int fused = 0; fused < 2; ++fused) {
    gemm_case c = {4, fused ? 512 : 320, 256, again, 0.0f, 0, 0, 0, fused}; /* (fused: H % 256 == 0) */
    const char *err = run_case(&c, test_seed() ^ 0x5a11 ^ (uint64_t)fused);
    CHECK_MSG(err == NULL, "after the aborted launches (%s): %s", fused ? "fused" : "two launches", err);
  }
}

/* ---- GPU: the tile schedule changes no bit of any output --------------------------- */
static const char *sched_outputs(int mode, int mix, int pairs, int mix_ctas, int E, int H, int I, int64_t cap, const int32_t *off,
                                 const mokBf16 *x, const mokBf16 *wg, const mokBf16 *wu, const mokBf16 *dgu,
                                 uint16_t *h_act,
                                 uint16_t *h_y, uint16_t *h_dw) {
  mokBf16 *act = NULL, *gu = NULL, *y = NULL, *dwg = NULL, *dwu = NULL;
  const char *err = NULL;
  const mokGemmRows_t rows = {E, cap, off};
  const size_t wsz = (size_t)E * I * H;
  if (cudaMalloc(&act, (size_t)cap * I * 2) != cudaSuccess || cudaMalloc(&gu, (size_t)cap * I * 4) != cudaSuccess ||
      cudaMalloc(&y, (size_t)cap * H * 2) != cudaSuccess || cudaMalloc(&dwg, wsz * 2) != cudaSuccess ||
      cudaMalloc(&dwu, wsz * 2) != cudaSuccess) {
    err = "cudaMalloc failed";
  } else if (mok_gemm_debug_sched(mode, 1) != mokSuccess || mok_gemm_debug_tiles(0, 0, mix ? 1 : 2) != mokSuccess ||
             mok_gemm_debug_pairs(pairs ? 1 : 2) != mokSuccess || mok_gemm_debug_mix_ctas(mix_ctas) != mokSuccess ||
             mok_gemm_gateup_fwd(&rows, H, I, 0.0f, x, wg, wu, act, gu, 0) != mokSuccess ||
             mok_gemm_down_fwd(&rows, H, I, act, wg, y, 0) != mokSuccess ||
             mok_gemm_wgrad_gateup(&rows, H, I, dgu, x, mokDtypeBF16, dwg, dwu, 0) != mokSuccess) {
    err = FAIL("launch failed: %s", mokGetLastError());
  } else if (cudaMemcpy(h_act, act, (size_t)cap * I * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
             cudaMemcpy(h_y, y, (size_t)cap * H * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
             cudaMemcpy(h_dw, dwg, wsz * 2, cudaMemcpyDeviceToHost) != cudaSuccess) {
    err = "cudaMemcpy failed";
  }
  mok_gemm_debug_sched(0, 1);
  mok_gemm_debug_tiles(0, 0, 0);
  mok_gemm_debug_pairs(0);
  mok_gemm_debug_mix_ctas(0);
  cudaFree(act); cudaFree(gu); cudaFree(y); cudaFree(dwg); cudaFree(dwu);
  return err;
}

MOK_GPU_TEST(gemm_gpu_schedule_is_bitwise_invisible, 1) {
  /* The same layout (uneven experts, 64-row tails, an empty expert, 1, 2, 3 and 6 token
   * tiles per output block) under static round-robin, under run-time tickets and under
   * tickets in mix order (token tiles: the 64-row experts' tiles spread over the
   * others'), each with token tiles alone and in CTA pairs (2-CTA clusters, multicast
   * loads): act, y and dW_gate must agree in every bit. The static runs also cut expert 0
   * in other tiles (stagger, the rule: 4 x 96 rows instead of 3 x 128): an output does not
   * depend on the rows of the tile that computes it. Then mix order with the CTAs split
   * by class (mok_gemm_debug_mix_ctas: the rule, few and most of them on the one-tile
   * experts; the plain mix run does not split). Last, stages given back early or late
   * (mok_gemm_debug_eager_rows: no tile; tiles of <= 96 rows, as the rule, here the tiles of
   * experts 1, 3 and 5, under static order). Then gate+up's weights in two 3-D TMA boxes
   * and in four 2-D ones instead of the rule's one 4-D box (mok_gemm_debug_gu_box); W_up
   * placed before W_gate (four boxes then), alone and in pairs; the rows in 32-row boxes only
   * and in 128-row boxes first for both kinds (mok_gemm_debug_row_box128), with other L2
   * promotions (mok_gemm_debug_l2_promotion). Last, down in the ring of 128-row stages with
   * an epilogue area of its own (mok_gemm_debug_tok_ring: tiles cut at <= 128 rows, under
   * run-time tickets). Last, every knob at the library's rule, so that both forward kinds
   * take the lean kernel instances (compiled without diagnostics, grouped_gemm.cuh
   * TokKnobs), then the same with the tile trace on, which takes the instances with them:
   * the launch counters must show which ran. */
  enum { E = 6, H = 512, I = 512, kRuns = 20, kTraceCap = 4096 };
  static const int counts[E] = {380, 64, 0, 190, 1000, 33};
  int32_t off_h[E + 1] = {0};
  for (int e = 0; e < E; ++e) off_h[e + 1] = off_h[e] + (counts[e] + 63) / 64 * 64;
  const int64_t cap = off_h[E];
  const size_t wsz = (size_t)E * I * H;
  int32_t *off = NULL, *cnt = NULL;
  mokBf16 *x = NULL, *w = NULL, *w2 = NULL, *dgu = NULL;
  unsigned long long *trace = NULL, records = 0, lean[2] = {0, 0}, diag[2] = {0, 0};
  CHECK(cudaMalloc(&off, sizeof off_h) == cudaSuccess);
  CHECK(cudaMalloc(&cnt, sizeof counts) == cudaSuccess);
  CHECK(cudaMalloc(&trace, (1 + 4 * (size_t)kTraceCap) * 8) == cudaSuccess);
  CHECK(cudaMemset(trace, 0, 8) == cudaSuccess);
  CHECK(cudaMalloc(&x, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&w, 2 * wsz * 2) == cudaSuccess);
  CHECK(cudaMalloc(&w2, 2 * wsz * 2) == cudaSuccess); /* [W_up | W_gate], the same values */
  CHECK(cudaMalloc(&dgu, (size_t)cap * I * 4) == cudaSuccess);
  CHECK(cudaMemcpy(off, off_h, sizeof off_h, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(cnt, counts, sizeof counts, cudaMemcpyHostToDevice) == cudaSuccess);
  const uint64_t seed = test_seed() ^ 0x5c4ed;
  CHECK_OK(mok_gemm_fill_rows(x, cap, H, seed + 1, 1.0f, E, off, cnt, 0));
  CHECK_OK(mok_gemm_fill_rows(dgu, cap, 2 * I, seed + 2, 1.0f, E, off, cnt, 0));
  CHECK_OK(mok_gemm_fill_rows(w, 2 * (int64_t)E * I, H, seed + 3, 1.0f / sqrtf((float)H), 0, NULL, NULL, 0));
  CHECK(cudaMemcpy(w2, w + wsz, wsz * 2, cudaMemcpyDeviceToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(w2 + wsz, w, wsz * 2, cudaMemcpyDeviceToDevice) == cudaSuccess);
  uint16_t *act[kRuns], *y[kRuns], *dw[kRuns];
  const char *err = NULL;
  for (int m = 0; m < kRuns; ++m) {
    act[m] = (uint16_t *)malloc((size_t)cap * I * 2);
    y[m] = (uint16_t *)malloc((size_t)cap * H * 2);
    dw[m] = (uint16_t *)malloc(wsz * 2);
  }
  /* (static: stagger on by the rule, so expert 0's tiles are cut in other sizes there) */
  static const char *names[kRuns] = {"static",       "tickets",     "mix",          "static pairs",      "ticket pairs",
                                     "mix pairs", "mix, 2 CTAs split", "mix, 100 CTAs split",
                                     "mix, split by the rule, one-tile weights evict-first",
                                     "static, no early stage release", "static, <= 96 rows released early",
                                     "static, gate+up weights in two 3-D boxes", "mix, gate+up weights in four boxes",
                                     "static, W_up before W_gate", "static pairs, W_up before W_gate",
                                     "mix, 32-row boxes only, no L2 promotion",
                                     "static, 128-row boxes for down too, 128-byte promotion",
                                     "tickets, down in 128-row stages with an epilogue area",
                                     "static, every knob at its rule (lean instances)",
                                     "static, every knob at its rule, tile trace on (diagnostics instances)"};
  for (int m = 0; m < kRuns && !err; ++m) {
    const int mode = m < 6 ? (m % 3 ? 2 : 1) : m == 12 || m == 15 || m == 17 ? 2 : m >= 9 ? 1 : 2;
    const int rule = m >= 18; /* every knob at the library's rule */
    CHECK_OK(mok_gemm_debug_tok_ring(m == 17));
    const int mix = m < 6 ? m % 3 == 2 : m < 9 || m == 12 || m == 15;
    const int swap = m == 13 || m == 14;
    const int split = m == 6 ? 2 : m == 7 ? 100 : m == 8 || rule ? 0 : -1;
    CHECK_OK(mok_gemm_debug_eager_rows(m == 9 ? 0 : m == 10 ? 96 : -1));
    CHECK_OK(mok_gemm_debug_gu_box(m == 11 ? 3 : m == 12 ? 2 : 0));
    CHECK_OK(mok_gemm_debug_row_box128(m == 15 ? 2 : m == 16 ? 1 : 0));
    CHECK_OK(mok_gemm_debug_cold_evict(m == 8 ? 1 : rule ? 0 : 2)); /* the split by the rule */
    if (rule) CHECK_OK(mok_gemm_debug_lean_launches(&lean[m - 18], &diag[m - 18]));
    if (m == 19) CHECK_OK(mok_gemm_debug_trace(trace, kTraceCap));
    CHECK_OK(mok_gemm_debug_l2_promotion(m == 15 ? 0 : m == 16 ? 128 : -1, m == 15 ? 64 : m == 16 ? 128 : -1));
    err = sched_outputs(mode, mix, (m >= 3 && m < 6) || m == 14, split, E, H, I, cap, off, x, swap ? w2 + wsz : w,
                        swap ? w2 : w + wsz, dgu, act[m], y[m], dw[m]);
    if (m == 19) CHECK_OK(mok_gemm_debug_trace(NULL, 0));
    if (rule) {
      unsigned long long l = 0, d = 0;
      CHECK_OK(mok_gemm_debug_lean_launches(&l, &d));
      lean[m - 18] = l - lean[m - 18];
      diag[m - 18] = d - diag[m - 18];
    }
  }
  CHECK(cudaMemcpy(&records, trace, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK_OK(mok_gemm_debug_eager_rows(-1));
  CHECK_OK(mok_gemm_debug_tok_ring(0));
  CHECK_OK(mok_gemm_debug_gu_box(0));
  CHECK_OK(mok_gemm_debug_row_box128(0));
  CHECK_OK(mok_gemm_debug_l2_promotion(-1, -1));
  CHECK_OK(mok_gemm_debug_cold_evict(0));
  int bad_act = 0, bad_y = 0, bad_dw = 0;
  for (int m = 1; m < kRuns && !err; ++m) {
    if (!bad_act && memcmp(act[0], act[m], (size_t)cap * I * 2)) bad_act = m;
    if (!bad_y && memcmp(y[0], y[m], (size_t)cap * H * 2)) bad_y = m;
    if (!bad_dw && memcmp(dw[0], dw[m], wsz * 2)) bad_dw = m;
  }
  for (int m = 0; m < kRuns; ++m) { free(act[m]); free(y[m]); free(dw[m]); }
  cudaFree(off); cudaFree(cnt); cudaFree(x); cudaFree(w); cudaFree(w2); cudaFree(dgu); cudaFree(trace);
  CHECK_MSG(err == NULL, "%s", err);
  CHECK_MSG(lean[0] == 2 && diag[0] == 0, "knobs at the rule: %llu lean and %llu diagnostics launches, want 2 and 0",
            lean[0], diag[0]);
  CHECK_MSG(lean[1] == 0 && diag[1] == 2, "tile trace on: %llu lean and %llu diagnostics launches, want 0 and 2",
            lean[1], diag[1]);
  CHECK_MSG(records > 0, "tile trace on: no tile recorded");
  CHECK_MSG(!bad_act, "act differs between the static and the %s schedule", names[bad_act]);
  CHECK_MSG(!bad_y, "y differs between the static and the %s schedule", names[bad_y]);
  CHECK_MSG(!bad_dw, "dW_gate differs between the static and the %s schedule", names[bad_dw]);
}

/* ---- GPU: the data gradients' schedule is invisible too ------------------------------ */
MOK_GPU_TEST(gemm_gpu_dgrad_schedule_is_bitwise_invisible, 1) {
  /* Both data-gradient kinds (128-row tiles) on uneven experts (64-row tails, so tickets;
   * one-tile experts of 64, 33 and 120 rows beside multi-tile ones; an empty expert) under
   * static round-robin, tickets in expert order (mix off), tickets in split mix order by
   * the rule (the one-tile experts' tiles on the first P CTAs, from a counter of their own),
   * split with 2 and with 100 CTAs, and the library's own choice: every output bit (dg|du
   * of down dgrad, dx of gate+up dgrad; every row random, padding rows included) must
   * agree; outputs are
   * NaN-filled before each run, so a tile no CTA ran shows. */
  enum { E = 7, H = 512, I = 384, kRuns = 7 };
  static const int counts[E] = {380, 64, 0, 190, 1000, 33, 120};
  int32_t off_h[E + 1] = {0};
  for (int e = 0; e < E; ++e) off_h[e + 1] = off_h[e] + (counts[e] + 63) / 64 * 64;
  const int64_t cap = off_h[E];
  const size_t wsz = (size_t)E * I * H;
  int32_t *off = NULL;
  mokBf16 *dy = NULL, *gu = NULL, *wd = NULL, *wgu = NULL, *dgu_in = NULL, *dgu = NULL, *dx = NULL;
  CHECK(cudaMalloc(&off, sizeof off_h) == cudaSuccess);
  CHECK(cudaMalloc(&dy, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&gu, (size_t)cap * I * 4) == cudaSuccess);
  CHECK(cudaMalloc(&dgu_in, (size_t)cap * I * 4) == cudaSuccess);
  CHECK(cudaMalloc(&dgu, (size_t)cap * I * 4) == cudaSuccess);
  CHECK(cudaMalloc(&dx, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&wd, wsz * 2) == cudaSuccess);
  CHECK(cudaMalloc(&wgu, 2 * wsz * 2) == cudaSuccess);
  CHECK(cudaMemcpy(off, off_h, sizeof off_h, cudaMemcpyHostToDevice) == cudaSuccess);
  const uint64_t seed = test_seed() ^ 0xd9ad;
  CHECK_OK(mok_gemm_fill_rows(dy, cap, H, seed + 1, 1.0f, 0, NULL, NULL, 0));
  CHECK_OK(mok_gemm_fill_rows(gu, cap, 2 * I, seed + 2, 1.0f, 0, NULL, NULL, 0));
  CHECK_OK(mok_gemm_fill_rows(dgu_in, cap, 2 * I, seed + 3, 1.0f, 0, NULL, NULL, 0));
  CHECK_OK(mok_gemm_fill_rows(wd, (int64_t)E * H, I, seed + 4, 1.0f / sqrtf((float)I), 0, NULL, NULL, 0));
  CHECK_OK(mok_gemm_fill_rows(wgu, 2 * (int64_t)E * I, H, seed + 5, 1.0f / sqrtf((float)H), 0, NULL, NULL, 0));
  const mokGemmRows_t rows = {E, cap, off};
  static const char *names[kRuns] = {"static", "tickets, expert order", "tickets, split by the rule",
                                     "tickets, split with 2 CTAs", "tickets, split with 100 CTAs", "the rule",
                                     "tickets, split by the rule, a grid of 5 CTAs"};
  uint16_t *h_dgu[kRuns], *h_dx[kRuns];
  for (int m = 0; m < kRuns; ++m) {
    h_dgu[m] = (uint16_t *)malloc((size_t)cap * I * 4);
    h_dx[m] = (uint16_t *)malloc((size_t)cap * H * 2);
  }
  for (int m = 0; m < kRuns && !t->failed; ++m) {
    CHECK_OK(mok_gemm_debug_sched(m == 0 ? 1 : m == 5 ? 0 : 2, 1));
    CHECK_OK(mok_gemm_debug_tiles(0, 0, m == 1 ? 2 : m == 5 ? 0 : 1));
    CHECK_OK(mok_gemm_debug_mix_ctas(m == 3 ? 2 : m == 4 ? 100 : 0));
    CHECK_OK(mok_gemm_debug_grid(m == 6 ? 5 : 0));
    CHECK(cudaMemset(dgu, 0xFF, (size_t)cap * I * 4) == cudaSuccess);
    CHECK(cudaMemset(dx, 0xFF, (size_t)cap * H * 2) == cudaSuccess);
    CHECK_OK(mok_gemm_down_dgrad(&rows, H, I, 0.0f, dy, wd, gu, dgu, 0));
    CHECK_OK(mok_gemm_gateup_dgrad(&rows, H, I, dgu_in, wgu, wgu + wsz, dx, 0));
    CHECK(cudaMemcpy(h_dgu[m], dgu, (size_t)cap * I * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(h_dx[m], dx, (size_t)cap * H * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
  mok_gemm_debug_sched(0, 1);
  mok_gemm_debug_tiles(0, 0, 0);
  mok_gemm_debug_mix_ctas(0);
  mok_gemm_debug_grid(0);
  int nan0 = 0;
  for (int64_t i = 0; i < cap * H && !t->failed; ++i) nan0 += h_dx[0][i] == 0xFFFF;
  for (int64_t i = 0; i < cap * 2 * I && !t->failed; ++i) nan0 += h_dgu[0][i] == 0xFFFF;
  CHECK_MSG(nan0 == 0, "%d outputs of the static run left unwritten", nan0);
  for (int m = 1; m < kRuns && !t->failed; ++m) {
    CHECK_MSG(!memcmp(h_dgu[0], h_dgu[m], (size_t)cap * I * 4), "dg|du differs between the static and the %s schedule",
              names[m]);
    CHECK_MSG(!memcmp(h_dx[0], h_dx[m], (size_t)cap * H * 2), "dx differs between the static and the %s schedule",
              names[m]);
  }
  for (int m = 0; m < kRuns; ++m) { free(h_dgu[m]); free(h_dx[m]); }
  cudaFree(off); cudaFree(dy); cudaFree(gu); cudaFree(dgu_in); cudaFree(dgu); cudaFree(dx); cudaFree(wd); cudaFree(wgu);
}

/* The layout of the diagnostics tests: 64-row segments of these rows (an empty expert, a
 * one-tile one, a 700-row one); returns the capacity. */
enum { kDiagExperts = 5 };
static int64_t diag_offsets(int32_t (&off_h)[kDiagExperts + 1]) {
  static const int counts[kDiagExperts] = {700, 0, 64, 200, 17};
  off_h[0] = 0;
  for (int e = 0; e < kDiagExperts; ++e) off_h[e + 1] = off_h[e] + (counts[e] + 63) / 64 * 64;
  return off_h[kDiagExperts];
}

/* ---- GPU: the token-tile trace (diagnostics) lists every tile once ---------------- */
MOK_GPU_TEST(gemm_gpu_trace_lists_every_tile, 1) {
  /* gate+up token tiles, alone and in CTA pairs, with mok_gemm_debug_trace on: one record
   * per tile (as many as the host enumeration has), each tile index once, start <= end,
   * rows and output block as the schedule has them; a buffer too small keeps cap records
   * and counts the rest. */
  enum { E = kDiagExperts, H = 256, I = 512, kCap = 4096 };
  int32_t off_h[E + 1];
  const int64_t cap = diag_offsets(off_h);
  int tiles = 0, want_rows = 0; /* token tiles over whole segments (no expert counts) */
  for (int e = 0; e < E; ++e) {
    const int seg = off_h[e + 1] - off_h[e], n = mok_sm90::tok_tiles(seg, mok_sm90::kTokMaxUnits);
    tiles += n * (I / 128);
    want_rows += seg * (I / 128);
  }
  int32_t *off = NULL;
  mokBf16 *x = NULL, *w = NULL, *act = NULL;
  unsigned long long *d = NULL, *h = (unsigned long long *)malloc((1 + 4 * (size_t)kCap) * 8);
  CHECK(cudaMalloc(&off, sizeof off_h) == cudaSuccess);
  CHECK(cudaMalloc(&x, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&w, 2 * (size_t)E * I * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&act, (size_t)cap * I * 2) == cudaSuccess);
  CHECK(cudaMalloc(&d, (1 + 4 * (size_t)kCap) * 8) == cudaSuccess);
  CHECK(cudaMemcpy(off, off_h, sizeof off_h, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemset(x, 0, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMemset(w, 0, 2 * (size_t)E * I * H * 2) == cudaSuccess);
  const mokGemmRows_t rows = {E, cap, off};
  CHECK_STATUS(mok_gemm_debug_trace(d, 0), mokInvalidArgument);
  for (int pairs = 0; pairs < 3 && !t->failed; ++pairs) {
    const int lim = pairs == 2 ? 3 : kCap; /* last: a buffer of 3 records */
    CHECK(cudaMemset(d, 0, 8) == cudaSuccess);
    CHECK_OK(mok_gemm_debug_pairs(pairs ? 1 : 2));
    CHECK_OK(mok_gemm_debug_trace(d, lim));
    CHECK_OK(mok_gemm_gateup_fwd(&rows, H, I, 0.0f, x, w, w + (size_t)E * I * H, act, NULL, 0));
    CHECK_OK(mok_gemm_debug_trace(NULL, 0));
    CHECK_OK(mok_gemm_debug_pairs(0));
    CHECK(cudaMemcpy(h, d, (1 + 4 * (size_t)kCap) * 8, cudaMemcpyDeviceToHost) == cudaSuccess);
    /* CTA pairs number pairs of tiles: two records per index */
    CHECK_MSG(h[0] == (unsigned long long)tiles, "pairs %d: %llu records, want %d tiles", pairs, h[0], tiles);
    if (pairs == 2 || h[0] != (unsigned long long)tiles) continue;
    unsigned char seen[4096] = {0};
    int row_sum = 0;
    for (int i = 0; i < tiles; ++i) {
      const unsigned long long *r = h + 1 + 4 * i;
      const unsigned idx = (unsigned)(r[2] & 0xffffffffu);
      CHECK_MSG(r[0] <= r[1], "record %d ends before it starts", i);
      CHECK_MSG(idx < 4096 && seen[idx] < (pairs ? 2 : 1), "pairs %d: tile %u recorded too often", pairs, idx);
      if (idx < 4096) seen[idx]++;
      const int e = (int)(r[3] >> 32), nrows = (int)(r[3] >> 16 & 0xffff), blk = (int)(r[3] & 0xffff);
      CHECK_MSG(e >= 0 && e < E && nrows >= 16 && nrows <= 176 && blk < I / 128, "record %d: expert %d rows %d block %d",
                i, e, nrows, blk);
      row_sum += nrows;
    }
    CHECK_MSG(row_sum == want_rows, "pairs %d: the records cover %d rows x blocks, want %d", pairs, row_sum, want_rows);
  }
  free(h);
  cudaFree(off); cudaFree(x); cudaFree(w); cudaFree(act); cudaFree(d);
}

/* ---- GPU: the stage clock (diagnostics) counts every stage once ------------------- */
MOK_GPU_TEST(gemm_gpu_stage_clock_counts_stages, 1) {
  /* gate+up and down token tiles with mok_gemm_debug_stage_clock on: one record per
   * pipeline stage the first consumer warpgroup used (tiles x k-blocks), histograms that
   * add up to their counts; off again, the buffer stays as it was. */
  enum { E = kDiagExperts, H = 256, I = 512 };
  int32_t off_h[E + 1];
  const int64_t cap = diag_offsets(off_h);
  int tiles_gu = 0, tiles_dn = 0; /* token tiles over whole segments (no expert counts) */
  for (int e = 0; e < E; ++e) {
    const int n = mok_sm90::tok_tiles(off_h[e + 1] - off_h[e], mok_sm90::kTokMaxUnits);
    tiles_gu += n * (I / 128);
    tiles_dn += n * (H / 256);
  }
  int32_t *off = NULL;
  mokBf16 *x = NULL, *w = NULL, *act = NULL, *y = NULL;
  unsigned long long *d = NULL, h[mok_sm90::kSclkWords];
  CHECK(cudaMalloc(&off, sizeof off_h) == cudaSuccess);
  CHECK(cudaMalloc(&x, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&w, 2 * (size_t)E * I * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&act, (size_t)cap * I * 2) == cudaSuccess);
  CHECK(cudaMalloc(&y, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&d, sizeof h) == cudaSuccess);
  CHECK(cudaMemcpy(off, off_h, sizeof off_h, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemset(x, 0, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMemset(w, 0, 2 * (size_t)E * I * H * 2) == cudaSuccess);
  const mokGemmRows_t rows = {E, cap, off};
  for (int kind = 0; kind < 3 && !t->failed; ++kind) {
    CHECK(cudaMemset(d, 0, sizeof h) == cudaSuccess);
    if (kind < 2) CHECK_OK(mok_gemm_debug_stage_clock(d));
    if (kind == 1) CHECK_OK(mok_gemm_down_fwd(&rows, H, I, act, w, y, 0));
    else CHECK_OK(mok_gemm_gateup_fwd(&rows, H, I, 0.0f, x, w, w + (size_t)E * I * H, act, NULL, 0));
    CHECK_OK(mok_gemm_debug_stage_clock(NULL));
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    const unsigned long long want = kind == 2 ? 0 : kind == 1 ? (unsigned long long)tiles_dn * (I / 64)
                                                              : (unsigned long long)tiles_gu * (H / 64);
    CHECK_MSG(h[64] == want, "kind %d: %llu stages recorded, want %llu", kind, h[64], want);
    unsigned long long a = 0, b = 0;
    for (int i = 0; i < 32; ++i) a += h[i], b += h[32 + i];
    CHECK_MSG(a == h[64] && b == h[64], "kind %d: histograms %llu %llu vs %llu stages", kind, a, b, h[64]);
    CHECK_MSG(h[64] == 0 || h[65] >= 64 * h[64], "kind %d: issue -> use %llu cycles over %llu stages", kind, h[65],
              h[64]);
  }
  cudaFree(off); cudaFree(x); cudaFree(w); cudaFree(act); cudaFree(y); cudaFree(d);
}

/* ---- GPU: dgrad down on the kimi Zipf layout, bounded ------------------------------ */
/* Row-grouped tiles under a round-robin assignment (host mirror of gemm_decode_tile; the
 * kernels hand tiles out at run time, so this is a proxy that the layout mixes them): how
 * many times a CTA runs a 64-row tail tile right after a full one. There the idle
 * warpgroup used to leave three of its warps behind the ring. */
static int full_then_tail(int E, const int32_t *off, int n_tiles, int grid) {
  int total = 0, count = 0;
  for (int e = 0; e < E; ++e) total += (off[e + 1] - off[e] + 127) / 128 * n_tiles;
  for (int b = 0; b < grid; ++b) {
    int prev_full = 0;
    for (int t = b; t < total; t += grid) {
      int e = 0, r = t;
      for (;; ++e) {
        const int n = (off[e + 1] - off[e] + 127) / 128 * n_tiles;
        if (r < n) break;
        r -= n;
      }
      const int mt = (off[e + 1] - off[e] + 127) / 128, m0 = off[e] + (r % mt) * 128;
      const int tail = m0 + 64 >= off[e + 1];
      count += prev_full && tail;
      prev_full = !tail;
    }
  }
  return count;
}

MOK_GPU_TEST(gemm_gpu_dgrad_down_zipf_tails, 1) {
  /* The layout that hung mok_gemm_down_dgrad on the H200 (mok bench gemm --model
   * kimi-k2.7-code --rows-per-expert 64 --routing zipf:1.2): kimi shape (48 local
   * experts, H 7168, I 2048), 3072 rows split as 1/(e+1)^1.2, each segment padded to 64:
   * one hot expert of 960 rows, most others a single 64-row tail tile, so CTAs run tail
   * tiles right after full ones. The hang was a race (warps of the idle warpgroup left
   * a ring phase behind while still in the previous tile's gu-reading epilogue), so the
   * layout runs kIters times on its own stream, and the test polls that stream for at
   * most kLimitS seconds instead of synchronising: a hung kernel fails this test and
   * ends the run here (nothing after it could use the GPU, cudaFree included). */
  enum { E = 48, H = 7168, I = 2048, kIters = 64 };
  const double kLimitS = 10.0;
  int counts[E];
  int32_t off_h[E + 1];
  {
    const int64_t total = 64 * E;
    double norm = 0;
    for (int e = 0; e < E; ++e) norm += pow(e + 1.0, -1.2);
    int64_t given = 0;
    for (int e = 0; e < E; ++e) given += counts[e] = (int)floor(total * pow(e + 1.0, -1.2) / norm);
    for (int e = 0; given < total; e = (e + 1) % E, ++given) counts[e]++;
    off_h[0] = 0;
    for (int e = 0; e < E; ++e) off_h[e + 1] = off_h[e] + (counts[e] + 63) / 64 * 64;
  }
  const int64_t cap = off_h[E]; /* as the bench: capacity = rows in use (5056) */
  mokGemmTileShape_t ts;
  CHECK_OK(mok_gemm_tile_shape(mokGemmDownDgrad, H, I, &ts));
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev) == cudaSuccess);
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess);
  const int n_tiles = I / ts.out_cols;
  const int64_t bound = cap / 64 * n_tiles;
  const int transitions = full_then_tail(E, off_h, n_tiles, (int)(bound < sms ? bound : sms));
  CHECK_MSG(transitions > 0, "layout has no full tile followed by a tail tile on %d SMs: not the failing case", sms);

  int32_t *off = NULL, *cnt = NULL;
  mokBf16 *dy = NULL, *wd = NULL, *gu = NULL, *dgu = NULL;
  int *bad = NULL;
  cudaStream_t s = NULL;
  const size_t wsz = (size_t)E * H * I;
  CHECK(cudaMalloc(&off, sizeof off_h) == cudaSuccess);
  CHECK(cudaMalloc(&cnt, sizeof counts) == cudaSuccess);
  CHECK(cudaMalloc(&dy, (size_t)cap * H * 2) == cudaSuccess);
  CHECK(cudaMalloc(&wd, wsz * 2) == cudaSuccess);
  CHECK(cudaMalloc(&gu, (size_t)cap * I * 4) == cudaSuccess);
  CHECK(cudaMalloc(&dgu, (size_t)cap * I * 4) == cudaSuccess);
  CHECK(cudaMalloc(&bad, sizeof(int)) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaMemcpy(off, off_h, sizeof off_h, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(cnt, counts, sizeof counts, cudaMemcpyHostToDevice) == cudaSuccess);
  const uint64_t seed = test_seed() ^ 0x21bf;
  CHECK_OK(mok_gemm_fill_rows(dy, cap, H, seed + 1, 1.0f, E, off, cnt, s));
  CHECK_OK(mok_gemm_fill_rows(gu, cap, 2 * I, seed + 2, 1.0f, E, off, cnt, s));
  CHECK_OK(mok_gemm_fill_rows(wd, (int64_t)E * H, I, seed + 3, 1.0f / sqrtf((float)I), 0, NULL, NULL, s));
  CHECK(cudaMemsetAsync(dgu, 0xFF, (size_t)cap * I * 4, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);

  const mokGemmRows_t rows = {E, cap, off};
  for (int it = 0; it < kIters; ++it) CHECK_OK(mok_gemm_down_dgrad(&rows, H, I, 0.0f, dy, wd, gu, dgu, s));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cudaError_t q;
  double waited = 0;
  while ((q = cudaStreamQuery(s)) == cudaErrorNotReady) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (waited > kLimitS) {
      printf("FAIL  %-52s  mok_gemm_down_dgrad has not finished %d launches after %.0f s (kimi Zipf "
             "layout, %d full->tail tile transitions over %d CTAs): the kernel hung. Ending the test run "
             "here: the GPU stays busy with it until this process exits.\n",
             "gemm_gpu_dgrad_down_zipf_tails", kIters, kLimitS, transitions, sms);
      fflush(stdout);
      _Exit(1);
    }
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
  CHECK_MSG(q == cudaSuccess, "mok_gemm_down_dgrad x%d: %s", kIters, cudaGetErrorString(q));

  /* written everywhere, and right on a row of a full tile (expert 0, row 0), of a tail
   * tile after full ones (expert 1: 407 rows, the last 23 in a tail tile) and of a
   * tail-only expert (E - 1: 8 rows) */
  int h = 0;
  CHECK_OK(mok_gemm_count_nan(dgu, cap, 2 * I, 0, bad, s));
  CHECK(cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK_MSG(h == 0, "dgu: %d elements unwritten (NaN poison left) or NaN", h);
  static const int check_e[3] = {0, 1, E - 1};
  uint16_t *w = (uint16_t *)malloc((size_t)H * I * 2), *ry = (uint16_t *)malloc((size_t)H * 2);
  uint16_t *rg = (uint16_t *)malloc((size_t)I * 4), *ro = (uint16_t *)malloc((size_t)I * 4);
  double *dg = (double *)malloc(sizeof(double) * I), *du = (double *)malloc(sizeof(double) * I);
  mokGemmErr_t err = {0, 0, 0};
  const char *fail = NULL;
  for (int k = 0; k < 3 && !fail; ++k) {
    const int e = check_e[k];
    const int64_t r = off_h[e] + (e == 0 ? 0 : counts[e] - 1);
    if (cudaMemcpy(w, wd + (size_t)e * H * I, (size_t)H * I * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(ry, dy + r * H, (size_t)H * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(rg, gu + r * 2 * I, (size_t)I * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(ro, dgu + r * 2 * I, (size_t)I * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
      fail = "cudaMemcpy of a checked row failed";
      break;
    }
    mok_ref_down_dgrad_row(ry, w, rg, H, I, 0.0, dg, du);
    for (int i = 0; i < I; ++i) {
      mok_gemm_err_add(&err, MOK_B2D(ro[i]), dg[i]);
      mok_gemm_err_add(&err, MOK_B2D(ro[I + i]), du[i]);
    }
  }
  free(w); free(ry); free(rg); free(ro); free(dg); free(du);
  cudaStreamDestroy(s);
  cudaFree(off); cudaFree(cnt); cudaFree(dy); cudaFree(wd); cudaFree(gu); cudaFree(dgu); cudaFree(bad);
  CHECK_MSG(fail == NULL, "%s", fail);
  const double rel = mok_gemm_err_rel(&err);
  CHECK_MSG(rel < 1e-2, "dg, du: relative L2 error %.3g >= 1e-2 on sampled rows", rel);
}
