#!/usr/bin/python3
"""An independent PyTorch reference for tycho's mixture-of-experts training semantics (docs/moe.md).

Writes golden files into the folder given (default tests/golden/):
  moe_ref_init.safetensors           initial weights (Hugging Face Mixtral names for the sparse
                                     layers, Llama names elsewhere; F32)
  moe_ref_tokens.bin                 token file in llm.c format (magic 20240520, version 1)
  moe_ref_final.safetensors          weights after 8 steps at capacity_factor 1 (tokens drop)
  moe_ref.json                       per step: loss (cross-entropy only), pre-clip gradient norm of
                                     the whole objective, lr, aux = Σ_layers mean_sequences aux,
                                     z = Σ_layers mean_tokens logsumexp², and per sparse layer the
                                     assignments routed to / kept by each expert
  moe_ref_dropless_final.safetensors the same run with capacity_factor 0 (dropless)
  moe_ref_dropless.json
The plans tests/golden/moe_ref_plan.lua and moe_ref_dropless_plan.lua reproduce the two runs.

The sparse MLP is written here from the contract's equations, not from tycho's code: router
logits = n2·Wgᵀ, p = softmax, the top-k of p (ties to the lower index, by a stable sort), weights
p[topk]/Σ p[topk]; every expert is evaluated on every token and its SwiGLU output is added with
the weight of each kept assignment, so nothing here dispatches or gathers rows as tycho does.
Capacity (capacity_factor > 0): within each sequence, expert e keeps at most
min(T, ceil(cf·T·K/E)) assignments, the sequence's first choices in token order first, then its
second choices; a dropped assignment adds nothing and the rest are not renormalised. The
load-balancing loss of a sequence is E·Σ_e f_e·P_e with f (the routed fractions, before dropping)
held constant; the router z-loss is the mean over tokens of logsumexp(logits)². The objective is
CE + aux_loss·Σ_layers mean_sequences aux + z_loss·Σ_layers mean_tokens lse², over the whole
global batch (tycho accumulates it over micro-batches; here the batch is one tensor).

RMSNorm, RoPE, the safetensors writer, the optimizer settings and the learning-rate schedule are
those of tests/reference/llama_ref.py (imported), so the dense parts are the dense reference's.

Run with Debian's python3 and python3-torch (1.13):  /usr/bin/python3 tests/reference/moe_ref.py
Prints per step the loss, the dropped assignments and the smallest gap between the probabilities
that decide the routing (a gap near fp32 rounding would let tycho's fp32 run route differently).
The C test tests/unit/test_reference_moe.c reads these files; Python is never needed to build or
test tycho.
"""
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import OPT, SCHED, lr_at, rmsnorm, rope, write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)

CONFIG = dict(n_layers=3, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab=64, max_seq=16,
              norm_eps=1e-5, rope_theta=10000.0)
SPARSE = [1, 2]  # layer 0 stays dense
MOE = dict(experts=4, top_k=2, ffn_dim=24, aux_loss=0.01, z_loss=1e-3)
CASES = [("moe_ref", 1.0), ("moe_ref_dropless", 0.0)]  # (file stem, capacity_factor)
GLOBAL, MICRO, SEQ, STEPS = 4, 2, 16, 8
N_TOKENS = 3000
SEED = 20240531  # of the seeds tried, one whose routing a 1e-5 perturbation leaves alone
ROUTER_STD = 0.3  # router logits of std ~1.7: probabilities apart, the softmax not saturated


def names(cfg):
    out = ["model.embed_tokens.weight"]
    for l in range(cfg["n_layers"]):
        p = f"model.layers.{l}."
        out += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                p + "self_attn.o_proj.weight"]
        if l in SPARSE:
            out.append(p + "block_sparse_moe.gate.weight")
            for j in range(MOE["experts"]):
                out += [p + f"block_sparse_moe.experts.{j}.{w}.weight" for w in ("w1", "w2", "w3")]
        else:
            out += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
        out += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    return out + ["model.norm.weight", "lm_head.weight"]


