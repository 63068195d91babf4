#!/usr/bin/python3
"""PyTorch eager's side of bench/bench_vs_torch.sh, and the script's arithmetic and table.

  torch_bench.py torch --tokens FILE --threads N [--bf16] [--steps 40] [--warmup 5] --out R.json
      trains the benchmark's model (bench/plans/vs_torch.lua) with PyTorch eager on the CPU and
      times every step (batch, forward, backward, clip_grad_norm_, AdamW) with perf_counter.
  torch_bench.py tycho --metrics FILE --threads N --label L [--skip 5] --out R.json
      the same summary from a `tycho run` metrics file (per-step "tokens_per_sec").
  torch_bench.py report R.json ...    the table, the ratios and the goals.

The model is tests/reference/llama_ref.py's forward (imported, not copied): that file sets float64
as the default dtype when imported, so this script sets float32 back and checks every parameter
and the loss are float32. Its rope() builds the cos/sin tables in float64 on every call, which in
an fp32 run would turn q and k into float64; here rope is replaced by the same rotate-half
equations with the tables built once in float32 (the fair choice: tycho keeps its tables too).

Statistics, the same for both sides: the first `warmup` steps are dropped; the median is
tokens per step / the median step time; the slow tail is tokens per step / the 90th percentile of
step time (nearest rank: the ceil(0.9 n)-th fastest step), which is the 10th percentile of the
per-step tokens/s; the spread is slow tail / median (1.0: every step as fast as the median).
Run with Debian's python3 and python3-torch (1.13). Never needed to build or test tycho.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIG = dict(n_layers=4, dim=256, n_heads=8, n_kv_heads=8, ffn_dim=688, vocab=512, max_seq=128,
              norm_eps=1e-5, rope_theta=10000.0)
GLOBAL, SEQ = 8, 128
OPT = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
TOKENS_PER_STEP = GLOBAL * SEQ


def summarize(step_seconds, tokens_per_step):
    times = sorted(step_seconds)
    n = len(times)
    if n == 0:
        raise SystemExit("torch_bench.py: no steps left to summarize")
    median = statistics.median(times)
    p90 = times[max(0, math.ceil(0.9 * n) - 1)]
    return {"steps_timed": n, "median_ms": 1e3 * median, "p90_ms": 1e3 * p90,
            "median_tps": tokens_per_step / median, "slow_tps": tokens_per_step / p90,
            "spread": median / p90}


def write_result(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def finish(result, timed, path, extra=""):
    """Adds the timed steps' statistics to result, writes it to path and prints its line."""
    result.update(summarize(timed, TOKENS_PER_STEP))
    write_result(path, result)
    print(f"  {result['label']}, {result['setting']}: median {result['median_tps']:,.0f} tokens/s, "
          f"slow tail {result['slow_tps']:,.0f} ({result['median_ms']:.1f} / {result['p90_ms']:.1f} ms), "
          f"loss {result['first_loss']:.4f} -> {result['last_loss']:.4f}{extra}", flush=True)


