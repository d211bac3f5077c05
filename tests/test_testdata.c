/*
 * test_testdata.c — the counter-based generator: a pure function of (seed, tensor,
 * index) (slices equal the whole), unit variance before the scale, distinct streams
 * per tensor; routings with k distinct experts, softmax weights summing to 1, the Zipf
 * skew and the hot expert; validation.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mok.h"
#include "test.h"

MOK_TEST(testdata_bf16_is_counter_based) {
  uint64_t seed = test_seed();
  enum { n = 1 << 16 };
  mokBf16 *a = malloc(2 * n), *b = malloc(2 * n), *c = malloc(2 * n);
  CHECK_OK(mokGenerateBf16(seed, mokTensorWGate, 7, 0, n, 0.5f, a));
  CHECK_OK(mokGenerateBf16(seed, mokTensorWGate, 7, 1000, 123, 0.5f, b));
  CHECK(!memcmp(a + 1000, b, 123 * 2)); /* any slice alone equals the whole */
  CHECK_OK(mokGenerateBf16(seed, mokTensorWGate, 8, 0, n, 0.5f, c));
  CHECK(memcmp(a, c, 2 * n)); /* another expert, another stream */
  CHECK_OK(mokGenerateBf16(seed, mokTensorWUp, 7, 0, n, 0.5f, c));
  CHECK(memcmp(a, c, 2 * n));
  CHECK_OK(mokGenerateBf16(seed + 1, mokTensorWGate, 7, 0, n, 0.5f, c));
  CHECK(memcmp(a, c, 2 * n));
  double s = 0, s2 = 0, mx = 0;
  for (int i = 0; i < n; i++) {
    double v = mokBf16ToFloat(a[i]);
    s += v, s2 += v * v;
    mx = fabs(v) > mx ? fabs(v) : mx;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  CHECK_MSG(fabs(mean) < 0.01 && fabs(var - 0.25) < 0.01, "mean %g var %g (want 0, 0.25)", mean, var);
  CHECK(mx <= 0.5 * sqrt(3.0) * 1.01);
  CHECK_STATUS(mokGenerateBf16(seed, mokTensorX, 0, 0, 10, 1.0f, NULL), mokInvalidArgument);
  CHECK_STATUS(mokGenerateBf16(seed, (mokTensorKind_t)77, 0, 0, 10, 1.0f, a), mokInvalidArgument);
  CHECK_STATUS(mokGenerateBf16(seed, mokTensorX, 0, -1, 10, 1.0f, a), mokInvalidArgument);
  free(a); free(b); free(c);
}

static int check_routing(test_ctx *t, const int32_t *idx, const float *w, int T, int E, int k) {
  for (int q = 0; q < T; q++) {
    double sum = 0;
    for (int j = 0; j < k; j++) {
      if (idx[q * k + j] < 0 || idx[q * k + j] >= E) return test_fail(t, __FILE__, __LINE__, "id out of range"), 0;
      if (!(w[q * k + j] > 0)) return test_fail(t, __FILE__, __LINE__, "weight not positive"), 0;
      sum += w[q * k + j];
      for (int j2 = 0; j2 < j; j2++)
        if (idx[q * k + j] == idx[q * k + j2]) return test_fail(t, __FILE__, __LINE__, "duplicate expert"), 0;
    }
    if (fabs(sum - 1) > 1e-5) return test_fail(t, __FILE__, __LINE__, "weights sum to %g", sum), 0;
  }
  return 1;
}

MOK_TEST(testdata_routings) {
  enum { T = 4000, E = 64, k = 6 };
  int32_t *idx = malloc(sizeof(int32_t) * T * k), *idx2 = malloc(sizeof(int32_t) * T * k);
  float *w = malloc(sizeof(float) * T * k), *w2 = malloc(sizeof(float) * T * k);
  int hist[E];
  uint64_t seed = test_seed();
  /* uniform: every expert near T*k/E */
  mokRouting_t uni = {mokRoutingUniform, 0};
  CHECK_OK(mokGenerateRouting(seed, &uni, E, k, 3, 0, T, idx, w));
  if (!check_routing(t, idx, w, T, E, k)) return;
  memset(hist, 0, sizeof hist);
  for (int q = 0; q < T * k; q++) hist[idx[q]]++;
  for (int e = 0; e < E; e++) CHECK_MSG(hist[e] > 250 && hist[e] < 500, "expert %d got %d routes", e, hist[e]);
  /* token slices are independent of how they are generated */
  CHECK_OK(mokGenerateRouting(seed, &uni, E, k, 3, 100, 50, idx2, w2));
  CHECK(!memcmp(idx + 100 * k, idx2, sizeof(int32_t) * 50 * k) && !memcmp(w + 100 * k, w2, sizeof(float) * 50 * k));
  CHECK_OK(mokGenerateRouting(seed, &uni, E, k, 4, 0, T, idx2, w2));
  CHECK(memcmp(idx, idx2, sizeof(int32_t) * T * k)); /* another rank, other tokens */
  /* zipf: expert 0 far more loaded than the last */
  mokRouting_t zipf = {mokRoutingZipf, 1.2};
  CHECK_OK(mokGenerateRouting(seed, &zipf, E, k, 0, 0, T, idx, w));
  if (!check_routing(t, idx, w, T, E, k)) return;
  memset(hist, 0, sizeof hist);
  for (int q = 0; q < T * k; q++) hist[idx[q]]++;
  CHECK_MSG(hist[0] > 3 * hist[E - 1] && hist[0] > hist[10], "zipf histogram %d .. %d", hist[0], hist[E - 1]);
  /* hot: slot 0 is the hot expert */
  mokRouting_t hot = {mokRoutingHot, 17};
  CHECK_OK(mokGenerateRouting(seed, &hot, E, k, 1, 0, T, idx, w));
  if (!check_routing(t, idx, w, T, E, k)) return;
  for (int q = 0; q < T; q++) CHECK(idx[q * k] == 17);
  /* validation */
  mokRouting_t bad = {mokRoutingHot, 64};
  CHECK_STATUS(mokGenerateRouting(seed, &bad, E, k, 0, 0, T, idx, w), mokInvalidArgument);
  bad = (mokRouting_t){mokRoutingZipf, -1};
  CHECK_STATUS(mokGenerateRouting(seed, &bad, E, k, 0, 0, T, idx, w), mokInvalidArgument);
  CHECK_STATUS(mokGenerateRouting(seed, &uni, 4, 5, 0, 0, T, idx, w), mokInvalidArgument);
  CHECK_STATUS(mokGenerateRouting(seed, &uni, E, k, 0, 0, T, NULL, w), mokInvalidArgument);
  CHECK_STATUS(mokGenerateRouting(seed, NULL, E, k, 0, 0, T, idx, w), mokInvalidArgument);
  free(idx); free(idx2); free(w); free(w2);
}
