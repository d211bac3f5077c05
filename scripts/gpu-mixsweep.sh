set -uo pipefail
mkdir -p $OUT
make -j16 all >/dev/null 2>&1 || exit 1
for m in qwen3.5-397b-a17b kimi-k2.7-code deepseek-v4-pro; do
  for P in ${PS:-0 24 32 40 48 64}; do
    echo "-- $m P=$P"
    timeout 60 build/mok bench gemm --model $m --routing zipf:1.2 --kinds gateup,down --vs-cublas-zipf off --mix-ctas $P --iters 20 --seed 7 2>&1 | grep -E "zipf / balanced|WRONG|rror"
  done
done 2>&1 | tee $OUT/log
