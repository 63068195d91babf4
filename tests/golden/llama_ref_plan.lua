-- The plan that reproduces tests/reference/llama_ref.py (the PyTorch reference): same model,
-- initial weights, tokens, optimizer and schedule. Paths are relative to the source folder.
local tycho = require "tycho"

return tycho.plan {
  name = "llama-ref",
  model = { n_layers = 2, dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab = 64,
            max_seq = 16, norm_eps = 1e-5, rope_theta = 10000 },
  batch = { global = 4, micro = 4, seq = 16 },
  optimizer = { kind = "adamw", lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 3, decay = "cosine", decay_steps = 8, min_lr = 1e-3 },
  data = { train = "tests/golden/llama_ref_tokens.bin" },
  init = { from = "tests/golden/llama_ref_init.safetensors" },
  train = { steps = 8 },
  log = { every = 1 },
}