# ---------------------------------------------------------------------------------------- torch
def cmd_torch(a):
    import torch
    torch.set_num_threads(a.threads)
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
    import llama_ref as ref
    torch.set_default_dtype(torch.float32)  # llama_ref sets float64 when imported

    tables = {}

    def rope(x, theta):  # llama_ref.rope's equations, tables once and in float32
        B, T, H, HS = x.shape
        key = (T, HS, theta)
        if key not in tables:
            inv = theta ** (-torch.arange(0, HS // 2, dtype=torch.float64) * 2 / HS)
            ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
            cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :].to(torch.float32)
            sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :].to(torch.float32)
            tables[key] = (cos, sin)
        cos, sin = tables[key]
        x1, x2 = x[..., : HS // 2], x[..., HS // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    ref.rope = rope

    raw = open(a.tokens, "rb").read()
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int64) & 0xFFFF
    n_tokens = tokens.numel()
    if int(tokens.max()) >= CONFIG["vocab"] or n_tokens < SEQ + 2:
        raise SystemExit(f"torch_bench.py: {a.tokens}: not a raw uint16 file of ids < {CONFIG['vocab']}")

    def batch(step):  # tycho's unshuffled windows: o = (w * S) mod (n_tokens - S - 1)
        xs, ys = [], []
        for k in range(GLOBAL):
            o = ((step * GLOBAL + k) * SEQ) % (n_tokens - SEQ - 1)
            xs.append(tokens[o:o + SEQ])
            ys.append(tokens[o + 1:o + SEQ + 1])
        return torch.stack(xs), torch.stack(ys)

    gen = torch.Generator().manual_seed(1234)
    sh = ref.shapes(CONFIG)
    P = {}
    for n in ref.names(CONFIG):
        if n.endswith("norm.weight") or "layernorm" in n:
            t = torch.ones(sh[n])
        else:
            t = 0.02 * torch.randn(sh[n], generator=gen)
        P[n] = t.requires_grad_(True)
    params = [P[n] for n in ref.names(CONFIG)]
    dtypes = sorted({str(p.dtype) for p in params})
    if dtypes != ["torch.float32"]:
        raise SystemExit(f"torch_bench.py: parameters are {dtypes}, not float32")
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"],
                            foreach=a.foreach)

    def step(s):
        x, y = batch(s)
        if a.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = ref.forward(P, CONFIG, x, y)
        else:
            loss = ref.forward(P, CONFIG, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, OPT["grad_clip"])
        opt.step()
        return loss, norm

    seconds, losses = [], []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss, norm = step(s)
        lv = loss.item()
        t1 = time.perf_counter()
        seconds.append(t1 - t0)
        losses.append(lv)
        if s == 0:
            loss_dtype = str(loss.dtype)
    if not a.bf16 and loss_dtype != "torch.float32":
        raise SystemExit(f"torch_bench.py: the fp32 run computed its loss in {loss_dtype}")
    result = {"label": "PyTorch bf16 autocast" if a.bf16 else "PyTorch fp32", "threads": a.threads,
              "setting": a.setting or str(a.threads),
              "torch": torch.__version__, "param_dtype": dtypes[0], "loss_dtype": loss_dtype,
              "foreach": bool(a.foreach), "first_loss": losses[0], "last_loss": losses[-1],
              "warmup": a.warmup, "step_seconds": seconds[a.warmup:]}
    finish(result, seconds[a.warmup:], a.out, f", params {dtypes[0]}, loss {loss_dtype}")


# ---------------------------------------------------------------------------------------- tycho
def cmd_tycho(a):
    seconds, losses, tokens_per_step = [], [], None
    with open(a.metrics) as f:
        for line in f:
            r = json.loads(line)
            if "tokens_per_sec" not in r:
                continue
            if tokens_per_step is None and r["step"] == 0:
                tokens_per_step = r["tokens"]
            seconds.append(TOKENS_PER_STEP / r["tokens_per_sec"])
            losses.append(r["loss"])
    if tokens_per_step not in (None, TOKENS_PER_STEP):
        raise SystemExit(f"torch_bench.py: {a.metrics}: {tokens_per_step} tokens a step, expected {TOKENS_PER_STEP}")
    if len(seconds) <= a.skip:
        raise SystemExit(f"torch_bench.py: {a.metrics}: {len(seconds)} steps, none left after dropping {a.skip}")
    result = {"label": a.label, "threads": a.threads, "setting": a.setting or str(a.threads),
              "first_loss": losses[0], "last_loss": losses[-1], "warmup": a.skip,
              "step_seconds": seconds[a.skip:]}
    finish(result, seconds[a.skip:], a.out)


