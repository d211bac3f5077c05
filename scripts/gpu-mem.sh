#!/usr/bin/env bash
# gpu-mem.sh — device memory that follows the rows: the full C suite, then `mok bench layer`
# (mega beside nccl, T=8192) whose lines print each run's layer block and comm scratch beside
# its times: gpu-mega.sh with these defaults (MODELS, TOKENS, IMPLS, TESTS override). $OUT/log.
TESTS=${TESTS-" "} TEST_S=${TEST_S:-330} TOKENS=${TOKENS:-8192} IMPLS=${IMPLS:-mega,nccl} CTAS="" PROFILE="" ZIPF="" \
  exec bash "$(dirname "$0")/gpu-mega.sh"
