# mok — one plain Makefile.
#   make          build/libmok.so, build/libmok.a and the CLI build/mok
#   make test     build and run every test (GPU tests skip, saying why, without a GPU)
#   make run      the main job: the fastest implementation on all local GPUs, or the
#                 CPU reference on a small model where no GPU exists
# Variables: CUDA_HOME (default /usr/local/cuda), NCCL_HOME (default: searched in
# CUDA_HOME and /usr), NVCC_ARCH (default sm_90a), DEBUG=1.

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= gcc
ifeq ($(CC),cc)
CC := gcc
endif

# ---- NCCL: found explicitly, or a loud error naming the variable to set ----------
ifndef NCCL_HOME
  ifneq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
    NCCL_HOME := $(CUDA_HOME)
  else ifneq ($(wildcard /usr/include/nccl.h),)
    NCCL_HOME := /usr
  endif
endif
ifeq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
  $(error NCCL not found: no nccl.h under CUDA_HOME=$(CUDA_HOME) or /usr. Set NCCL_HOME to the NCCL install (NCCL 2.28+ with nccl_device.h))
endif
ifeq ($(wildcard $(NCCL_HOME)/include/nccl_device.h),)
  $(error NCCL at $(NCCL_HOME) has no nccl_device.h: mok needs NCCL 2.28+ (set NCCL_HOME))
endif
ifeq ($(wildcard $(NVCC)),)
  $(error nvcc not found at $(NVCC): set CUDA_HOME to the CUDA toolkit)
endif
NCCL_LIBDIR := $(firstword $(wildcard $(NCCL_HOME)/lib/libnccl.so $(NCCL_HOME)/lib64/libnccl.so $(NCCL_HOME)/lib/x86_64-linux-gnu/libnccl.so*))
NCCL_LIBDIR := $(dir $(NCCL_LIBDIR))
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))

ifeq ($(DEBUG),1)
  OPT := -O0 -g
  NVOPT := -O0 -g -G
  PTXAS_CHECK := --warn-on-spills
else
  OPT := -O2 -g
  NVOPT := -O3 -lineinfo
  # a kernel that spills registers to local memory fails the build (the GEMM tiles are
  # written to run without: issue 5); ptxas's other warnings fail it too
  PTXAS_CHECK := --warn-on-spills,--warning-as-error
endif

INCS    := -Iinclude -Isrc -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include
CFLAGS  += -std=c11 $(OPT) -Wall -Wextra -Wno-unused-parameter -fPIC -pthread -MMD -MP -D_GNU_SOURCE $(INCS)
NVCC_GENCODE ?= -gencode arch=compute_90a,code=sm_90a
NVFLAGS += -std=c++17 $(NVOPT) $(NVCC_GENCODE) -Xcompiler -fPIC,-Wall,-Wno-unused-parameter \
           -Xptxas=$(PTXAS_CHECK) -MMD -MP $(INCS) --expt-relaxed-constexpr
comma   := ,
RPATH   := -Wl,-rpath,$(CUDA_LIBDIR) $(if $(NCCL_LIBDIR),-Wl$(comma)-rpath$(comma)$(NCCL_LIBDIR))
LDLIBS  := -L$(CUDA_LIBDIR) $(if $(NCCL_LIBDIR),-L$(NCCL_LIBDIR)) -lnccl -lcublasLt -lcublas -lcudart -lstdc++ -lm -lpthread -ldl

