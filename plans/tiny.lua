-- A ~1M-parameter Llama that learns 3-digit addition on 2 CPU cores in a few minutes.
-- The default training example: `tycho run plans/tiny.lua`. Byte-level tokens (the token id
-- is the byte value), so the vocabulary only needs to cover "0-9 + = \n".
local tycho = require "tycho"

return tycho.plan {
  name = "tiny-addition",
  model = {
    family = "llama",
    n_layers = 4,
    dim = 128,
    n_heads = 4,
    n_kv_heads = 2,
    ffn_dim = 384,
    vocab = 64,
    max_seq = 128,
    dropout = 0,
  },

  mesh = { tp = 1, pp = 1, dp = "auto" },
  zero = 0,
  schedule = { kind = "1f1b" },
  batch = { global = 32, micro = 8, seq = 64 },   -- micro 8: runs on 1, 2 or 4 data-parallel ranks
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },

  optimizer = { kind = "adamw", lr = 3e-3, beta1 = 0.9, beta2 = 0.99, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 100, decay = "cosine", decay_steps = 3000, min_lr = 3e-4 },
  seeds = { global = 1234 },

  data = { synthetic = "addition" },
  train = { steps = 3000, eval_every = 500, eval_batches = 4 },
  log = { every = 100 },
}
