/*
 * test_child.c — tests that run this program again in a child process with another
 * environment (test_run_child): the helper itself (no GPU), and mok's one-GPU layer under
 * CUDA_DEVICE_MAX_CONNECTIONS=1, the setting Megatron-LM training scripts export.
 */
#include "test.h"

#include <stdlib.h>
#include <string.h>

/* Fails when MOK_TEST_CHILD_PROBE=fail (the helper's test sets it in a child), else passes. */
MOK_TEST(child_probe) {
  const char *v = getenv("MOK_TEST_CHILD_PROBE");
  CHECK_MSG(!v || strcmp(v, "fail") != 0, "the probe was asked to fail");
}

MOK_TEST(test_run_child_reports_passes_and_failures) {
  char rep[4096];
  int passed = -1;
  int rc = test_run_child("MOK_TEST_CHILD_PROBE=pass", "child_probe api_last_error_is_per_thread", 60, &passed, rep,
                          sizeof rep);
  if (rc < 0) SKIP("%s", rep);
  CHECK_MSG(rc == 0 && passed == 2, "two passing tests: status %d, %d passed: %s", rc, passed, rep);
  rc = test_run_child("MOK_TEST_CHILD_PROBE=fail", "child_probe", 60, &passed, rep, sizeof rep);
  CHECK_MSG(rc != 0 && passed == 0, "a failing test: status %d, %d passed: %s", rc, passed, rep);
  CHECK_MSG(strstr(rep, "FAIL  child_probe") && strstr(rep, "the probe was asked to fail") && strstr(rep, "rerun: env "),
            "the report: %s", rep);
  rc = test_run_child("-u MOK_TEST_CHILD_PROBE", "no_test_has_this_name", 60, &passed, rep, sizeof rep);
  CHECK_MSG(rc == 0 && passed == 0 && strstr(rep, "0 passed, 0 failed"), "no test: status %d, %d passed: %s", rc,
            passed, rep);
}

/* Megatron-LM's scripts export CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of the process
 * shares one hardware work queue, so its launches run in issue order across streams. mok's
 * layer on one GPU must still pass: none of its kernels waits for another stream's (its side
 * streams join by events). (Loopback ranks, several ranks' kernels waiting for each other on
 * one GPU, cannot run there: comm.h.) */
MOK_GPU_TEST(layer_passes_with_one_hardware_queue_1gpu, 1) {
  char rep[4096];
  int passed = 0;
  const int rc = test_run_child("CUDA_DEVICE_MAX_CONNECTIONS=1",
                                "layer_mega_matches_reference_1gpu layer_nccl_matches_reference_1gpu "
                                "layer_baseline_matches_reference_1gpu layer_mega_passes_in_cuda_graph_1gpu",
                                300, &passed, rep, sizeof rep);
  if (rc < 0) SKIP("%s", rep);
  CHECK_MSG(rc == 0 && passed == 4, "the layer tests under CUDA_DEVICE_MAX_CONNECTIONS=1 (status %d, %d of 4 passed): %s",
            rc, passed, rep);
}
