-- A small Llama with dropout on the addition corpus, for the data-parallel equivalence tests
-- (tests/mpi/mpi_dp_equiv.c, tests/mpi/run_dp.sh): every dp and zero setting must reproduce the
-- serial run of this plan. Small buckets (bucket_mb) so the ~90 KiB model spans several, and
-- buckets straddle layers under zero 0 and 1. Global batch 16 in micro-batches of 4: 4
-- micro-batches on one rank, 2 per rank at dp2, 1 at dp4.
local tycho = require "tycho"

return tycho.plan {
  name = "dp-small",
  model = { family = "llama", n_layers = 2, dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 64,
            vocab = 64, max_seq = 32, dropout = 0.1 },
  mesh = { tp = 1, pp = 1, dp = "auto" },
  zero = 0,
  bucket_mb = 0.02,
  batch = { global = 16, micro = 4, seq = 32 },
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },
  optimizer = { kind = "adamw", lr = 3e-3, beta1 = 0.9, beta2 = 0.99, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 5, decay = "cosine", decay_steps = 20, min_lr = 3e-4 },
  seeds = { global = 99 },
  data = { synthetic = "addition" },
  train = { steps = 20, eval_every = 10, eval_batches = 1 },
  log = { every = 5 },
}