def shape(cfg, n):
    C, F, V, Fe, E = cfg["dim"], cfg["ffn_dim"], cfg["vocab"], MOE["ffn_dim"], MOE["experts"]
    KV = cfg["n_kv_heads"] * (C // cfg["n_heads"])
    if n in ("model.embed_tokens.weight", "lm_head.weight"):
        return (V, C)
    table = [("norm.weight", (C,)), ("layernorm", (C,)), ("q_proj", (C, C)), ("k_proj", (KV, C)),
             ("v_proj", (KV, C)), ("o_proj", (C, C)), ("gate_proj", (F, C)), ("up_proj", (F, C)),
             ("down_proj", (C, F)), ("gate.weight", (E, C)), (".w1.", (Fe, C)), (".w3.", (Fe, C)),
             (".w2.", (C, Fe))]
    return next(s for k, s in table if k in n)


def attention(P, p, cfg, x, mask):
    B, T, C = x.shape
    NH, NKV = cfg["n_heads"], cfg["n_kv_heads"]
    HS = C // NH
    h = rmsnorm(x, P[p + "input_layernorm.weight"], cfg["norm_eps"])
    q = rope((h @ P[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HS), cfg["rope_theta"])
    k = rope((h @ P[p + "self_attn.k_proj.weight"].T).view(B, T, NKV, HS), cfg["rope_theta"])
    v = (h @ P[p + "self_attn.v_proj.weight"].T).view(B, T, NKV, HS)
    k = k.repeat_interleave(NH // NKV, dim=2).transpose(1, 2)
    v = v.repeat_interleave(NH // NKV, dim=2).transpose(1, 2)
    att = (q.transpose(1, 2) @ k.transpose(-1, -2)) / math.sqrt(HS) + mask
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    return x + y @ P[p + "self_attn.o_proj.weight"].T


def swiglu(h, gate, up, down):
    return (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ down.T


def capacity_keep(topi, E, cap):
    """keep (B, T, K) bool: which assignments survive a capacity of cap per expert and sequence
    (cap 0: all), taken in the order: first choices by token, then second choices by token."""
    B, T, K = topi.shape
    keep = torch.ones(B, T, K, dtype=torch.bool)
    if cap == 0:
        return keep
    for b in range(B):
        used = [0] * E
        for k in range(K):
            for t in range(T):
                e = int(topi[b, t, k])
                keep[b, t, k] = used[e] < cap
                used[e] += 1
    return keep


def sparse_mlp(P, p, h, cap, info):
    """The sparse MLP on h = rmsnorm(mid) (B, T, C): its output, mean_s aux and mean_t lse²."""
    E, K = MOE["experts"], MOE["top_k"]
    logits = h @ P[p + "block_sparse_moe.gate.weight"].T  # (B, T, E)
    probs = logits.softmax(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # ties: lower index first
    topi, topp = order[..., :K], sorted_p[..., :K]
    w = topp / topp.sum(-1, keepdim=True)
    keep = capacity_keep(topi, E, cap)
    out = torch.zeros_like(h)
    for e in range(E):
        q = p + f"block_sparse_moe.experts.{e}."
        coef = (w * ((topi == e) & keep)).sum(-1, keepdim=True)  # (B, T, 1): 0 where not kept
        out = out + coef * swiglu(h, P[q + "w1.weight"], P[q + "w3.weight"], P[q + "w2.weight"])
    routed = torch.nn.functional.one_hot(topi, E).sum(-2)  # (B, T, E), before dropping
    f = routed.to(torch.float64).mean(1).detach()  # (B, E): a count, no gradient
    aux = E * (f * probs.mean(1)).sum(-1)  # (B,)
    z = torch.logsumexp(logits, -1).pow(2).mean()
    kept = torch.nn.functional.one_hot(topi, E) * keep[..., None]
    info["routed"].append(routed.sum((0, 1)).tolist())
    info["kept"].append(kept.sum((0, 1, 2)).tolist())
    info["dropped"] += int((~keep).sum())
    info["decisions"].append(torch.cat([kept.sum(-2), routed], -1))  # (B, T, 2E): kept, routed
    # logit gaps (fp32 errs in logits, not in probabilities): between chosen ranks (the priority
    # under capacity) and at the cut between the K-th choice and the next
    gaps = [float((sorted_p[..., k] / sorted_p[..., k + 1]).log().min()) for k in range(K)]
    info["order_gap"] = min([info["order_gap"]] + gaps[:-1])
    info["cut_gap"] = min(info["cut_gap"], gaps[-1])
    return out, aux.mean(), z


def forward(P, cfg, tokens, targets, cap, info):
    """(cross-entropy, Σ_layers mean_s aux, Σ_layers mean_t lse²) of the batch."""
    T = tokens.shape[1]
    x = P["model.embed_tokens.weight"][tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    aux_sum, z_sum = 0.0, 0.0
    for l in range(cfg["n_layers"]):
        p = f"model.layers.{l}."
        x = attention(P, p, cfg, x, mask)
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], cfg["norm_eps"])
        if l in SPARSE:
            y, aux, z = sparse_mlp(P, p, h, cap, info)
            aux_sum, z_sum = aux_sum + aux, z_sum + z
        else:
            y = swiglu(h, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"], P[p + "mlp.down_proj.weight"])
        x = x + y
    x = rmsnorm(x, P["model.norm.weight"], cfg["norm_eps"])
    logits = x @ P["lm_head.weight"].T
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return ce, aux_sum, z_sum


def init_weights(gen):
    P = {}
    for n in names(CONFIG):
        if n.endswith("norm.weight") or "layernorm" in n:
            t = 1.0 + 0.1 * torch.randn(shape(CONFIG, n), generator=gen)
        elif "block_sparse_moe.gate" in n:
            t = ROUTER_STD * torch.randn(shape(CONFIG, n), generator=gen)
        else:
            t = 0.08 * torch.randn(shape(CONFIG, n), generator=gen)
        P[n] = t.to(torch.float32).to(torch.float64)  # fp32-representable start
    return P


def train(P0, tokens, cf):
    P = {n: t.clone().requires_grad_(True) for n, t in P0.items()}
    cap = 0 if cf <= 0 else min(SEQ, math.ceil(cf * SEQ * MOE["top_k"] / MOE["experts"]))
    decay = [P[n] for n in names(CONFIG) if P[n].dim() == 2]
    no_decay = [P[n] for n in names(CONFIG) if P[n].dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    records, decisions = [], []
    for step in range(STEPS):
        xs, ys = [], []
        for k in range(GLOBAL):
            o = ((step * GLOBAL + k) * SEQ) % (N_TOKENS - SEQ - 1)
            xs.append(tokens[o:o + SEQ])
            ys.append(tokens[o + 1:o + SEQ + 1])
        info = {"routed": [], "kept": [], "dropped": 0, "order_gap": math.inf, "cut_gap": math.inf,
                "decisions": []}
        ce, aux, z = forward(P, CONFIG, torch.stack(xs), torch.stack(ys), cap, info)
        opt.zero_grad()
        (ce + MOE["aux_loss"] * aux + MOE["z_loss"] * z).backward()
        norm = torch.nn.utils.clip_grad_norm_([P[n] for n in names(CONFIG)], OPT["grad_clip"])
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        decisions += info["decisions"]
        records.append({"step": step, "loss": ce.item(), "grad_norm": norm.item(), "lr": lr,
                        "aux": float(aux), "z": float(z), "dropped": info["dropped"],
                        "order_gap": info["order_gap"], "cut_gap": info["cut_gap"],
                        "routed": info["routed"], "kept": info["kept"]})
        print(f"cf {cf:g} step {step} loss {ce.item():.8f} grad_norm {norm.item():.6f} lr {lr:.6g} "
              f"aux {float(aux):.6f} z {float(z):.6f} dropped {info['dropped']} "
              f"logit gaps: order {info['order_gap']:.1e} cut {info['cut_gap']:.1e}")
    return P, records, cap, decisions


def robustness(P0, tokens, cf, decisions):
    """Routed or kept assignments that differ from `decisions` in runs from P0 perturbed by 1e-5 relative
    noise, ten times the weight drift of an 8-step fp32 run (5e-7 in the dense reference's C
    test): 0 means tycho's fp32 run routes every token of every step as this run does."""
    gen = torch.Generator().manual_seed(7)
    flips = 0
    for trial in range(3):
        Q = {n: t * (1 + 1e-5 * torch.randn(t.shape, generator=gen)) for n, t in P0.items()}
        with open(os.devnull, "w") as quiet:
            saved, sys.stdout = sys.stdout, quiet
            try:
                d = train(Q, tokens, cf)[3]
            finally:
                sys.stdout = saved
        per = [int((a != b).sum()) for a, b in zip(decisions, d)]
        print(f"  perturbed run {trial}: changed routed and kept assignments per (step, layer) {per}")
        flips += sum(per)
    return flips


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "golden")
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)
    P0 = init_weights(gen)
    write_safetensors(os.path.join(out, "moe_ref_init.safetensors"), [(n, P0[n]) for n in names(CONFIG)])
    tokens = torch.randint(0, CONFIG["vocab"], (N_TOKENS,), generator=gen)
    with open(os.path.join(out, "moe_ref_tokens.bin"), "wb") as f:
        header = [0] * 256
        header[0], header[1], header[2] = 20240520, 1, N_TOKENS
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{N_TOKENS}H", *tokens.tolist()))
    for stem, cf in CASES:
        P, records, cap, decisions = train(P0, tokens, cf)
        if cf > 0 and records[0]["dropped"] == 0:
            raise SystemExit(f"{stem}: no assignment drops at init; the case would not test capacity")
        flips = robustness(P0, tokens, cf, decisions)
        if flips:
            raise SystemExit(f"{stem}: {flips} routing decisions change under a 1e-5 relative "
                             "perturbation of the initial weights; tycho's fp32 run could route "
                             "differently: change SEED")
        write_safetensors(os.path.join(out, stem + "_final.safetensors"), [(n, P[n]) for n in names(CONFIG)])
        with open(os.path.join(out, stem + ".json"), "w") as f:
            json.dump({"config": CONFIG, "sparse_layers": SPARSE, "moe": dict(MOE, capacity_factor=cf),
                       "capacity": cap, "global": GLOBAL, "micro": MICRO, "seq": SEQ, "steps": STEPS,
                       "optimizer": OPT, "lr_schedule": SCHED,
                       "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
