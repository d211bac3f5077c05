"""A training loop with mok.MoE: a router, two MoE layers with residuals, AdamW, gradient
accumulation over micro-batches in a 1F1B-like order (contexts), mok.MoE.trim before each
optimizer step. Learns a fixed random target on one GPU; exits 1 if the loss did not fall.

    python3 python/examples/train_moe.py [--model NAME | (default: a small layer)]
                                         [--impl mega|auto|nccl|baseline] [--steps 30]
                                         [--micro-batches 4] [--depth 2] [--tokens 256]

What it shows: mok.MoE takes x [tokens, H] (bf16, or float32 under autocast), the router's
top-k expert ids and weights (their gradient flows back into the router), and gives every
weight gradient through autograd; contexts=depth keeps the forwards in flight of a pipeline
order without running any again; trim() frees the layers' rows between steps.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import mok  # noqa: E402

SMALL = dict(num_experts=16, hidden=256, inter=128, topk=4, shared_inter=128)


class Block(torch.nn.Module):
    """x + MoE(norm(x)), routed by a linear router with softmax top-k."""

    def __init__(self, moe_kw, comm):
        super().__init__()
        self.moe = mok.MoE(comm=comm, **moe_kw)
        H, E = self.moe.config.hidden, self.moe.config.num_experts
        self.norm = torch.nn.RMSNorm(H, device=self.moe.w_down.device)
        self.router = torch.nn.Linear(H, E, bias=False, device=self.moe.w_down.device)
        self.k = self.moe.config.topk

    def forward(self, x):
        h = self.norm(x.float())
        w, idx = torch.topk(torch.softmax(self.router(h), dim=-1), self.k, dim=-1)
        return x + self.moe(h, idx, w)  # (h is float32: mok.MoE casts it to bf16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a mok model name (default: a small layer)")
    ap.add_argument("--impl", default="auto")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--depth", type=int, default=2, help="forwards in flight (the layers' contexts)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens a micro-batch")
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda", torch.cuda.current_device())
    kw = dict(max_tokens=a.tokens, impl=a.impl, contexts=a.depth, init_std=0.02)
    kw.update(dict(model=a.model) if a.model else SMALL)
    comm = mok.Comm(dev.index)  # (under torchrun: mok.comm_from_process_group(), one comm for every layer)
    blocks = torch.nn.ModuleList([Block(kw, comm) for _ in range(2)])
    H = blocks[0].moe.config.hidden
    head = torch.nn.Linear(H, H, device=dev)
    params = list(blocks.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr)
    gen = torch.Generator(device=dev).manual_seed(1)
    data = [(torch.randn((a.tokens, H), generator=gen, device=dev).to(torch.bfloat16),
             torch.randn((a.tokens, H), generator=gen, device=dev)) for _ in range(a.micro_batches)]

    def model(x):
        for b in blocks:
            x = b(x)
        return head(x.float())

    losses = []
    for step in range(a.steps):
        opt.zero_grad(set_to_none=True)
        pending, total = [], 0.0
        for i, (x, y) in enumerate(data):  # up to `depth` forwards in flight, then one backward each
            loss = torch.nn.functional.mse_loss(model(x), y) / len(data)
            pending.append(loss)
            if len(pending) == a.depth or i == len(data) - 1:
                while pending:
                    l = pending.pop(0)
                    l.backward()
                    total += l.item()
        for b in blocks:
            b.moe.trim()  # (the rows the passes held: free for the optimizer step)
        opt.step()
        losses.append(total)
        if step % 10 == 0 or step == a.steps - 1:
            print("step %3d  loss %.5f" % (step, total), flush=True)
    for b in blocks:
        b.moe.close()
    comm.close()
    ok = losses[-1] < 0.9 * losses[0]
    print("loss %.5f -> %.5f: %s" % (losses[0], losses[-1], "fell" if ok else "did not fall"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
