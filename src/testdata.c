/*
 * testdata.c — host entry points of the counter-based test-data generator: bf16
 * tensors (bit-identical to the device twin, see testdata.h) and routings.
 *
 * Routing of token t on rank r: logit_e = 2 * U(-sqrt3, sqrt3) from the hash of
 * (seed, routing, r, t*E + e). The k chosen experts are distinct; their weights are
 * the softmax of their logits over the k chosen (they sum to 1); slots are in
 * descending order of the selection key.
 *   uniform: key_e = logit_e (top-k of i.i.d. logits)
 *   zipf:s   key_e = log(1/(e+1)^s) + Gumbel noise (sampling without replacement,
 *            P(e) ~ 1/(e+1)^s: the Gumbel-top-k trick)
 *   hot:h    expert h in slot 0, the rest top-(k-1) by logit
 * Routings are generated on the host only (they are small): no device twin needed.
 */
#include "internal.h"
#include "testdata.h"

#include <math.h>
#include <stdlib.h>

mokResult_t mokGenerateBf16(uint64_t seed, mokTensorKind_t kind, int64_t sub, int64_t first,
                            int64_t count, float scale, mokBf16 *dst) {
  mok_clear_error();
  if (count < 0 || first < 0)
    return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16: first (%lld) and count (%lld) must be >= 0",
                     (long long)first, (long long)count);
  if (count > 0 && !dst) return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16: dst is NULL");
  if ((int)kind < mokTensorX || (int)kind > mokTensorRouting)
    return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16: unknown tensor kind %d", (int)kind);
  if (!isfinite(scale)) return mok_error(NULL, mokInvalidArgument, "mokGenerateBf16: scale is not finite");
  uint64_t key = mok_tensor_key(seed, (int)kind, sub);
  for (int64_t i = 0; i < count; i++) dst[i] = mok_gen_bf16(key, first + i, scale);
  return mokSuccess;
}

