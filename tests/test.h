/*
 * test.h — the mok test harness: tests register themselves (a constructor per test),
 * tests/test_main.c runs them, prints one line each and a closing
 * "N passed, N failed, N skipped" line, and exits non-zero on any failure.
 *
 *   MOK_TEST(name) { CHECK(x == 1); CHECK_MSG(err < 1e-2, "rel err %g", err); }
 *   MOK_GPU_TEST(name, min_gpus) { ... }   skipped, with the reason, when fewer GPUs exist
 *   SKIP("why");                           skip from inside a test
 *
 * Tests are plain C11 (.c) or CUDA C (.cu); in .cu files the same macros work.
 * Tests may include src/ internal headers: they are white-box where the stage needs it.
 */
#ifndef MOK_TEST_H
#define MOK_TEST_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct test_ctx {
  int failed;
  int skipped;
  char msg[1024];
} test_ctx;

typedef void (*test_fn)(test_ctx *t);
void test_register(const char *name, test_fn fn, int min_gpus, const char *file);
void test_fail(test_ctx *t, const char *file, int line, const char *fmt, ...);
void test_skip(test_ctx *t, const char *fmt, ...);
/* Fresh randomness per run unless MOK_TEST_SEED is set; printed by the runner. */
uint64_t test_seed(void);
/* Number of CUDA devices visible (0 without a GPU or driver). */
int test_gpu_count(void);
/* Runs this program again as a child process on `tests` (names or substrings, separated by
 * spaces), with `env` before it (words for env(1): "VAR=value", "-u VAR") and this run's
 * seed, for at most timeout_s seconds. Returns the child's exit status (-1: it could not be
 * started); *passed = its "ok" lines; report: its FAIL lines (else its last line), then the
 * command that reruns it. */
/* Sets environment variable name to value for a test; test_env_restore puts back what it
 * was (saved: test_env_set's record, set or unset). */
typedef struct test_env_saved {
  int had;
  char value[256];
} test_env_saved;
void test_env_set(const char *name, const char *value, test_env_saved *saved);
void test_env_restore(const char *name, const test_env_saved *saved);
int test_run_child(const char *env, const char *tests, int timeout_s, int *passed, char *report, size_t cap);

#define MOK_TEST_(name, gpus)                                                  \
  static void name(test_ctx *t);                                               \
  __attribute__((constructor)) static void name##_register_(void) {            \
    test_register(#name, name, gpus, __FILE__);                                \
  }                                                                            \
  static void name(test_ctx *t)

#define MOK_TEST(name) MOK_TEST_(name, 0)
#define MOK_GPU_TEST(name, min_gpus) MOK_TEST_(name, min_gpus)

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      test_fail(t, __FILE__, __LINE__, "CHECK(%s)", #cond);                    \
      return;                                                                  \
    }                                                                          \
  } while (0)

#define CHECK_MSG(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      test_fail(t, __FILE__, __LINE__, __VA_ARGS__);                           \
      return;                                                                  \
    }                                                                          \
  } while (0)

/* CHECK that a mok call returns the expected status. */
#define CHECK_STATUS(call, expected)                                           \
  do {                                                                         \
    int got_ = (int)(call);                                                    \
    if (got_ != (int)(expected)) {                                             \
      test_fail(t, __FILE__, __LINE__, "%s returned %d, expected %d (%s)",     \
                #call, got_, (int)(expected), mokGetLastError());              \
      return;                                                                  \
    }                                                                          \
  } while (0)
#define CHECK_OK(call) CHECK_STATUS(call, mokSuccess)

#define SKIP(...)                                                              \
  do {                                                                         \
    test_skip(t, __VA_ARGS__);                                                 \
    return;                                                                    \
  } while (0)

/* Loopback ranks (several ranks' waiting kernels on one GPU) cannot run where every stream
 * shares one hardware queue, and mok_comm_create_loopback refuses them there (comm.h): a test
 * of them skips under CUDA_DEVICE_MAX_CONNECTIONS=1 (mok_tests sets 32 where it is unset). */
#define SKIP_LOOPBACK_ON_ONE_QUEUE()                                           \
  do {                                                                         \
    const char *q_ = getenv("CUDA_DEVICE_MAX_CONNECTIONS");                    \
    if (q_ && atoi(q_) == 1)                                                   \
      SKIP("loopback ranks need more than one hardware queue "                 \
           "(CUDA_DEVICE_MAX_CONNECTIONS=1)");                                 \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif /* MOK_TEST_H */
