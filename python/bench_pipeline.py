"""mok.MoE under a pipeline schedule (1F1B), with and without contexts, beside plain PyTorch.

    python3 python/bench_pipeline.py [--models qwen3.5-397b-a17b] [--tokens 4096] [--depth 4]
                                     [--micro-batches 8] [--impls mega,auto] [--iters 5]
                                     [--fields name=value,...] [--no-torch] [--json FILE]

One GPU (EP1), one layer, --micro-batches micro-batches of --tokens tokens in the order a 1F1B
pipeline stage of depth --depth runs them: up to depth forwards, then a backward and a forward
in turn, then the remaining backwards (every micro-batch's forward, with autograd, then its
backward; the weight gradients summed over the micro-batches in .grad). Each mok impl runs
twice: with contexts=1 (one forward's state kept: a backward whose state a later forward
took runs its forward again) and with contexts=depth (mok.MoE(contexts=...): none does).
"torch" is bench_torch.py's layer in plain PyTorch on the same weights (autograd keeps every
micro-batch's activations). Printed per schedule: the median time of --iters schedules
(CUDA events around each, after one warm-up) per micro-batch, how many forwards mok ran,
and the peak device memory of one schedule beyond the weights: their gradients (freed before
each schedule), the activations or saved rows of the forwards in flight and the outputs (for
mok with its layers' saved blocks and the comm's scratch). --fields overrides config fields
(e.g. a small layer for a smoke test: num_experts=16,hidden=256,inter=128,topk=4,shared_inter=128).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import mok  # noqa: E402
from bench_torch import routing, torch_moe, write_json  # noqa: E402


def one_f_one_b(depth, mbs):
    """("F", i) / ("B", i) steps of a 1F1B pipeline stage of that depth."""
    steps, f, b = [], 0, 0
    while b < mbs:
        if f < mbs and f - b < depth:
            steps.append(("F", f))
            f += 1
        else:
            steps.append(("B", b))
            b += 1
    return steps


def run_schedule(steps, fwd, bwd, params):
    for p in params:
        p.grad = None
    outs = {}
    for op, i in steps:
        if op == "F":
            outs[i] = fwd(i)
        else:
            bwd(i, outs.pop(i))


def timed_schedule(steps, fwd, bwd, params, iters, dev):
    run_schedule(steps, fwd, bwd, params)  # warm-up (and the blocks grown)
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    run_schedule(steps, fwd, bwd, params)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - base
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run_schedule(steps, fwd, bwd, params)
        b.record()
        torch.cuda.synchronize(dev)
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2], peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3.5-397b-a17b")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--impls", default="mega,auto")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--fields", default="", help="config fields, name=value,... (overriding the model's)")
    ap.add_argument("--no-torch", action="store_true", help="skip the plain-PyTorch layer")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.depth < 1 or a.micro_batches < 1 or a.tokens < 1 or a.iters < 1:
        raise SystemExit("bench_pipeline.py: --depth, --micro-batches, --tokens and --iters must be >= 1")
    fields = {}
    for kv in filter(None, a.fields.split(",")):
        k, _, v = kv.partition("=")
        fields[k] = float(v) if k == "swiglu_limit" else int(v)
    dev = torch.device("cuda", torch.cuda.current_device())
    steps = one_f_one_b(a.depth, a.micro_batches)
    M, T = a.micro_batches, a.tokens
    print("mok %d, torch %s, %s; 1F1B depth %d, %d micro-batches of %d tokens, median of %d" % (
        mok.version(), torch.__version__, torch.cuda.get_device_name(dev), a.depth, M, T, a.iters))
    rows = []
    for model in a.models.split(","):
        comm = mok.Comm(dev.index)
        first = None
        runs = []
        for impl in a.impls.split(","):
            for n in sorted({1, a.depth}):
                m = mok.MoE(model or None, max_tokens=T, comm=comm, impl=impl, init_std=0.02, contexts=n, **fields)
                if first is None:
                    first = m
                else:  # one set of weights for every run
                    m.w_gate_up, m.w_down, m.s_gate_up, m.s_down = first.w_gate_up, first.w_down, first.s_gate_up, \
                        first.s_down
                runs.append((impl, n, m))
        c = first.config
        gen = torch.Generator(device=dev).manual_seed(2000 + T)
        mbs = []
        for _ in range(M):
            idx, w = routing(T, c.num_experts, c.topk, "uniform", gen, dev)
            x = torch.randn((T, c.hidden), generator=gen, device=dev).to(torch.bfloat16)
            d = (torch.randn((T, c.hidden), generator=gen, device=dev) * 0.01).to(torch.bfloat16)
            mbs.append((x.requires_grad_(), idx, w.requires_grad_(), d))
        params = [p for p in first.parameters()]
        for impl, n, m in runs:
            count = [0]
            for l in m.contexts.layers:
                def counted(*args, _f=l.forward_raw, **kw):
                    count[0] += 1
                    return _f(*args, **kw)
                l.forward_raw = counted

            def fwd(i, m=m):
                x, idx, w, _ = mbs[i]
                return m(x, idx, w)

            def bwd(i, out):
                out.backward(mbs[i][3])

            ms, peak = timed_schedule(steps, fwd, bwd, params, a.iters, dev)
            own, scratch = m.memory_info()
            rows.append(dict(model=model, tokens=T, depth=a.depth, micro_batches=M, impl=impl, contexts=n,
                             ms_per_micro_batch=ms / M, forwards=count[0] // (a.iters + 2),
                             peak_bytes=peak + own + scratch))
            for l in m.contexts.layers:
                del l.forward_raw
            print("  %s %s, contexts %d: %.3f ms a micro-batch, %d forwards" % (
                model, impl, n, ms / M, rows[-1]["forwards"]), flush=True)
        if not a.no_torch:
            p = (first.w_gate_up, first.w_down, first.s_gate_up, first.s_down)

            def tfwd(i):
                x, idx, w, _ = mbs[i]
                return torch_moe(x, idx, w, *p)

            try:
                ms, peak = timed_schedule(steps, tfwd, lambda i, out: out.backward(mbs[i][3]), params, a.iters, dev)
                rows.append(dict(model=model, tokens=T, depth=a.depth, micro_batches=M, impl="torch", contexts=0,
                                 ms_per_micro_batch=ms / M, forwards=M, peak_bytes=peak))
            except Exception as e:  # an older torch without _grouped_mm or its backward
                print("torch layer failed: %s" % e)
        for _, _, m in runs:
            m.close()
        del runs, first, mbs, params
        comm.close()
        torch.cuda.empty_cache()
    print("\n| model | T | impl | contexts | ms a micro-batch (fwd+bwd) | forwards run | "
          "peak GiB beyond weights (grads, activations) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %s | %s | %.3f | %d of %d | %.2f |" % (
            r["model"], r["tokens"], r["impl"], r["contexts"] or "-", r["ms_per_micro_batch"], r["forwards"],
            r["micro_batches"], r["peak_bytes"] / 2**30))
    if a.json:
        write_json(a.json, dev, rows)


if __name__ == "__main__":
    main()
