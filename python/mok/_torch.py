"""mok for PyTorch: the MoE layer as an autograd function (mok.moe) and a module (mok.MoE).

Rank r of N holds the local experts r*E_l .. r*E_l+E_l-1 (E_l = E/N) and passes its own
tokens; every rank calls every forward and backward, in the same order (they are
collective). Tensors: x [T, H] bf16, topk_idx [T, k] (any integer dtype; -1 = no route),
topk_w [T, k] (float32 or bf16), weights bf16 in the public layout (w_gate, w_up [E_l, I, H],
w_down [E_l, H, I], s_gate, s_up [I_s, H], s_down [H, I_s]), all contiguous on the comm's
GPU. The router, the data-parallel all-reduce of the shared expert's gradients and the
optimizer stay the caller's.
"""

import torch

from . import capi
from .capi import MokError

__all__ = ["moe", "MoE", "comm_from_process_group", "reference_moe", "current_stream_handle"]


def current_stream_handle(device):
    return torch.cuda.current_stream(device).cuda_stream


def comm_from_process_group(group=None, device=None, timeout_ms=0, workspace_bytes=0):
    """A mok.Comm over the ranks of a torch.distributed process group (collective): rank 0 of
    the group makes the NCCL id and broadcasts it. device: this rank's GPU (default: the
    current CUDA device)."""
    import torch.distributed as dist

    if device is None:
        device = torch.cuda.current_device()
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if not (dist.is_available() and dist.is_initialized()):
        return capi.Comm(device.index or 0, timeout_ms=timeout_ms, workspace_bytes=workspace_bytes)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    obj = [capi.get_unique_id() if r == 0 else None]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(obj, src=src, group=group, device=device if dist.get_backend(group) == "nccl" else None)
    return capi.Comm(device.index or 0, num_ranks=n, rank=r, unique_id=obj[0], timeout_ms=timeout_ms,
                     workspace_bytes=workspace_bytes)


def _ptr(t):
    return None if t is None else (t.data_ptr() or None)


