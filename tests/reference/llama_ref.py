#!/usr/bin/python3
"""An independent PyTorch reference for tycho's single-rank training semantics.

Writes golden files into the folder given (default tests/golden/):
  llama_ref_init.safetensors    initial weights (Hugging Face Llama names, F32)
  llama_ref_tokens.bin          token file in llm.c format (magic 20240520, version 1)
  llama_ref_final.safetensors   weights after the run
  llama_ref.json                per-step loss, pre-clip gradient norm and learning rate

The model is written here from the Hugging Face LlamaForCausalLM equations (RMSNorm,
rotate-half RoPE, grouped-query causal attention, SwiGLU, untied head), not imported, so the
comparison is against an implementation that shares no code with tycho. The optimizer is
torch.optim.AdamW with decay on 2-D tensors only, torch.nn.utils.clip_grad_norm_, and the
warm-up + cosine schedule of the plan. Data windows follow tycho's unshuffled contract:
window w = step * global + k starts at token (w * seq) mod (n_tokens - seq - 1).

Run with Debian's python3 and python3-torch (1.13):  /usr/bin/python3 tests/reference/llama_ref.py
The C test tests/unit/test_reference_torch.c reads these files; Python is never needed to build
or test tycho.
"""
import json
import math
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)  # the reference runs in float64; tycho runs fp32

CONFIG = dict(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab=64, max_seq=16,
              norm_eps=1e-5, rope_theta=10000.0)
GLOBAL, SEQ, STEPS = 4, 16, 8
OPT = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
SCHED = dict(warmup=3, decay_steps=8, min_lr=1e-3)
N_TOKENS = 3000


def write_safetensors(path, tensors):
    """tensors: list of (name, float tensor); written as F32 in the order given."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors:
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def names(cfg):
    out = ["model.embed_tokens.weight"]
    for l in range(cfg["n_layers"]):
        p = f"model.layers.{l}."
        out += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                p + "mlp.down_proj.weight", p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    return out + ["model.norm.weight", "lm_head.weight"]


def shapes(cfg):
    C, F, V = cfg["dim"], cfg["ffn_dim"], cfg["vocab"]
    HS = C // cfg["n_heads"]
    KV = cfg["n_kv_heads"] * HS
    per = {"q_proj": (C, C), "k_proj": (KV, C), "v_proj": (KV, C), "o_proj": (C, C), "gate_proj": (F, C),
           "up_proj": (F, C), "down_proj": (C, F), "layernorm": (C,)}
    out = {}
    for n in names(cfg):
        if n == "model.embed_tokens.weight" or n == "lm_head.weight":
            out[n] = (V, C)
        elif n == "model.norm.weight":
            out[n] = (C,)
        else:
            out[n] = next(v for k, v in per.items() if k in n)
    return out


def rmsnorm(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rope(x, theta):  # x (B, T, H, HS), rotate-half pairs (i, i + HS/2)
    B, T, H, HS = x.shape
    inv = theta ** (-torch.arange(0, HS // 2, dtype=torch.float64) * 2 / HS)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    x1, x2 = x[..., : HS // 2], x[..., HS // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def forward(P, cfg, tokens, targets):
    B, T = tokens.shape
    C, NH, NKV = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"]
    HS = C // NH
    x = P["model.embed_tokens.weight"][tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(cfg["n_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], cfg["norm_eps"])
        q = (h @ P[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HS)
        k = (h @ P[p + "self_attn.k_proj.weight"].T).view(B, T, NKV, HS)
        v = (h @ P[p + "self_attn.v_proj.weight"].T).view(B, T, NKV, HS)
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        att = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / math.sqrt(HS) + mask
        y = att.softmax(-1) @ v.transpose(1, 2)
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + y @ P[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], cfg["norm_eps"])
        g = h @ P[p + "mlp.gate_proj.weight"].T
        u = h @ P[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ P[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, P["model.norm.weight"], cfg["norm_eps"])
    logits = x @ P["lm_head.weight"].T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(s):
    lr, warm, decay, min_lr = OPT["lr"], SCHED["warmup"], SCHED["decay_steps"], SCHED["min_lr"]
    if s < warm:
        return lr * (s + 1) / warm
    if s >= decay:
        return min_lr
    return min_lr + 0.5 * (1 + math.cos(math.pi * (s - warm) / (decay - warm))) * (lr - min_lr)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "golden")
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(20240520)
    sh = shapes(CONFIG)
    P = {}
    for n in names(CONFIG):
        if n.endswith("norm.weight") or "layernorm" in n:
            t = 1.0 + 0.1 * torch.randn(sh[n], generator=gen)
        else:
            t = 0.08 * torch.randn(sh[n], generator=gen)
        P[n] = t.to(torch.float32).to(torch.float64).requires_grad_(True)  # fp32-representable start
    write_safetensors(os.path.join(out, "llama_ref_init.safetensors"), [(n, P[n]) for n in names(CONFIG)])

    tokens = torch.randint(0, CONFIG["vocab"], (N_TOKENS,), generator=gen)
    with open(os.path.join(out, "llama_ref_tokens.bin"), "wb") as f:
        header = [0] * 256
        header[0], header[1], header[2] = 20240520, 1, N_TOKENS
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{N_TOKENS}H", *tokens.tolist()))

    decay = [P[n] for n in names(CONFIG) if P[n].dim() == 2]
    no_decay = [P[n] for n in names(CONFIG) if P[n].dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    records = []
    for step in range(STEPS):
        xs, ys = [], []
        for k in range(GLOBAL):
            w = step * GLOBAL + k
            o = (w * SEQ) % (N_TOKENS - SEQ - 1)
            xs.append(tokens[o:o + SEQ])
            ys.append(tokens[o + 1:o + SEQ + 1])
        loss = forward(P, CONFIG, torch.stack(xs), torch.stack(ys))
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([P[n] for n in names(CONFIG)], OPT["grad_clip"])
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        records.append({"step": step, "loss": loss.item(), "grad_norm": norm.item(), "lr": lr})
        print(f"step {step} loss {loss.item():.8f} grad_norm {norm.item():.6f} lr {lr:.6g}")
    write_safetensors(os.path.join(out, "llama_ref_final.safetensors"), [(n, P[n]) for n in names(CONFIG)])
    with open(os.path.join(out, "llama_ref.json"), "w") as f:
        json.dump({"config": CONFIG, "global": GLOBAL, "seq": SEQ, "steps": STEPS, "optimizer": OPT,
                   "lr_schedule": SCHED, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
