-- Mixtral 8x7B (plans/models/mixtral.lua: 46.7B parameters, 12.9B active per token) on 64
-- H100-80G GPUs, 8 per node (8 nodes): 16 pipeline stages of two layers each across nodes
-- (1F1B), data parallel 4 inside each node, and expert parallelism 4 inside dp: each rank of an
-- ep group computes two of the 8 experts of its layers for the group's tokens, the rows going
-- there and back by all-to-all on the node's link (docs/moe.md, "Expert parallelism"). tp stays
-- 1: with tp the experts would be whole on every tp rank, computed tp times, so the ranks go to
-- pp and dp instead. A rank holds only its experts of each layer (their bf16 copies, gradients,
-- fp32 master and AdamW moments); at ep = dp no other rank shares them, and ZeRO 1 shards the
-- dense rest's master and moments over dp. Capacity factor 1.25 (Switch Transformer's): with ep
-- the rows a rank receives are padded to the capacity, 8 × 1280 per sequence, where dropless
-- they could be all 4 × 4096 of its group's tokens. The attention's core is recomputed (the
-- sparse MLP never is); a sparse layer keeps its experts' rows in bf16.
-- The layout is `tycho tune`'s fastest that fits on plans/clusters/h100_80g_ib.lua (7 of 2,968
-- valid layouts fit with 10% headroom). `tycho check plans/mixtral_8x7b.lua --world 64 --cluster
-- plans/clusters/h100_80g_ib.lua`: 66.1 GiB on the GPU of the fullest rank (stage 0, whose
-- activations are 45.5 GiB: 16 micro-batches in flight; the async snapshot's 8.5 GiB is host
-- memory), 11% headroom on 80 GB (74.5 GiB); 12.1 s per step, MFU 43.5%. NeMo's published
-- example lays the model out as tp 1, pp 4 (virtual 8), ep 8: here that layout bills 111.5 GiB
-- on its first stage, 72.8 GiB of it activations — the executor keeps room for each virtual
-- stage's most micro-batches in flight (56 one-layer slots on pp rank 0) where at most 35 are
-- in flight at once.
-- Global batch 4M tokens.
local tycho = require "tycho"
local mixtral = require "models.mixtral"

return tycho.plan {
  name = "mixtral-8x7b",
  model = tycho.extend(mixtral["8x7b"], { moe = { capacity_factor = 1.25 } }),
  mesh = { tp = 1, pp = 16, dp = "auto", ep = 4, order = { "tp", "dp", "pp" } },

  stages = "balanced",      -- by forward FLOPs: two layers per stage, the head with the last
  recompute = { "attn_core" },
  zero = 1,

  schedule = { kind = "1f1b" },
  batch = { global = 1024, micro = 1, seq = 4096 },
  precision = { compute = "bf16", grads = "fp32", master = "fp32" },
  device = "cuda",          -- a GPU plan: `tycho check` bills it with the GPU runtime's element
                            -- sizes; `--set device=cpu` describes it on the CPU runtime

  optimizer = { kind = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5,
                weight_decay = 0.1, grad_clip = 1.0 },
  lr_schedule = { warmup = 2000, decay = "cosine", decay_steps = 500000, min_lr = 3e-5 },
  seeds = { global = 1234 },

  data = { train = "data/train.bin", val = "data/val.bin", shuffle = true },
  train = { steps = 500000, eval_every = 1000, eval_batches = 20 },
  checkpoint = { dir = "ckpt/mixtral-8x7b", every = 500, keep = 2, async = true },
  log = { every = 10, metrics = "runs/mixtral-8x7b/metrics.jsonl" },
}