def _want(t, name, shape, dtype, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError("mok: %s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    if tuple(t.shape) != tuple(shape):
        raise ValueError("mok: %s has shape %s, expected %s" % (name, tuple(t.shape), tuple(shape)))
    if dtype is not None and t.dtype != dtype:
        raise ValueError("mok: %s is %s, expected %s" % (name, t.dtype, dtype))
    if t.device != device:
        raise ValueError("mok: %s is on %s, the layer's comm is on %s" % (name, t.device, device))
    if not t.is_contiguous():
        raise ValueError("mok: %s must be contiguous" % name)


def _split(layer, fused, weights):
    """(w_gate, w_up, w_down, s_gate, s_up, s_down) views of the weights as passed."""
    if fused:
        wgu, wd, sgu, sd = weights
        return (wgu[0], wgu[1], wd, None if sgu is None else sgu[0], None if sgu is None else sgu[1], sd)
    return tuple(weights)


def _check_weights(layer, fused, weights, device):
    c = layer.config
    El, H, I, Is = layer.local_experts, c.hidden, c.inter, c.shared_inter
    bf = torch.bfloat16
    if fused:
        names, shapes = ("w_gate_up", "w_down", "s_gate_up", "s_down"), ((2, El, I, H), (El, H, I), (2, Is, H), (H, Is))
    else:
        names = ("w_gate", "w_up", "w_down", "s_gate", "s_up", "s_down")
        shapes = ((El, I, H), (El, I, H), (El, H, I), (Is, H), (Is, H), (H, Is))
    if len(weights) != len(names):
        raise ValueError("mok: expected %d weight tensors (%s), got %d" % (len(names), ", ".join(names), len(weights)))
    for t, n, s in zip(weights, names, shapes):
        if n.startswith("s_") and Is == 0:
            if t is not None:
                raise ValueError("mok: %s given but the layer has no shared expert (shared_inter 0)" % n)
            continue
        _want(t, n, s, bf, device)


def _main_grad(p, device):
    """p.main_grad, made as fp32 zeros on first use; checked: fp32, p's shape, contiguous, on the
    layer's device (the backward adds into it in place)."""
    g = getattr(p, "main_grad", None)
    if g is None:
        g = p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=device)
    if g.dtype != torch.float32 or tuple(g.shape) != tuple(p.shape) or not g.is_contiguous() or g.device != device:
        raise ValueError("mok: main_grad of a weight must be a contiguous float32 tensor of its shape on %s, got %s %s%s "
                         "on %s" % (device, g.dtype, tuple(g.shape), "" if g.is_contiguous() else " (not contiguous)",
                                    g.device))
    return g


class _MoEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pool, impl, fused, main_grad, keep, x, topk_idx, topk_w, *weights):
        layer = pool.layers[0]  # (every layer of the pool has the same config)
        c = layer.config
        device = torch.device("cuda", layer.comm.device)
        T = x.shape[0] if x.dim() == 2 else -1
        _want(x, "x", (T, c.hidden), torch.bfloat16, device)
        if T > c.max_tokens:
            raise ValueError("mok: %d tokens, the layer was made for max_tokens=%d" % (T, c.max_tokens))
        if topk_idx.is_floating_point() or topk_idx.dtype == torch.bool:
            raise ValueError("mok: topk_idx must be an integer tensor, got %s" % topk_idx.dtype)
        if topk_w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError("mok: topk_w must be float32, bfloat16 or float16, got %s" % topk_w.dtype)
        idx = topk_idx.to(torch.int32).contiguous()
        w = topk_w.to(torch.float32).contiguous()
        _want(idx, "topk_idx", (T, c.topk), None, device)
        _want(w, "topk_w", (T, c.topk), None, device)
        _check_weights(layer, fused, weights, device)
        out = torch.empty((T, c.hidden), dtype=torch.bfloat16, device=device)
        ptrs = tuple(_ptr(t) for t in _split(layer, fused, weights))
        stream = current_stream_handle(device)
        # the layer that keeps this forward's state for its backward (mok.Contexts)
        layer, stamp = pool.acquire(keep)
        try:
            layer.forward_raw(impl, T, _ptr(x), _ptr(idx), _ptr(w), ptrs, _ptr(out), stream)
        except BaseException:
            pool.release(layer, stamp)
            raise
        ctx.pool, ctx.layer, ctx.stamp, ctx.generation = pool, layer, stamp, layer.generation
        ctx.impl, ctx.fused = impl, fused
        ctx.main_grad = weights if main_grad else None  # the parameters themselves, for .main_grad
        ctx.w_dtype = topk_w.dtype
        ctx.save_for_backward(x, idx, w, *weights)
        return out

    @staticmethod
    def backward(ctx, d_out):
        pool, layer, impl, fused = ctx.pool, ctx.layer, ctx.impl, ctx.fused
        x, idx, w, *weights = ctx.saved_tensors
        c = layer.config
        T, device = x.shape[0], x.device
        stream = current_stream_handle(device)
        ptrs = tuple(_ptr(t) for t in _split(layer, fused, weights))
        layer, ctx.stamp, rerun = pool.for_backward(layer, ctx.stamp, ctx.generation)
        if rerun:
            # The layer ran another forward since this one: run this forward again (on a layer of
            # the pool) so that the backward has its state.
            scratch = torch.empty((T, c.hidden), dtype=torch.bfloat16, device=device)
            try:
                layer.forward_raw(impl, T, _ptr(x), _ptr(idx), _ptr(w), ptrs, _ptr(scratch), stream)
            except BaseException:
                pool.release(layer, ctx.stamp)
                raise
        ctx.layer, ctx.generation = layer, layer.generation
        try:
            if d_out is None:
                d_out = torch.zeros((T, c.hidden), dtype=torch.bfloat16, device=device)
            d_out = d_out.to(torch.bfloat16).contiguous()
            gdt = torch.float32 if c.grad_dtype == "fp32" else torch.bfloat16
            d_x = torch.empty_like(x)
            d_w = torch.empty((T, c.topk), dtype=torch.float32, device=device)
            if ctx.main_grad is not None:
                # fp32 weight gradients summed in place into param.main_grad (made as zeros on first
                # use): the library adds each tile's sums to it (grads.accumulate), no temporary
                grads = [_main_grad(p, device) if p is not None else None for p in ctx.main_grad]
            else:
                grads = [torch.empty(t.shape, dtype=gdt, device=device) if t is not None else None for t in weights]
            gptrs = tuple(_ptr(t) for t in _split(layer, fused, grads))
            layer.backward_raw(impl, T, _ptr(x), _ptr(idx), _ptr(w), ptrs, _ptr(d_out),
                               (_ptr(d_x), _ptr(d_w)) + gptrs, stream, accumulate=ctx.main_grad is not None)
        finally:
            pool.release(layer, ctx.stamp)  # the layer is free for the next forward
            ctx.stamp = 0
        if ctx.main_grad is not None:
            grads = [None] * len(grads)
        return (None, None, None, None, None, d_x, None, d_w.to(ctx.w_dtype)) + tuple(grads)


