-- A malformed plan: tycho check must refuse it with exit code 2. Evaluation is asked for, but a
-- token file has no held-out part and data.val is not given: the evaluations were skipped
-- without a word.
-- expect: train.eval_every = 10: evaluation needs a validation set, and data.train = "data/train.bin" comes without data.val
local tycho = require "tycho"
return tycho.plan {
  name = "eval-without-val",
  model = { n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_dim = 192, vocab = 64, max_seq = 64 },
  batch = { global = 8, micro = 2, seq = 32 },
  data = { train = "data/train.bin" },
  train = { steps = 100,
            eval_every = 10 },  -- @error
}
