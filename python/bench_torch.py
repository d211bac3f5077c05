"""mok's PyTorch module beside the MoE layer PyTorch users write today, in one process on one GPU.

    python3 python/bench_torch.py [--models qwen3.5-397b-a17b,glm-5.2] [--tokens 2048,8192]
                                  [--impls mega,auto] [--routing uniform|zipf:1.2] [--iters 20]
                                  [--grad-dtype bf16|fp32] [--json FILE]

Every local expert on this GPU (EP1). Times are the median of --iters CUDA-event timings of
forward and of forward+backward (d_x, d_topk_w and every weight gradient), after warm-up.
"torch" is the layer in plain PyTorch (bf16): a stable sort of the routes by expert,
torch._grouped_mm for gate, up and down (no host sync), SwiGLU, the router weight, an fp32
index_add combine and the shared expert by matmuls, differentiated by autograd; it runs on
the same weights, and its output is compared with mok's (rel L2, printed).
--grad-dtype fp32: the weight gradients summed in fp32 into each parameter's main_grad over
the timed calls (micro-batches, as Megatron-LM keeps them): mok adds them in place
(grad_dtype="fp32"); the plain-PyTorch layer's bf16 .grad is added by main_grad.add_ after
each backward (Megatron-LM without its fused accumulation).
Memory of one forward with autograd (columns "kept GiB", "transient GiB"): what stays allocated
from the forward to its backward (PyTorch's allocations: the output and the saved tensors; for
mok also the layer's own block of saved rows), and the peak beyond it during the forward (for
mok: its comm's scratch block, which every layer on the comm shares).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mok  # noqa: E402


def torch_moe(x, idx, w, wgu, wd, sgu, sd):
    T, k = idx.shape
    E = wgu.shape[1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    tok = order // k
    xs = x[tok]
    g = torch._grouped_mm(xs, wgu[0].transpose(1, 2), offs=offs)
    u = torch._grouped_mm(xs, wgu[1].transpose(1, 2), offs=offs)
    y = torch._grouped_mm(F.silu(g) * u, wd.transpose(1, 2), offs=offs)
    y = y.float() * w.reshape(-1)[order].unsqueeze(1).float()
    out = torch.zeros((T, x.shape[1]), dtype=torch.float32, device=x.device).index_add(0, tok, y)
    if sgu is not None:
        out = out + ((F.silu(x @ sgu[0].t()) * (x @ sgu[1].t())) @ sd.t()).float()
    return out.to(torch.bfloat16)


def routing(T, E, k, spec, gen, dev):
    if spec == "uniform":
        idx = torch.rand((T, E), generator=gen, device=dev).argsort(dim=1)[:, :k]
    elif spec.startswith("zipf:"):
        s = float(spec[5:])
        p = torch.tensor([1.0 / (i + 1) ** s for i in range(E)], device=dev)
        p = p[torch.randperm(E, generator=gen, device=dev)]
        idx = torch.multinomial(p.expand(T, E), k, replacement=False, generator=gen)
    else:
        raise SystemExit("--routing %r: uniform or zipf:S" % spec)
    w = torch.softmax(torch.randn((T, k), generator=gen, device=dev), dim=1)
    return idx, w


def write_json(path, dev, rows):
    """The rows with the date and the GPU's name (--json)."""
    with open(path, "w") as f:
        json.dump(dict(date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name(dev), rows=rows), f, indent=1)


