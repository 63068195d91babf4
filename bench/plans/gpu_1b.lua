-- The model bench/bench_gpu trains on one GPU, and bench/torch_gpu.py the same in PyTorch: a
-- Llama of 1.1B parameters (22 layers, dim 2048, 32 heads over 4 KV heads, ffn 5632, vocabulary
-- 32000, untied head) at seq 2048, 8 sequences a step in micro-batches of 2, bf16 compute with
-- fp32 master weights, AdamW with clipping, constant lr, no dropout. The synthetic corpus: the
-- tokens' values do not change a step's time. bench_gpu sets device and precision itself.
local tycho = require "tycho"

return tycho.plan {
  name = "gpu-1b",
  model = {
    family = "llama",
    n_layers = 22,
    dim = 2048,
    n_heads = 32,
    n_kv_heads = 4,
    ffn_dim = 5632,
    vocab = 32000,
    max_seq = 2048,
    dropout = 0,
    tie_embeddings = false,
  },

  device = "cuda",
  mesh = { tp = 1, pp = 1, dp = 1 },
  zero = 0,
  batch = { global = 8, micro = 2, seq = 2048 },   -- micro 2: room for an attention that keeps T·T
  precision = { compute = "bf16", grads = "fp32", master = "fp32" },

  optimizer = { kind = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 0, decay = "constant" },
  seeds = { global = 1234 },

  data = { synthetic = "addition" },
  train = { steps = 10, eval_every = 0, eval_batches = 0 },
  log = { every = 1 },
}
