#!/bin/bash
# gpu-comm.sh — one device run for the communicator (issue 3): build, GPU tests of the
# comm, `mok bench comm` at 8/16/24/32 SMs (and all) with 1 GiB transfers, then the TMA
# bulk engine at 1..32 SMs and three chunk sizes; log in $OUT/log,
# JSON in $OUT/bench_comm*.json, short table last.
# Usage (on a 2+ GPU machine, repo root): OUT=/tmp/out scripts/gpu-comm.sh [extra bench args]
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/mok-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
echo "== $(date -u) commit $(git rev-parse --short HEAD 2>/dev/null || echo none) + working tree"
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm --format=csv
nvidia-smi topo -m | head -5
MOK=build/mok
TESTS=build/mok_tests
if ! make -j16 all build/mok_tests > "$OUT/build.log" 2>&1; then
  echo "== full build failed (tail below); building the comm parts by hand"
  tail -20 "$OUT/build.log"
  NCCL_INC=$( [ -f /usr/local/cuda/include/nccl.h ] && echo /usr/local/cuda/include || echo /usr/include )
  NV="nvcc -std=c++17 -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc -I$NCCL_INC"
  CC="gcc -std=c11 -O2 -D_GNU_SOURCE -pthread -Iinclude -Isrc -I/usr/local/cuda/include -I$NCCL_INC"
  mkdir -p build/alt
  $NV -c src/comm.cu -o build/alt/comm.o && $NV -c tests/test_comm.cu -o build/alt/test_comm.o &&
    $NV -c tools/bench_comm.cu -o build/alt/bench_comm.o && $CC -c src/api.c -o build/alt/api.o &&
    $CC -c tests/test_main.c -o build/alt/test_main.o && $CC -c scripts/bench_comm_main.c -o build/alt/bcm.o || exit 1
  LIBS="-L/usr/local/cuda/lib64 -lnccl -lcudart -lstdc++ -lm -lpthread -ldl"
  gcc -o build/alt/mok_tests build/alt/test_main.o build/alt/test_comm.o build/alt/comm.o build/alt/api.o $LIBS || exit 1
  gcc -o build/alt/bench_comm build/alt/bcm.o build/alt/bench_comm.o build/alt/comm.o build/alt/api.o $LIBS || exit 1
  TESTS=build/alt/mok_tests
  MOK="build/alt/bench_comm"
  BENCH="$MOK"
else
  BENCH="$MOK bench comm"
fi
echo "== tests"
timeout 240 $TESTS comm
echo "tests rc=$?"
echo "== bench"
# the numbers for docs/PERF.md: default engine (16-byte ld/st, unroll 4, 1024 threads)
timeout 120 $BENCH --sms 8,16,24,32,all --bytes 1G --iters 20 --json "$OUT/bench_comm.json" "$@" | tee "$OUT/bench.txt"
echo "bench rc=$?"
# TMA bulk engine at few SMs, three chunk sizes
for c in 16K 32K 64K; do
  timeout 120 $BENCH --engine bulk --chunk $c --sms 1,2,4,8,16,32 --bytes 1G --iters 20 --json "$OUT/bench_comm_bulk_$c.json" | tee -a "$OUT/bench_bulk.txt"
  echo "bench bulk $c rc=$?"
done
echo "== summary"
grep -E "^(ok|FAIL|SKIP)|passed" "$OUT/log" | grep -v "^SKIP" | tail -20
grep -E "^(mode|push|pull)" "$OUT/bench.txt"
grep -E "^(push|pull)" "$OUT/bench_bulk.txt"