@torch.compiler.disable  # an opaque call for torch.compile: the graph breaks around it
def moe(layer, x, topk_idx, topk_w, *weights, impl="auto", main_grad=False):
    """out [T, H] = the MoE layer on this rank's tokens, differentiable in x, topk_w and every
    weight. layer: a mok.Layer (one forward's state kept at a time: a backward whose forward is
    not the layer's last runs its forward again) or a mok.Contexts of layers (one forward's
    state each: forwards in flight up to its size keep theirs). weights: (w_gate, w_up,
    w_down, s_gate, s_up, s_down), or the fused form (w_gate_up [2, E_l, I, H], w_down,
    s_gate_up [2, I_s, H], s_down) that mok.MoE keeps (impl "mega" needs W_up right after
    W_gate in memory, which the fused form is). The shared weights are None when the layer
    has none. Weight gradients come in the config's grad_dtype (autograd casts them to the
    weights' dtype); with main_grad=True they are instead summed into each weight's
    ``main_grad`` attribute (made on first use, in grad_dtype: fp32 accumulation across
    micro-batches, as Megatron-LM keeps it) and autograd gets none. Collective."""
    if len(weights) not in (4, 6):
        raise ValueError("mok.moe: pass 6 weights (w_gate, w_up, w_down, s_gate, s_up, s_down) or 4 "
                         "(w_gate_up, w_down, s_gate_up, s_down), got %d" % len(weights))
    if isinstance(layer, capi.Contexts):
        pool = layer
    elif isinstance(layer, capi.Layer):
        pool = getattr(layer, "_contexts", None)
        if pool is None:
            pool = layer._contexts = capi.Contexts([layer])
    else:
        raise TypeError("mok.moe: layer must be a mok.Layer or a mok.Contexts, got %s" % type(layer).__name__)
    # a backward will come: the forward's layer is held for it (mok.Contexts)
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, topk_w) + weights)
    return _MoEFunction.apply(pool, impl, len(weights) == 4, main_grad, keep, x, topk_idx, topk_w, *weights)


