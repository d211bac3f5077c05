/*
 * cli.h — entry points of the CLI's subcommands that live in their own files.
 * Each takes the arguments after the subcommand name (argv[0] = the subcommand) and
 * returns the process exit code: 0 ok, 1 a wrong result or failed run, 2 bad usage.
 */
#ifndef MOK_CLI_H
#define MOK_CLI_H
#ifdef __cplusplus
extern "C" {
#endif

int mok_bench_gemm_main(int argc, char **argv); /* tools/bench_gemm.cu: mok bench gemm */
int mok_bench_comm_main(int argc, char **argv); /* tools/bench_comm.cu: mok bench comm */
int mok_bench_stream_main(int argc, char **argv); /* tools/bench_stream.cu: mok bench stream */
int mok_bench_layer_main(int argc, char **argv); /* tools/bench_layer.c: mok bench layer */

/* tools/run_gpu.c: `mok run` on one GPU per rank (cfg->num_ranks GPUs); the host
 * buffers are those of the CPU path. Returns 0, or 1 with a message on stderr. */
#include "mok.h"
int mok_run_on_gpus(const mokConfig_t *cfg, mokImpl_t impl, const mokRankInput_t *in, const mokRankWeights_t *w,
                    mokBf16 *const *dout, mokBf16 *const *out, const mokRankGrads_t *g, double *fwd_ms,
                    double *bwd_ms);

#ifdef __cplusplus
}
#endif
#endif
