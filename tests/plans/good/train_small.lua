-- A small Llama on the addition corpus that trains in seconds on one core: the plan behind the
-- runtime's training tests (tests/unit/test_train_small.c, tests/e2e/run_train_small.sh).
local tycho = require "tycho"

return tycho.plan {
  name = "train-small",
  model = { family = "llama", n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_dim = 192,
            vocab = 64, max_seq = 32 },
  mesh = { tp = 1, pp = 1, dp = 1 },
  batch = { global = 16, micro = 8, seq = 32 },
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },
  optimizer = { kind = "adamw", lr = 3e-3, beta1 = 0.9, beta2 = 0.99, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 10, decay = "cosine", decay_steps = 60, min_lr = 3e-4 },
  seeds = { global = 7 },
  data = { synthetic = "addition" },
  train = { steps = 60, eval_every = 30, eval_batches = 2 },
  log = { every = 10 },
}