class MoE(torch.nn.Module):
    """A mok MoE layer with its weights as parameters: this rank's experts in
    ``w_gate_up`` [2, E_l, I, H] (gate then up, one tensor) and ``w_down`` [E_l, H, I], the
    shared expert in ``s_gate_up`` [2, I_s, H] and ``s_down`` [H, I_s] (absent when I_s = 0).

        layer = mok.MoE("qwen3.5-397b-a17b", max_tokens=8192)       # one GPU
        out = layer(x, topk_idx, topk_w)                           # x [..., H]

    model: a name of mok.models() or None; every config field can be given by keyword
    (num_experts, hidden, inter, topk, shared_inter, swiglu_limit, row_pad). comm: a
    mok.Comm; default: a new one over the default torch.distributed group when one is
    initialised, else this GPU alone (a model of many layers should pass one comm to all). impl: "auto", "mega", "nccl" or "baseline". grad_dtype: "bf16"
    (default: the weights' gradients in .grad, as autograd keeps them) or "fp32": summed in
    fp32 into each parameter's ``main_grad`` (made on the first backward; set it to None or
    zero it between steps; .grad stays None), the way Megatron-LM accumulates gradients.
    contexts: how many forwards keep their state for a backward at once (default 1): a
    pipeline schedule with several micro-batches in flight (1F1B: up to the pipeline's depth)
    sets it to that many, so that no backward runs its forward again; each context holds its
    forward's rows (mok.Contexts; the comm's scratch is shared)."""

    def __init__(self, model=None, *, max_tokens, comm=None, device=None, impl="auto", init_std=None,
                 grad_dtype="bf16", contexts=1, **fields):
        super().__init__()
        if device is None:
            device = torch.device("cuda", comm.device if comm is not None else torch.cuda.current_device())
        device = torch.device(device)
        if comm is None:
            comm = comm_from_process_group(device=device)
        if device.index != comm.device:
            raise ValueError("mok.MoE: device %s but the comm is on cuda:%d" % (device, comm.device))
        if grad_dtype not in ("bf16", "fp32"):
            raise ValueError("mok.MoE: grad_dtype %r: bf16 (into .grad) or fp32 (into .main_grad)" % (grad_dtype,))
        if isinstance(contexts, bool) or not isinstance(contexts, int) or not 1 <= contexts <= 64:
            raise ValueError("mok.MoE: contexts %r: the forwards in flight, an int from 1 to 64" % (contexts,))
        cfg = capi.Config(model, max_tokens=max_tokens, grad_dtype=grad_dtype, **fields)
        layers = []
        try:
            for _ in range(contexts):  # (collective, each: every rank makes as many)
                layers.append(capi.Layer(cfg, comm))
        except BaseException:
            for l in layers:
                l.close()
            raise
        self.contexts = capi.Contexts(layers)
        self.layer = layers[0]
        self.comm, self.impl = comm, impl
        c = self.layer.config
        El, H, I, Is = self.layer.local_experts, c.hidden, c.inter, c.shared_inter
        # plain ints for forward (torch.compile traces it up to the opaque mok.moe call)
        self._hidden, self._topk, self._main_grad = H, c.topk, c.grad_dtype == "fp32"
        kw = dict(dtype=torch.bfloat16, device=device)
        self.w_gate_up = torch.nn.Parameter(torch.empty((2, El, I, H), **kw))
        self.w_down = torch.nn.Parameter(torch.empty((El, H, I), **kw))
        if Is:
            self.s_gate_up = torch.nn.Parameter(torch.empty((2, Is, H), **kw))
            self.s_down = torch.nn.Parameter(torch.empty((H, Is), **kw))
        else:
            self.s_gate_up = self.s_down = None
        self.init_std = init_std
        self.reset_parameters()

    @property
    def config(self):
        return self.layer.config

    def memory_info(self):
        """(layer_bytes, comm_scratch_bytes) of device memory held now (mok.Layer.memory_info;
        layer_bytes summed over the contexts)."""
        info = [l.memory_info() for l in self.contexts.layers]
        return sum(own for own, _ in info), info[0][1]

    def reserve(self, num_tokens):
        """Grow the device memory now for passes of up to num_tokens tokens under any routing
        (mok.Layer.reserve, every context: before capturing a CUDA graph), on the current stream."""
        for l in self.contexts.layers:
            l.reserve(num_tokens, current_stream_handle(torch.device("cuda", self.comm.device)))

    def trim(self):
        """Frees the device memory the module's passes hold between them: the saved rows of its
        contexts that no backward waits for, and the comm's scratch (mok.Layer.trim, on the
        current stream; the next pass allocates again). For the memory to serve other work
        between steps, e.g. an optimizer step; with the device pool's default release threshold
        it returns to the driver at the stream's next synchronisation."""
        stream = current_stream_handle(torch.device("cuda", self.comm.device))
        for l in self.contexts.free():
            l.trim(saved=True, scratch=False, stream=stream)
        self.layer.trim(saved=False, scratch=True, stream=stream)

    def set_recv_capacity(self, routes):
        """Collective. impl "mega" at N > 1: the most routes this rank receives in a forward, so that
        no pass waits on the host (mok.Layer.set_recv_capacity, every context); 0 = read on the host
        each forward."""
        for l in self.contexts.layers:
            l.set_recv_capacity(routes)

    def close(self):
        """Collective. Frees the device memory of the module's layers (mok.Layer.close), not its comm."""
        for l in self.contexts.layers:
            l.close()

    def reset_parameters(self):
        c = self.layer.config
        with torch.no_grad():
            for p, fan_in in ((self.w_gate_up, c.hidden), (self.w_down, c.inter), (self.s_gate_up, c.hidden),
                              (self.s_down, c.shared_inter)):
                if p is not None:
                    p.normal_(0.0, self.init_std if self.init_std is not None else fan_in ** -0.5)

    def forward(self, x, topk_idx, topk_w):
        """out [..., H] bf16 for x [..., H]: bf16, or float32 / float16 (an RMSNorm's output under
        torch.autocast) cast to bf16 first (its gradient comes back in x's dtype)."""
        H, k = self._hidden, self._topk
        lead = x.shape[:-1]
        if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float16):
            x = x.to(torch.bfloat16)
        out = moe(self.contexts, x.reshape(-1, H), topk_idx.reshape(-1, k), topk_w.reshape(-1, k), self.w_gate_up,
                  self.w_down, self.s_gate_up, self.s_down, impl=self.impl, main_grad=self._main_grad)
        return out.reshape(*lead, H)

    def extra_repr(self):
        c = self.layer.config
        return "E=%d (local %d), H=%d, I=%d, k=%d, I_s=%d, ranks=%d, max_tokens=%d, impl=%s, contexts=%d" % (
            c.num_experts, self.layer.local_experts, c.hidden, c.inter, c.topk, c.shared_inter, c.num_ranks,
            c.max_tokens, self.impl, len(self.contexts))


