#!/usr/bin/python3
"""Checks tycho's safetensors against Hugging Face's own `safetensors` library, both ways.

  /usr/bin/python3 tests/reference/hf_roundtrip.py TYCHO OUTDIR

1. HF -> tycho: the reference's initial weights are re-saved with safetensors.torch.save_file
   (the library Hugging Face models are saved with) and tycho trains from them (init.from): its
   per-step losses must match the PyTorch reference's (tests/golden/llama_ref.json).
2. tycho -> HF: tycho's export (export.path) is loaded with safetensors.torch.load_file: every
   Hugging Face name with its shape, and values equal to the reference's final weights up to
   fp32-vs-float64 training drift (relative L2 norm of the difference).
3. The folder form: the same run exported as a Hugging Face folder (export.format = "hf", small
   shards) gives, through its index and shards, the one-file export's tensors exactly; where
   transformers is installed, from_pretrained loads the folder unchanged and its logits on the
   reference's first batch give the loss tycho computes for those weights.
Needs python3-torch and the safetensors package; not part of the test suite (which must not
need Python), run by hand when the weight format changes.
"""
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

tycho, out = sys.argv[1], sys.argv[2]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
golden = os.path.join(root, "tests", "golden")
os.makedirs(out, exist_ok=True)

init = load_file(os.path.join(golden, "llama_ref_init.safetensors"))
hf_init = os.path.join(out, "hf_init.safetensors")
save_file({k: v.contiguous() for k, v in init.items()}, hf_init, metadata={"format": "pt"})

metrics, export = os.path.join(out, "metrics.jsonl"), os.path.join(out, "tycho_final.safetensors")
if os.path.exists(metrics):
    os.remove(metrics)
subprocess.run([tycho, "run", "tests/golden/llama_ref_plan.lua", "--set", "init.from=" + hf_init,
                "--set", "log.metrics=" + metrics, "--set", "export.path=" + export],
               cwd=root, check=True, stdout=subprocess.DEVNULL)

ref = json.load(open(os.path.join(golden, "llama_ref.json")))["records"]
got = [json.loads(l) for l in open(metrics) if '"loss"' in l]
worst = max(abs(g["loss"] - r["loss"]) / abs(r["loss"]) for g, r in zip(got, ref))
print(f"HF -> tycho: {len(got)} steps, worst relative loss error {worst:.2e}")
assert len(got) == len(ref) and worst < 1e-5

final = load_file(export)
ref_final = load_file(os.path.join(golden, "llama_ref_final.safetensors"))
assert set(final) == set(ref_final), set(final) ^ set(ref_final)
for name, t in ref_final.items():
    assert final[name].shape == t.shape and final[name].dtype == torch.float32, name
num = sum(float(((final[n].double() - ref_final[n].double()) ** 2).sum()) for n in ref_final)
den = sum(float((ref_final[n].double() ** 2).sum()) for n in ref_final)
print(f"tycho -> HF: {len(final)} tensors by name and shape; relative L2 difference {(num / den) ** 0.5:.2e}")
assert (num / den) ** 0.5 < 1e-5

folder = os.path.join(out, "tycho_final_hf")
subprocess.run([tycho, "run", "tests/golden/llama_ref_plan.lua", "--set", "init.from=" + hf_init,
                "--set", "export.path=" + folder, "--set", "export.format=hf", "--set", "export.shard_mb=0.02"],
               cwd=root, check=True, stdout=subprocess.DEVNULL)
index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
shards = {f: load_file(os.path.join(folder, f)) for f in set(index["weight_map"].values())}
assert set(index["weight_map"]) == set(final), set(index["weight_map"]) ^ set(final)
assert sum(len(t) for t in shards.values()) == len(final)
assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in final.values())
for name, shard in index["weight_map"].items():
    assert torch.equal(shards[shard][name], final[name]), name
print(f"folder: {len(shards)} shards, every tensor once and equal to the one-file export")

try:
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"from_pretrained: skipped ({e})")
else:
    metrics1 = os.path.join(out, "from_folder.jsonl")
    if os.path.exists(metrics1):
        os.remove(metrics1)
    subprocess.run([tycho, "run", "tests/golden/llama_ref_plan.lua", "--set", "init.from=" + folder,
                    "--set", "train.steps=1", "--set", "log.metrics=" + metrics1],
                   cwd=root, check=True, stdout=subprocess.DEVNULL)
    tycho_loss = [json.loads(l) for l in open(metrics1) if '"loss"' in l][0]["loss"]
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    raw = open(os.path.join(golden, "llama_ref_tokens.bin"), "rb").read()
    n = int.from_bytes(raw[8:12], "little")
    tokens = torch.frombuffer(bytearray(raw[1024:1024 + 2 * n]), dtype=torch.int16).to(torch.long) & 0xFFFF
    rows = [(w * 16) % (n - 17) for w in range(4)]
    x = torch.stack([tokens[o:o + 16] for o in rows])
    y = torch.stack([tokens[o + 1:o + 17] for o in rows])
    with torch.no_grad():
        logits = model(x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    print(f"from_pretrained: loss {loss:.8f} on the first batch, tycho's {tycho_loss:.8f}")
    assert abs(loss - tycho_loss) <= 1e-5 * abs(tycho_loss)
print("ok")
