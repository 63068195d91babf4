-- tests/plans/good/dp_small.lua with 4 layers, layers 1 and 3 sparse, for the equivalence tests
-- of sparse layers without expert parallelism (tests/mpi.cmake, mpi_dp_equiv.moe_*, mpi_bill.moe_*):
-- 4 experts of width 32, top 2, capacity factor 1 (so assignments drop), the load-balancing loss
-- and the z-loss on, dropout 0.1. Every dp, zero and pipeline setting (each of 2 stages, and each
-- of 4 interleaved virtual stages, holds a dense and a sparse layer or one of them) must
-- reproduce the serial run: the routing is per sequence, so the same tokens drop in every layout.
local tycho = require "tycho"

return tycho.plan {
  name = "moe-small",
  model = { family = "llama", n_layers = 4, dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 64,
            vocab = 64, max_seq = 32, dropout = 0.1,
            moe = { experts = 4, top_k = 2, ffn_dim = 32, layers = { 1, 3 }, capacity_factor = 1.0,
                    aux_loss = 0.01, z_loss = 1e-3 } },
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
  train = { steps = 12, eval_every = 6, eval_batches = 1 },
  log = { every = 5 },
}
