#!/usr/bin/env python3
"""PyTorch's side of bench/bench_gpu: the same Llama and the same training step on the same GPU.

  torch_gpu.py [--layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000
                --seq 2048 --global-batch 8 --micro 2 --steps 5 --warmup 2 --modes eager,compile
                --deadline SECONDS]

The model: token embedding, per layer RMSNorm, q/k/v/o projections without bias, rotary
embeddings (theta 10000, rotate-half), causal attention with grouped KV heads through
torch.nn.functional.scaled_dot_product_attention (PyTorch's fused kernels; the plain form before
PyTorch 2.0), RMSNorm, a SwiGLU feed-forward, a final RMSNorm and an untied head; mean cross-entropy. The step: global-batch /
micro micro-batches of forward and backward under bf16 autocast (parameters, gradients and AdamW's
moments fp32: the "fp32 master weights" of the plan), clip_grad_norm_ 1.0, AdamW (lr 3e-4, betas
0.9 and 0.95, eps 1e-8, weight decay 0.1; fused where this PyTorch has it). Tokens are random
(their values do not change the time).

Each mode (eager, then torch.compile of the model when asked and when the deadline leaves time)
prints one JSON line: {"mode", "tokens_per_s", "step_ms", "params"} or {"mode", "error"}. The
warm-up steps (and, for compile, the compilation) are not timed; the timed steps are between two
torch.cuda.synchronize() calls. Never needed to build or test tycho.
"""
import argparse
import json
import math
import sys
import time


def emit(**kw):
    print(json.dumps(kw), flush=True)


def build(torch, a):
    nn, F = torch.nn, torch.nn.functional
    hs = a.dim // a.heads

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(a.dim), RMSNorm(a.dim)
            self.q = nn.Linear(a.dim, a.heads * hs, bias=False)
            self.k = nn.Linear(a.dim, a.kv_heads * hs, bias=False)
            self.v = nn.Linear(a.dim, a.kv_heads * hs, bias=False)
            self.o = nn.Linear(a.heads * hs, a.dim, bias=False)
            self.gate = nn.Linear(a.dim, a.ffn, bias=False)
            self.up = nn.Linear(a.dim, a.ffn, bias=False)
            self.down = nn.Linear(a.ffn, a.dim, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(B, T, a.heads, hs).transpose(1, 2)
            k = self.k(h).view(B, T, a.kv_heads, hs).transpose(1, 2)
            v = self.v(h).view(B, T, a.kv_heads, hs).transpose(1, 2)

            def rope(t):
                t1, t2 = t[..., : hs // 2], t[..., hs // 2:]
                return t * cos + torch.cat((-t2, t1), dim=-1) * sin

            q, k = rope(q), rope(k)
            rep = a.heads // a.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # PyTorch before 2.0: the plain form
                s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                y = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + self.o(y.transpose(1, 2).reshape(B, T, a.dim))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(a.vocab, a.dim)
            self.layers = nn.ModuleList(Block() for _ in range(a.layers))
            self.norm = RMSNorm(a.dim)
            self.head = nn.Linear(a.dim, a.vocab, bias=False)
            inv = 1.0 / (10000.0 ** (torch.arange(0, hs, 2).float() / hs))
            ang = torch.outer(torch.arange(a.seq).float(), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)

        def forward(self, idx, targets):
            x = self.embed(idx)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, a.vocab), targets.view(-1))

    return Llama()


def run_mode(torch, a, mode, started):
    dev = torch.device("cuda")
    torch.manual_seed(1234)
    model = build(torch, a).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1)
    fwd = torch.compile(model) if mode == "compile" else model
    n_micro = a.global_batch // a.micro
    gen = torch.Generator(device=dev).manual_seed(1)

    def step():
        for _ in range(n_micro):
            tok = torch.randint(0, a.vocab, (a.micro, a.seq + 1), device=dev, generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(tok[:, :-1], tok[:, 1:]) / n_micro
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    emit(mode=mode, tokens_per_s=a.global_batch * a.seq / dt, step_ms=1e3 * dt, params=n_params)
    del model, opt, fwd
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("layers", 22), ("dim", 2048), ("heads", 32), ("kv-heads", 4), ("ffn", 5632),
                          ("vocab", 32000), ("seq", 2048), ("global-batch", 8), ("micro", 2),
                          ("steps", 5), ("warmup", 2)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--deadline", type=float, default=math.inf,
                   help="seconds from the start after which no further mode is begun")
    a = p.parse_args()
    started = time.perf_counter()
    modes = [m for m in a.modes.split(",") if m]
    try:
        import torch
    except ImportError as e:
        for m in modes:
            emit(mode=m, error="no PyTorch: %s" % e)
        return 0
    if not torch.cuda.is_available():
        for m in modes:
            emit(mode=m, error="PyTorch sees no CUDA device")
        return 0
    for i, m in enumerate(modes):
        # compile needs its compilation time too: begun only with half the deadline left
        left = a.deadline - (time.perf_counter() - started)
        if i > 0 and left < (a.deadline / 2 if m == "compile" else 10):
            emit(mode=m, error="not run: %.0f s left of the %.0f s deadline" % (left, a.deadline))
            continue
        try:
            run_mode(torch, a, m, started)
        except Exception as e:  # a mode that fails (compile on this machine) is reported, not fatal
            first = str(e).splitlines()[0][:200] if str(e) else ""
            emit(mode=m, error="%s: %s" % (type(e).__name__, first))
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
