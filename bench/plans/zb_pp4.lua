-- A ~14M-parameter Llama for bench/bench_zb.sh: 1F1B against ZB-H1 at pp 4, 2 layers a stage
-- (8 layers, dim 384, ffn 1024), the embedding and head small (vocab 64) so that the four stages
-- cost alike and each is compute-bound: a micro-batch's boundary is 2 × 64 × 384 floats (192 KiB)
-- against about 2.7 GFLOP of its stage's forward and backward. 16 micro-batches a step.
local tycho = require "tycho"

return tycho.plan {
  name = "zb-pp4",
  model = {
    family = "llama",
    n_layers = 8,
    dim = 384,
    n_heads = 6,
    n_kv_heads = 6,
    ffn_dim = 1024,
    vocab = 64,
    max_seq = 64,
    dropout = 0,
  },
  mesh = { tp = 1, pp = 4, dp = 1 },
  zero = 0,
  schedule = { kind = "1f1b" },
  batch = { global = 32, micro = 2, seq = 64 },
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },
  optimizer = { kind = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 10, decay = "cosine", decay_steps = 100, min_lr = 3e-5 },
  seeds = { global = 1234 },
  data = { synthetic = "addition" },
  train = { steps = 20, eval_every = 0, eval_batches = 0 },
  log = { every = 1000 },
}
