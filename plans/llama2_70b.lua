-- Llama 2 70B on 80 GB GPUs, 8 per node: tensor parallel 8 inside each node (the k and v
-- projections split one key/value head per rank), 4 pipeline stages across nodes with the
-- 1F1B schedule, data parallel over the rest (dp = "auto": 2 on 64 ranks). Sequence
-- parallel, selective recompute of the attention core, ZeRO-1 (at dp 2, ZeRO 2 and 3 with
-- the pipeline's default zero_every = "step" hold more during a step than ZeRO 1, and with
-- "micro_batch" they reduce-scatter every one of the 512 micro-batches: docs/plans.md, "ZeRO
-- across micro-batches"). Global batch 4M tokens as in the Llama 2 paper.
local tycho = require "tycho"
local llama2 = require "models.llama2"

return tycho.plan {
  name = "llama2-70b",
  model = llama2["70b"],
  mesh = { tp = 8, pp = 4, dp = "auto", order = { "tp", "dp", "pp" } },

  stages = "balanced",      -- by forward FLOPs, counting the LM head in the last stage
                            -- (a third of a layer here, so 20 layers per stage)
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

  optimizer = { kind = "adamw", lr = 1.5e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 2000, decay = "cosine", decay_steps = 500000, min_lr = 1.5e-5 },
  seeds = { global = 1234 },

  data = { train = "data/train.bin", val = "data/val.bin", shuffle = true },
  train = { steps = 500000, eval_every = 1000, eval_batches = 20 },
  checkpoint = { dir = "ckpt/llama2-70b", every = 500, keep = 2, async = true },
  log = { every = 10, metrics = "runs/llama2-70b/metrics.jsonl" },
}