def timed(fn, iters, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def held_memory(fwd, layer, dev):
    """(kept, transient) bytes of one forward with autograd (see the docstring above)."""
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    out = fwd()
    torch.cuda.synchronize(dev)
    kept = torch.cuda.memory_allocated(dev) - before
    peak = max(torch.cuda.max_memory_allocated(dev) - before - kept, 0)
    del out
    if layer is not None:
        own, scratch = layer.memory_info()
        kept, peak = kept + own, peak + scratch
    return kept, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3.5-397b-a17b,glm-5.2")
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--impls", default="mega,auto")
    ap.add_argument("--routing", default="uniform")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-torch", action="store_true", help="skip the plain-PyTorch layer")
    ap.add_argument("--grad-dtype", default="bf16", choices=("bf16", "fp32"),
                    help="fp32: weight gradients summed into main_grad (see above)")
    a = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    print("mok %d, torch %s, %s, routing %s, weight gradients %s, median of %d" % (
        mok.version(), torch.__version__, torch.cuda.get_device_name(dev), a.routing, a.grad_dtype, a.iters))
    for model in a.models.split(","):
        tokens = [int(t) for t in a.tokens.split(",")]
        comm = mok.Comm(dev.index)
        impls = a.impls.split(",")
        mods = {}
        for impl in impls:
            m = mok.MoE(model, max_tokens=max(tokens), comm=comm, impl=impl, init_std=0.02, grad_dtype=a.grad_dtype)
            if mods:  # one set of weights for every impl: share the first module's parameters
                first = next(iter(mods.values()))
                m.w_gate_up, m.w_down, m.s_gate_up, m.s_down = first.w_gate_up, first.w_down, first.s_gate_up, first.s_down
            mods[impl] = m
        base = next(iter(mods.values()))
        c = base.config
        for T in tokens:
            gen = torch.Generator(device=dev).manual_seed(1000 + T)
            idx, w = routing(T, c.num_experts, c.topk, a.routing, gen, dev)
            x = (torch.randn((T, c.hidden), generator=gen, device=dev)).to(torch.bfloat16)
            d = (torch.randn((T, c.hidden), generator=gen, device=dev) * 0.01).to(torch.bfloat16)
            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
            res = {}
            ref_out = None
            for impl, m in mods.items():
                def fwd(m=m):
                    with torch.no_grad():
                        return m(x, idx, w)

                def fwdbwd(m=m):
                    for p in m.parameters():
                        p.grad = None  # (fp32: main_grad keeps summing, as over micro-batches)
                    m(xg, idx, wg).backward(d)

                out = fwd()
                ref_out = out if ref_out is None else ref_out
                res[impl] = (timed(fwd, a.iters), timed(fwdbwd, a.iters), out,
                             held_memory(lambda m=m: m(xg, idx, wg), m.layer, dev))
            if not a.no_torch:
                p = (base.w_gate_up, base.w_down, base.s_gate_up, base.s_down)

                def tfwd():
                    with torch.no_grad():
                        return torch_moe(x, idx, w, *p)

                def tfwdbwd():
                    for q in base.parameters():
                        q.grad = None
                    torch_moe(xg, idx, wg, *p).backward(d)
                    if a.grad_dtype == "fp32":  # Megatron-LM's unfused accumulation: main_grad += grad
                        for q in base.parameters():
                            if getattr(q, "torch_main_grad", None) is None:
                                q.torch_main_grad = torch.zeros(q.shape, dtype=torch.float32, device=dev)
                            q.torch_main_grad.add_(q.grad)

                try:
                    out = tfwd()
                    res["torch"] = (timed(tfwd, a.iters), timed(tfwdbwd, a.iters), out,
                                    held_memory(lambda: torch_moe(xg, idx, wg, *p), None, dev))
                except Exception as e:  # an older torch without _grouped_mm or its backward
                    print("torch layer failed: %s" % e)
            for name, (f, fb, out, (kept, peak)) in res.items():
                err = ((out.double() - ref_out.double()).norm() / ref_out.double().norm()).item()
                rows.append(dict(model=model, tokens=T, impl=name, fwd_ms=f, fwd_bwd_ms=fb, rel_l2_vs_first=err,
                                 routing=a.routing, grad_dtype=a.grad_dtype, kept_bytes=kept, transient_bytes=peak))
            torch.cuda.empty_cache()
        for m in mods.values():
            m.layer.close()
        del mods, base
        comm.close()
        torch.cuda.empty_cache()
    print("\n| model | T | impl | fwd ms | fwd+bwd ms | vs torch fwd | vs torch fwd+bwd | out rel L2 vs %s | kept GiB | "
          "transient GiB |" % a.impls.split(",")[0])
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = [q for q in rows if q["model"] == r["model"] and q["tokens"] == r["tokens"] and q["impl"] == "torch"]
        sf = "%.2fx" % (t[0]["fwd_ms"] / r["fwd_ms"]) if t else "-"
        sb = "%.2fx" % (t[0]["fwd_bwd_ms"] / r["fwd_bwd_ms"]) if t else "-"
        print("| %s | %d | %s | %.3f | %.3f | %s | %s | %.2e | %.2f | %.2f |" % (
            r["model"], r["tokens"], r["impl"], r["fwd_ms"], r["fwd_bwd_ms"], sf, sb, r["rel_l2_vs_first"],
            r["kept_bytes"] / 2**30, r["transient_bytes"] / 2**30))
    if a.json:
        write_json(a.json, dev, rows)


if __name__ == "__main__":
    main()
