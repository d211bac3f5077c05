/* util.h — small helpers the CPU tests share: a seeded PRNG and relative errors. */
#ifndef MOK_TEST_UTIL_H
#define MOK_TEST_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t s; } rng_t;
static inline uint64_t rng_next(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline int rng_int(rng_t *r, int n) { return (int)(rng_next(r) % (uint64_t)n); }
static inline double rng_unif(rng_t *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline double rng_sym(rng_t *r) { return 2.0 * rng_unif(r) - 1.0; }

/* ||a - b||_2 / ||b||_2 (0 when both are 0; NaN anywhere gives +inf). */
static inline double rel_l2(const double *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (a[i] != a[i] || b[i] != b[i]) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
}
#endif