# --------------------------------------------------------------------------------------- report
def cmd_report(a):
    rows = {}
    for path in a.results:
        with open(path) as f:
            r = json.load(f)
        rows[r["label"]] = r
    order = ["tycho fp32", "tycho bf16", "PyTorch fp32", "PyTorch bf16 autocast"]
    print()
    print(f"{'':22} {'threads':<24} {'median tok/s':>13} {'slow tail tok/s':>16} {'spread':>7}")
    for label in order:
        r = rows.get(label)
        if r is None:
            print(f"{label:22} {'n/a':<24} {'n/a':>13} {'n/a':>16} {'n/a':>7}")
        else:
            print(f"{label:22} {r['setting']:<24} {r['median_tps']:>13,.0f} {r['slow_tps']:>16,.0f} {r['spread']:>7.2f}")
    print("(median: tokens per step / median step time; slow tail: / 90th-percentile step time, i.e. the")
    print(" 10th percentile of per-step tokens/s; spread: slow tail / median)")

    def ratio(a_label, b_label):
        if a_label in rows and b_label in rows:
            return rows[a_label]["median_tps"] / rows[b_label]["median_tps"]
        return None

    def verdict(ok):
        return "n/a" if ok is None else ("met" if ok else "NOT MET")

    def fmt(x):
        return "n/a" if x is None else f"{x:.2f}x"

    r_fp32 = ratio("tycho fp32", "PyTorch fp32")
    r_bf16 = ratio("tycho bf16", "PyTorch fp32")
    r_bf16_bf16 = ratio("tycho bf16", "PyTorch bf16 autocast")
    noisy = a.other_cores is not None and a.other_cores > 0.2
    print()
    print("ratios of median tokens/s" + (" (the machine was not quiet: the verdicts below are not reliable):"
                                         if noisy else ":"))
    print(f"  tycho fp32 / PyTorch fp32            {fmt(r_fp32):>7}   goal >= 2.0x: {verdict(None if r_fp32 is None else r_fp32 >= 2.0)}")
    print(f"  tycho bf16 / PyTorch fp32            {fmt(r_bf16):>7}   goal >= 3.5x: {verdict(None if r_bf16 is None else r_bf16 >= 3.5)}")
    print(f"  tycho bf16 / PyTorch bf16 autocast   {fmt(r_bf16_bf16):>7}   goal >= 2.0x: {verdict(None if r_bf16_bf16 is None else r_bf16_bf16 >= 2.0)}")
    for label in ("tycho fp32", "tycho bf16"):
        r = rows.get(label)
        ok = None if r is None else r["spread"] >= 0.9
        spread = "n/a" if r is None else f"{r['spread']:.2f}"
        print(f"  {label} slow tail / median     {spread:>7}   goal >= 0.90 (within 10%): {verdict(ok)}")
    if a.other_cores is not None:
        print(f"run took {a.seconds:.0f} s; other work on the machine meanwhile: {a.other_cores:.2f} cores busy on "
              f"average ({'not quiet: the figures are low and noisy' if noisy else 'quiet'})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--tokens", required=True)
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--bf16", action="store_true")
    t.add_argument("--foreach", action="store_true", help="AdamW(foreach=True); default the for-loop")
    t.add_argument("--setting", help="how the thread setting is shown (default: the thread count)")
    t.add_argument("--steps", type=int, default=40)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--out", required=True)
    m = sub.add_parser("tycho")
    m.add_argument("--metrics", required=True)
    m.add_argument("--threads", type=int, required=True)
    m.add_argument("--label", required=True)
    m.add_argument("--setting", help="how the thread setting is shown (default: the thread count)")
    m.add_argument("--skip", type=int, default=5)
    m.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--seconds", type=float, default=0.0, help="how long the whole run took")
    r.add_argument("--other-cores", type=float, help="cores other work kept busy during the run")
    r.add_argument("results", nargs="+")
    a = ap.parse_args()
    {"torch": cmd_torch, "tycho": cmd_tycho, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
