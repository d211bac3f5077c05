#!/bin/bash
# diag-streams.sh — how fast the forward token tiles of one-tile experts stream their
# weights when a few CTAs run them with the rest of the chip idle (`mok bench gemm --ctas
# N`, every expert R rows, R <= 176: each tile streams a whole 256-row weight block for R
# rows), beside the stream probe's cold CTAs alone (`mok bench stream --mixed`, first two
# rows). The runs are scripts/ab-flags.sh's (variants of the GEMM's options in $VARIANTS,
# "name=options;...", configurations as arguments, "tag:options", e.g. "ds48:--model
# deepseek-v4-pro --rows-per-expert 48 --ctas 33"; REPS default 1 here); $PROBE = K runs the
# stream probe first. Prints GB/s a CTA = the launch's intake (weights + rows of every
# tile) / time / CTAs. Full log in $OUT/log.
OUT=${OUT:-/tmp/streams-out}; mkdir -p "$OUT"
export KINDS=${KINDS:-gateup} REPS=${REPS:-1} ITERS=${ITERS:-10} OUT
# the runs: scripts/ab-flags.sh (builds, runs $TESTS, JSON in $OUT/json, its own table);
# the stream probe first, on the tree it builds
if [ -n "$PROBE" ]; then
  make -j16 all > /dev/null 2>&1 && timeout 120 build/mok bench stream --mixed --k "$PROBE" 2>&1 | grep -m3 -E "^(what|alone) " | tee -a "$OUT/log"
fi
scripts/ab-flags.sh "$@"
J=$OUT/json
exec > >(tee -a "$OUT/log") 2>&1
python3 - "$J" "$@" <<'EOF'
import json, os, re, sys
d = sys.argv[1]
ctas = {}
for cfg in sys.argv[2:]:
    tag, opts = cfg.split(':', 1)
    m = re.search(r'--ctas (\d+)', opts)
    ctas[tag] = int(m.group(1)) if m else 132
print('%-10s %-12s %-14s %5s %5s %5s %4s %9s %8s %10s' % ('config', 'variant', 'kind', 'H', 'I', 'E', 'R', 'ms', 'TFLOP/s', 'GB/s a CTA'))
for f in sorted(os.listdir(d)):
    tag, name, rep, _ = f.split('.')
    for r in json.load(open(os.path.join(d, f)))['results']:
        H, I, E = r['hidden'], r['inter'], r['experts']
        R = r['rows'] // E
        if r['kind'].startswith('gateup'):
            intake = E * (2 * I // 256) * (256 + R) * H * 2
        elif r['kind'].startswith('down'):
            intake = E * (H // 256) * (256 + R) * I * 2
        else:
            continue
        print('%-10s %-12s %-14s %5d %5d %5d %4d %9.4f %8.1f %10.1f' % (tag, name + rep, r['kind'], H, I, E, R, r['ms'],
              r['tflops'], intake / (r['ms'] * 1e-3) / ctas[tag] / 1e9))
EOF
