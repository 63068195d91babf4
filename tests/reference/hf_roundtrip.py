#!/usr/bin/python3
"""Checks tycho's safetensors against Hugging Face's own `safetensors` library, both ways.

  /usr/bin/python3 tests/reference/hf_roundtrip.py TYCHO OUTDIR

1. HF -> tycho: the reference's initial weights are re-saved with safetensors.torch.save_file
   (the library Hugging Face models are saved with) and tycho trains from them (init.from): its
   per-step losses must match the PyTorch reference's (tests/golden/llama_ref.json).
2. tycho -> HF: tycho's export (export.path) is loaded with safetensors.torch.load_file: every
   Hugging Face name with its shape, and values equal to the reference's final weights up to
   fp32-vs-float64 training drift (relative L2 norm of the difference).
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
print("ok")