B := build
LIB_C   := $(wildcard src/*.c)
LIB_CU  := $(wildcard src/*.cu)
LIB_OBJ := $(LIB_C:src/%.c=$(B)/obj/src/%.o) $(LIB_CU:src/%.cu=$(B)/obj/src/%.cu.o)
CLI_C   := $(wildcard tools/*.c)
CLI_CU  := $(wildcard tools/*.cu)
CLI_OBJ := $(CLI_C:tools/%.c=$(B)/obj/tools/%.o) $(CLI_CU:tools/%.cu=$(B)/obj/tools/%.cu.o)
TEST_C  := $(wildcard tests/*.c)
TEST_CU := $(wildcard tests/*.cu)
TEST_OBJ := $(TEST_C:tests/%.c=$(B)/obj/tests/%.o) $(TEST_CU:tests/%.cu=$(B)/obj/tests/%.cu.o)

.PHONY: all test test-python run check-header check-readme check-wgmma-guard clean
all: $(B)/libmok.so $(B)/libmok.a $(B)/mok

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
# ptxas's wgmma serialisation notes fail the build as a spill does: every "wgmma.mma_async
# instructions are serialized ..." note (C751x / C752x) and every wait or arrive ptxas
# injects around a wgmma (C7517 / C7519). Each means ptxas waits for wgmmas the code meant
# to keep in flight (session 16's dgrad tiles lost 21% to one), and a build that only notes
# it looks like a slow change. Seen so far (docs/PERF.md): C7510 (the pipeline crosses a
# function boundary: a tile function left out of line, session 16), C7520 (WG.AR in a
# divergent path: wgmmas behind a runtime test in a loop body, session 22), C7513 (non-wgmma
# instructions define a wgmma's input registers: a branch between an ldmatrix and the wgmma
# that reads its registers, session 24), C7512 (insufficient register resources: a second
# register-sourced wgmma width in one kernel, session 24). check-wgmma-guard tests the rule.
$(B)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@ 2> $@.log; s=$$?; cat $@.log >&2; \
	  if grep -qE 'wgmma.mma_async instructions are serialized|warpgroup.(wait|arrive) is injected|C75[12]0' $@.log; then \
	    echo "$<: wgmma serialised (ptxas note above)" >&2; rm -f $@; exit 1; fi; \
	  exit $$s

$(B)/libmok.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(RPATH) $(LDLIBS)
$(B)/libmok.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^
# The CLI links the static library: its benchmarks reach internal kernels directly.
$(B)/mok: $(CLI_OBJ) $(B)/libmok.a
	$(CC) -o $@ $(CLI_OBJ) $(B)/libmok.a $(RPATH) $(LDLIBS)
$(B)/mok_tests: $(TEST_OBJ) $(B)/libmok.a
	$(CC) -o $@ $(TEST_OBJ) $(B)/libmok.a $(RPATH) $(LDLIBS)

# The public header must compile alone, as C11 and as C++.
check-header:
	$(CC) -std=c11 -Wall -Wextra -pedantic -Werror -fsyntax-only -x c include/mok.h
	g++ -std=c++11 -Wall -Wextra -pedantic -Werror -fsyntax-only -x c++ include/mok.h

# The README's C example must compile against the header as written.
check-readme:
	@mkdir -p $(B)
	@{ echo '#include <stdio.h>'; echo '#include "mok.h"'; \
	  echo 'void readme_example(ncclComm_t nccl_comm, mokRankInput_t input, mokRankWeights_t weights,'; \
	  echo '  mokBf16 *out, const mokBf16 *d_out, mokRankGrads_t grads, cudaStream_t stream) {'; \
	  sed -n '/^```c$$/,/^```$$/p' README.md | sed '1d;$$d' | grep -v '^#include'; echo '}'; } > $(B)/readme_example.c
	$(CC) -std=c11 -Wall -Wextra -Werror -fsyntax-only -Iinclude $(B)/readme_example.c

# The rule above must fail a compile whose wgmmas ptxas serialises (tests/guard: a wgmma in a
# function left out of line); a ptxas whose notes it no longer recognises fails this check.
check-wgmma-guard:
	@mkdir -p $(B)
	@rm -f $(B)/obj/tests/guard/wgmma_serialised.cu.o
	@if $(MAKE) --no-print-directory $(B)/obj/tests/guard/wgmma_serialised.cu.o > $(B)/wgmma-guard.log 2>&1; then \
	  cat $(B)/wgmma-guard.log >&2; echo "check-wgmma-guard: a serialised wgmma compiled without failing the build" >&2; exit 1; fi
	@grep -q "wgmma serialised" $(B)/wgmma-guard.log || { cat $(B)/wgmma-guard.log >&2; \
	  echo "check-wgmma-guard: the compile failed, but not on the wgmma rule" >&2; exit 1; }
	@echo "check-wgmma-guard: ok (a serialised wgmma fails the build)"

# The Python binding's tests (python/tests/test_mok.py: the C API through ctypes anywhere, the
# PyTorch layer where torch and a GPU exist) run first; the C suite's summary line ends the run.
PYTHON ?= python3
test: all $(B)/mok_tests check-header check-readme check-wgmma-guard test-python
	$(B)/mok_tests $(TESTS)

test-python: $(B)/libmok.so
	@if command -v $(PYTHON) >/dev/null 2>&1; then MOK_LIBRARY=$(abspath $(B)/libmok.so) $(PYTHON) python/tests/test_mok.py $(PYTESTS); \
	else echo "python: skipped: no $(PYTHON) on PATH (the binding's tests need it)"; fi

run: all
	$(B)/mok run

clean:
	rm -rf $(B)

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
