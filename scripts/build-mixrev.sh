#!/usr/bin/env bash
# build-mixrev.sh — on the CPU machine, before a device call of scripts/gpu-s45.sh: the two
# build variants of the split mix order's experiment (src/gemm/grouped_gemm.cuh,
# MOK_EXP_MIXREV): build-r1/mok (bit 0: the one-tile experts' tiles fewest rows first) and
# build-r2/mok (bit 1: the multi-tile experts' fewest rows first), each from a copy of build/
# with src/gemm.cu rebuilt under the define (the other objects are the same). build/ must be
# current first (make all). Both variants at once (~1.5 min on two cores).
set -euo pipefail
make -q all || { echo "build/ is not current: run make all first" >&2; exit 1; }
for v in 1 2; do
  rm -rf build-r$v && cp -a build build-r$v && rm -f build-r$v/obj/src/gemm.cu.o build-r$v/mok
done
for v in 1 2; do
  make B=build-r$v NVCC_GENCODE="-gencode arch=compute_90a,code=sm_90a -DMOK_EXP_MIXREV=$v" build-r$v/mok \
    > build-r$v.log 2>&1 &
done
rc=0; for j in $(jobs -p); do wait "$j" || rc=1; done
for v in 1 2; do tail -n 1 build-r$v.log; rm -f build-r$v.log; done
[ $rc = 0 ] && ls -la build-r1/mok build-r2/mok
exit $rc
