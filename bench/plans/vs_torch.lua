-- The model bench/bench_vs_torch.sh trains on tycho and on PyTorch eager (bench/torch_bench.py):
-- 4 layers, dim 256, 8 heads (n_kv_heads 8: plain multi-head attention), ffn 688, vocab 512,
-- batch 8 x 128 tokens per step, fp32, AdamW with clipping, constant lr, no dropout, untied head.
-- The script gives the token file and the metrics file on the command line:
--   build/tycho run bench/plans/vs_torch.lua --set data.train=TOKENS --set log.metrics=FILE
local tycho = require "tycho"

return tycho.plan {
  name = "vs-torch",
  model = {
    family = "llama",
    n_layers = 4,
    dim = 256,
    n_heads = 8,
    n_kv_heads = 8,
    ffn_dim = 688,
    vocab = 512,
    max_seq = 128,
    dropout = 0,
    tie_embeddings = false,
  },

  mesh = { tp = 1, pp = 1, dp = 1 },
  zero = 0,
  batch = { global = 8, micro = 8, seq = 128 },   -- one micro-batch per step, as PyTorch runs it
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },

  optimizer = { kind = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 0, decay = "constant" },
  seeds = { global = 1234 },

  data = { train = "tokens.bin", shuffle = false },   -- replaced with --set data.train=...
  train = { steps = 40, eval_every = 0 },
  log = { every = 10 },
}