mokResult_t mokGenerateRouting(uint64_t seed, const mokRouting_t *routing, int num_experts, int topk,
                               int rank, int64_t first, int64_t count, int32_t *topk_idx,
                               float *topk_w) {
  mok_clear_error();
  if (!routing) return mok_error(NULL, mokInvalidArgument, "mokGenerateRouting: routing is NULL");
  if (num_experts < 1 || topk < 1 || topk > 32 || topk > num_experts)
    return mok_error(NULL, mokInvalidArgument,
                     "mokGenerateRouting: need 1 <= topk <= 32 and topk <= num_experts (got topk %d, "
                     "num_experts %d)", topk, num_experts);
  if (first < 0 || count < 0 || rank < 0)
    return mok_error(NULL, mokInvalidArgument, "mokGenerateRouting: rank, first and count must be >= 0");
  if (count > 0 && (!topk_idx || !topk_w))
    return mok_error(NULL, mokInvalidArgument, "mokGenerateRouting: topk_idx and topk_w must not be NULL");
  int hot = -1;
  switch (routing->kind) {
    case mokRoutingUniform: break;
    case mokRoutingZipf:
      if (!(routing->param > 0.0) || !isfinite(routing->param))
        return mok_error(NULL, mokInvalidArgument, "mokGenerateRouting: the Zipf exponent must be > 0 (got %g)",
                         routing->param);
      break;
    case mokRoutingHot:
      hot = (int)routing->param;
      if (routing->param != (double)hot || hot < 0 || hot >= num_experts)
        return mok_error(NULL, mokInvalidArgument,
                         "mokGenerateRouting: the hot expert %g is not an expert id in [0, %d)",
                         routing->param, num_experts);
      break;
    default:
      return mok_error(NULL, mokInvalidArgument, "mokGenerateRouting: unknown routing kind %d", (int)routing->kind);
  }
  double *logw = NULL;
  if (routing->kind == mokRoutingZipf) {
    logw = malloc(sizeof(double) * (size_t)num_experts);
    if (!logw) return mok_error(NULL, mokOutOfMemory, "mokGenerateRouting: out of host memory");
    for (int e = 0; e < num_experts; e++) logw[e] = -routing->param * log((double)e + 1.0);
  }
  uint64_t key = mok_tensor_key(seed, mokTensorRouting, rank);
  uint64_t gkey = mok_tensor_key(seed ^ 0x5bd1e995ull, mokTensorRouting, rank);
  for (int64_t n = 0; n < count; n++) {
    int64_t t = first + n;
    int chosen[32];
    double best_key[32], logit[32];
    int m = 0; /* selected so far, kept sorted by key (descending) */
    if (hot >= 0) {
      chosen[0] = hot;
      best_key[0] = INFINITY;
      logit[0] = 2.0 * (2.0 * mok_bits_to_unit(mok_element_bits(key, t * num_experts + hot)) - 1.0) * 1.7320508075688772;
      m = 1;
    }
    for (int e = 0; e < num_experts; e++) {
      if (e == hot) continue;
      double lg = 2.0 * (2.0 * mok_bits_to_unit(mok_element_bits(key, t * num_experts + e)) - 1.0) * 1.7320508075688772;
      double k_e = lg;
      if (logw) {
        double u = ((double)(mok_element_bits(gkey, t * num_experts + e) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        k_e = logw[e] - log(-log(u));
      }
      if (m == topk && k_e <= best_key[m - 1]) continue;
      int pos = m < topk ? m++ : topk - 1;
      while (pos > 0 && best_key[pos - 1] < k_e) {
        best_key[pos] = best_key[pos - 1];
        chosen[pos] = chosen[pos - 1];
        logit[pos] = logit[pos - 1];
        pos--;
      }
      best_key[pos] = k_e;
      chosen[pos] = e;
      logit[pos] = lg;
    }
    double mx = logit[0], sum = 0.0;
    for (int j = 1; j < topk; j++) mx = logit[j] > mx ? logit[j] : mx;
    for (int j = 0; j < topk; j++) sum += exp(logit[j] - mx);
    for (int j = 0; j < topk; j++) {
      topk_idx[n * topk + j] = chosen[j];
      topk_w[n * topk + j] = (float)(exp(logit[j] - mx) / sum);
    }
  }
  free(logw);
  return mokSuccess;
}

mokResult_t mokGenerateRankData(mokLayer_t l, uint64_t seed, const mokRouting_t *routing, int rank,
                                int num_tokens, mokBf16 *x, int32_t *topk_idx, float *topk_w, mokBf16 *d_out,
                                mokBf16 *w_gate, mokBf16 *w_up, mokBf16 *w_down, mokBf16 *s_gate,
                                mokBf16 *s_up, mokBf16 *s_down) {
  static const char fn[] = "mokGenerateRankData";
  mok_clear_error();
  if (!l) return mok_error(NULL, mokInvalidArgument, "%s: layer is NULL", fn);
  const mokConfig_t *c = &l->cfg;
  if (rank < 0 || rank >= c->num_ranks)
    return mok_error(l, mokInvalidArgument, "%s: rank %d is not in [0, num_ranks=%d)", fn, rank, c->num_ranks);
  if (num_tokens < 0 || num_tokens > c->max_tokens)
    return mok_error(l, mokInvalidArgument, "%s: num_tokens %d is not in [0, max_tokens=%d]", fn, num_tokens,
                     c->max_tokens);
  if ((topk_idx != NULL) != (topk_w != NULL))
    return mok_error(l, mokInvalidArgument, "%s: topk_idx and topk_w are generated together: pass both or neither", fn);
  if (topk_idx && !routing) return mok_error(l, mokInvalidArgument, "%s: routing is NULL", fn);
  const int64_t H = c->hidden, I = c->inter, Is = c->shared_inter, T = num_tokens, El = l->local_experts;
  if (topk_idx) {
    /* Validate the routing description before anything is written. */
    mokResult_t rc = mokGenerateRouting(seed, routing, c->num_experts, c->topk, rank, 0, 0, topk_idx, topk_w);
    if (rc != mokSuccess) return mok_error(l, rc, "%s: %s", fn, mokGetLastError());
  }
  const float sh = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I);
  const float ss = Is ? 1.0f / sqrtf((float)Is) : 0.0f;
  if (x) MOK_CHECK(mokGenerateBf16(seed, mokTensorX, rank, 0, T * H, 1.0f, x));
  if (d_out) MOK_CHECK(mokGenerateBf16(seed, mokTensorDOut, rank, 0, T * H, 1.0f, d_out));
  if (topk_idx) MOK_CHECK(mokGenerateRouting(seed, routing, c->num_experts, c->topk, rank, 0, T, topk_idx, topk_w));
  for (int64_t e = 0; e < El; e++) {
    int64_t g = (int64_t)rank * El + e;
    if (w_gate) MOK_CHECK(mokGenerateBf16(seed, mokTensorWGate, g, 0, I * H, sh, w_gate + e * I * H));
    if (w_up) MOK_CHECK(mokGenerateBf16(seed, mokTensorWUp, g, 0, I * H, sh, w_up + e * I * H));
    if (w_down) MOK_CHECK(mokGenerateBf16(seed, mokTensorWDown, g, 0, H * I, si, w_down + e * H * I));
  }
  if (Is) {
    if (s_gate) MOK_CHECK(mokGenerateBf16(seed, mokTensorSGate, 0, 0, Is * H, sh, s_gate));
    if (s_up) MOK_CHECK(mokGenerateBf16(seed, mokTensorSUp, 0, 0, Is * H, sh, s_up));
    if (s_down) MOK_CHECK(mokGenerateBf16(seed, mokTensorSDown, 0, 0, H * Is, ss, s_down));
  }
  return mokSuccess;
}
