/* bench_comm_main.c — stand-alone driver for `mok bench comm`, used by
 * scripts/gpu-comm.sh only when the full tree does not build (not in the Makefile's globs). */
#include "cli.h"
int main(int argc, char **argv) { return mok_bench_comm_main(argc, argv); }
