-- Llama 2 7B on 80 GB GPUs, 8 ranks per node: tensor parallel 2 inside a node pair, data
-- parallel over the rest (dp = "auto": 4 on one 8-GPU node, 64 on 16 nodes), ZeRO-1, full
-- activations kept except the attention core (Megatron's selective recompute).
-- Global batch 4M tokens as in the Llama 2 paper (1024 sequences of 4096).
local tycho = require "tycho"
local llama2 = require "models.llama2"

return tycho.plan {
  name = "llama2-7b",
  model = llama2["7b"],
  mesh = { tp = 2, pp = 1, dp = "auto", order = { "tp", "dp", "pp" } },

  tp_split = {
    embed = "vocab", q = "column", k = "column", v = "column", o = "row",
    gate = "column", up = "column", down = "row", head = "vocab",
  },
  sequence_parallel = true,
  recompute = { "attn_core" },
  zero = 1,

  schedule = { kind = "1f1b" },
  batch = { global = 1024, micro = 1, seq = 4096 },
  precision = { compute = "bf16", grads = "fp32", master = "fp32" },
  device = "cuda",          -- a GPU plan: `tycho check` bills it with the GPU runtime's element
                            -- sizes; `--set device=cpu` describes (and runs) it on the CPU runtime

  -- Llama 2 paper: AdamW β1 0.9, β2 0.95, eps 1e-5, weight decay 0.1, clip 1.0, 2000 warm-up
  -- steps, cosine decay to 10% of the peak rate of 3e-4.
  optimizer = { kind = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 2000, decay = "cosine", decay_steps = 500000, min_lr = 3e-5 },
  seeds = { global = 1234 },

  data = { train = "data/train.bin", val = "data/val.bin", shuffle = true },
  train = { steps = 500000, eval_every = 1000, eval_batches = 20 },
  checkpoint = { dir = "ckpt/llama2-7b", every = 1000, keep = 3, async = true },
  log = { every = 10, metrics = "runs/llama2-7b/metrics.jsonl" },
}