def reference_moe(x, topk_idx, topk_w, w_gate, w_up, w_down, s_gate=None, s_up=None, s_down=None, swiglu_limit=0.0,
                  dtype=torch.float64, round_bf16=True):
    """The layer in plain PyTorch on one rank holding every expert (N = 1), differentiable:
    computed in `dtype` with mok's bf16 rounding points when round_bf16 (g, u, a, each
    expert's y, the shared output, out); the clamp (swiglu_limit) is decided on the unrounded
    g and u, as mok decides it. For tests and cross-checks, not for speed."""

    def bf(t):
        return t.to(torch.bfloat16).to(dtype) if round_bf16 else t

    def ffn(xr, wg, wu, wd):
        g, u = xr @ wg.to(dtype).t(), xr @ wu.to(dtype).t()
        if swiglu_limit > 0:  # on the unrounded values, as mok: a value that rounds to L is not cut
            g = torch.clamp(g, max=swiglu_limit)
            u = torch.clamp(u, -swiglu_limit, swiglu_limit)
        g, u = bf(g), bf(u)
        a = bf(torch.nn.functional.silu(g) * u)
        return bf(a @ wd.to(dtype).t())

    xd = x.to(dtype)
    T, k = topk_idx.shape
    acc = ffn(xd, s_gate, s_up, s_down) if s_gate is not None else torch.zeros((T, x.shape[1]), dtype=dtype,
                                                                                device=x.device)
    wd = topk_w.to(dtype)
    for j in range(k):
        col = topk_idx[:, j]
        contrib = torch.zeros_like(acc)
        for e in torch.unique(col).tolist():
            if e < 0:
                continue
            rows = (col == e).nonzero(as_tuple=True)[0]
            y = ffn(xd[rows], w_gate[e], w_up[e], w_down[e])
            contrib = contrib.index_add(0, rows, wd[rows, j:j + 1] * y)
        acc = acc + contrib
    return bf(acc)
