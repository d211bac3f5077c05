/*
 * test_main.c — runs every registered test. Usage: mok_tests [substring ...]
 * (only tests whose name contains one of the substrings). Environment:
 * MOK_TEST_SEED=N fixes the random seed (otherwise fresh per run, printed).
 */
#include "test.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 1024

typedef struct {
  const char *name;
  test_fn fn;
  int min_gpus;
  const char *file;
} test_entry;

static test_entry g_tests[MAX_TESTS];
static int g_num_tests;
static uint64_t g_seed;

void test_register(const char *name, test_fn fn, int min_gpus, const char *file) {
  if (g_num_tests == MAX_TESTS) {
    fprintf(stderr, "test_main: more than %d tests, raise MAX_TESTS\n", MAX_TESTS);
    abort();
  }
  test_entry e = {name, fn, min_gpus, file};
  g_tests[g_num_tests++] = e;
}

void test_fail(test_ctx *t, const char *file, int line, const char *fmt, ...) {
  t->failed = 1;
  int n = snprintf(t->msg, sizeof t->msg, "%s:%d: ", file, line);
  if (n < 0 || (size_t)n >= sizeof t->msg) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->msg + n, sizeof t->msg - (size_t)n, fmt, ap);
  va_end(ap);
}

void test_skip(test_ctx *t, const char *fmt, ...) {
  t->skipped = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->msg, sizeof t->msg, fmt, ap);
  va_end(ap);
}

uint64_t test_seed(void) { return g_seed; }

int test_gpu_count(void) {
  static int cached = -1;
  if (cached < 0) {
    int n = 0;
    cached = cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
    if (cached == 0) cudaGetLastError();
  }
  return cached;
}

void test_env_set(const char *name, const char *value, test_env_saved *saved) {
  const char *was = getenv(name);
  saved->had = was != NULL;
  snprintf(saved->value, sizeof saved->value, "%s", was ? was : "");
  setenv(name, value, 1);
}

void test_env_restore(const char *name, const test_env_saved *saved) {
  if (saved->had) setenv(name, saved->value, 1);
  else unsetenv(name);
}

int test_run_child(const char *env, const char *tests, int timeout_s, int *passed, char *report, size_t cap) {
  *passed = 0;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    snprintf(report, cap, "cannot find this program's path (/proc/self/exe)");
    return -1;
  }
  self[n] = 0;
  char cmd[6144];
  snprintf(cmd, sizeof cmd, "env %s MOK_TEST_SEED=%llu timeout %d '%s' %s 2>&1", env, (unsigned long long)g_seed,
           timeout_s, self, tests);
  FILE *p = popen(cmd, "r");
  if (!p) {
    snprintf(report, cap, "cannot start a child (popen): %s", cmd);
    return -1;
  }
  char line[1024], last[1024] = "", fails[2048] = "";
  while (fgets(line, sizeof line, p)) {
    if (strncmp(line, "ok ", 3) == 0) ++*passed;
    if (strncmp(line, "FAIL", 4) == 0 && strlen(fails) + strlen(line) < sizeof fails) strcat(fails, line);
    snprintf(last, sizeof last, "%s", line);
  }
  const int rc = pclose(p);
  snprintf(report, cap, "%s%s(rerun: %s)", fails[0] ? fails : "last line: ", fails[0] ? "" : last, cmd);
  return rc;
}

static int by_name(const void *a, const void *b) {
  const test_entry *x = a, *y = b;
  int c = strcmp(x->file, y->file);
  return c ? c : strcmp(x->name, y->name);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  /* Loopback ranks (several ranks' kernels on one GPU, some waiting for others): a lazily
   * loaded kernel or module's data can make a launch wait for the running kernels (comm.h);
   * load them all at once. Before the first CUDA call; a caller's own setting wins. */
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_MODULE_DATA_LOADING", "EAGER", 0);
  /* and hardware work queues to spare (CUDA's most is 32): loopback ranks queue their
   * waiting kernels in rounds, which carries their eager passes on any number of queues, but
   * a CUDA graph replay queues its kernels at once and needs the ranks on queues apart
   * (comm.h, mok_comm_create_loopback) */
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const char *env = getenv("MOK_TEST_SEED");
  g_seed = env ? strtoull(env, NULL, 0) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)clock();
  printf("mok tests: seed %llu (set MOK_TEST_SEED to repeat), %d GPU(s) visible\n",
         (unsigned long long)g_seed, test_gpu_count());
  qsort(g_tests, (size_t)g_num_tests, sizeof g_tests[0], by_name);
  int passed = 0, failed = 0, skipped = 0;
  for (int i = 0; i < g_num_tests; i++) {
    test_entry *e = &g_tests[i];
    if (argc > 1) {
      int want = 0;
      for (int a = 1; a < argc; a++) want |= strstr(e->name, argv[a]) != NULL;
      if (!want) continue;
    }
    test_ctx t;
    memset(&t, 0, sizeof t);
    double t0 = now_s();
    if (e->min_gpus > 0 && test_gpu_count() < e->min_gpus) {
      snprintf(t.msg, sizeof t.msg, "needs %d GPU(s), %d visible", e->min_gpus, test_gpu_count());
      t.skipped = 1;
    } else {
      e->fn(&t);
    }
    double dt = now_s() - t0;
    if (t.failed) {
      failed++;
      printf("FAIL  %-52s %7.2fs  %s\n", e->name, dt, t.msg);
    } else if (t.skipped) {
      skipped++;
      printf("SKIP  %-52s %7.2fs  %s\n", e->name, dt, t.msg);
    } else {
      passed++;
      printf("ok    %-52s %7.2fs\n", e->name, dt);
    }
    fflush(stdout);
  }
  if (skipped)
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  else
    printf("%d passed, %d failed\n", passed, failed);
  if (failed) /* the seed again at the end, where a truncated log still shows it */
    printf("to repeat: MOK_TEST_SEED=%llu\n", (unsigned long long)g_seed);
  return failed ? 1 : 0;
}
