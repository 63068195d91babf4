-- tests/golden/moe_ref_plan.lua without a capacity (capacity_factor 0: dropless), the sparse
-- layers given as a list: the reference's second run (moe_ref_dropless.json).
local tycho = require "tycho"

return tycho.plan {
  name = "moe-ref-dropless",
  model = { n_layers = 3, dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab = 64,
            max_seq = 16, norm_eps = 1e-5, rope_theta = 10000,
            moe = { experts = 4, top_k = 2, ffn_dim = 24, aux_loss = 0.01, z_loss = 1e-3,
                    capacity_factor = 0, layers = { 1, 2 } } },
  batch = { global = 4, micro = 2, seq = 16 },
  optimizer = { kind = "adamw", lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 3, decay = "cosine", decay_steps = 8, min_lr = 1e-3 },
  data = { train = "tests/golden/moe_ref_tokens.bin" },
  init = { from = "tests/golden/moe_ref_init.safetensors" },
  train = { steps = 8 },
  log = { every = 1 },
}
