-- A ~10.6M-parameter Llama for bench/bench_predict.sh: predicted against measured step time at a
-- size where the matmuls are large enough to matter (6 layers, dim 384, ffn 1024) and small enough
-- that a step takes about a second on one core. Synthetic addition data, a handful of steps.
-- Every divisibility the bench's layouts need holds: heads, kv heads, ffn and vocab by tp 2, seq by
-- tp 2 (sequence parallelism), layers by pp 2, batch.global by dp 2 × micro.
local tycho = require "tycho"

return tycho.plan {
  name = "predict-10m",
  model = {
    family = "llama",
    n_layers = 6,
    dim = 384,
    n_heads = 6,
    n_kv_heads = 6,
    ffn_dim = 1024,
    vocab = 64,
    max_seq = 64,
    dropout = 0,
  },
  mesh = { tp = 1, pp = 1, dp = "auto" },
  zero = 0,
  schedule = { kind = "1f1b" },
  batch = { global = 16, micro = 4, seq = 64 },
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },
  optimizer = { kind = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 10, decay = "cosine", decay_steps = 100, min_lr = 3e-5 },
  seeds = { global = 1234 },
  data = { synthetic = "addition" },
  train = { steps = 10, eval_every = 0 },
  log = { every = 1 },
}
