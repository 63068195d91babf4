-- Mixtral 8x7B (plans/models/mixtral.lua: 46.7B parameters, 12.9B active per token) on 80 GB
-- GPUs, 8 per node, for 256 ranks (32 nodes): 32 pipeline stages of one layer each across
-- nodes (1F1B), data parallel 8 inside each node, and expert parallelism 8 inside dp: each
-- rank of an ep group computes one of the 8 experts of its layer for the group's tokens, the
-- rows going there and back by all-to-all on the node's link (docs/moe.md, "Expert
-- parallelism"). tp stays 1: with tp the experts would be whole on every tp rank, computed tp
-- times, so the ranks go to pp and dp instead. A rank holds only its
-- expert of each layer (parameters, gradients, AdamW state); at ep = dp no other rank shares
-- them, and ZeRO-3 shards the dense rest over dp (each stage gathering and reducing once a step,
-- the pipeline's default zero_every), its gathers bringing one expert per layer, not eight.
-- Capacity factor 1.25 (Switch Transformer's): with ep the rows a rank receives are padded to the
-- capacity, 8 × 1280 per sequence, where dropless they could be all 8 × 4096 of its group's
-- tokens. Recompute of the whole attention block (the sparse MLP is never recomputed).
-- `tycho check plans/mixtral_8x7b.lua --world 256 --cluster plans/clusters/h100_80g_ib.lua`:
-- 50.7 GiB on the fullest rank (stage 0, whose activations are 38.0 GiB: 32 micro-batches in
-- flight; the async snapshot's 2.2 GiB of it is host memory), 35% headroom on 80 GB (74.5 GiB) for
-- the 48.5 GiB on the GPU; 4.0 s per step, MFU 32.9%, of which the ep
-- all-to-alls 0.12 s (4 per layer and micro-batch, 80 MiB each from a rank, intra-node) and the
-- pipeline bubble 0.66 s. The same layout at ep 1 is 3.9 s and 49.1 GiB (its activations hold
-- fewer rows; its gathers bring all 8 experts): where the model fits either way the cost model
-- sees ep's exchange and not its larger expert products, and `tycho tune` picks ep 1; on 64 ranks
-- every layout that fits shards the experts (tune's best: pp 8 × dp 8, ep 4, ZeRO-3, 65.9 GiB).
-- Global batch 4M tokens.
local tycho = require "tycho"
local mixtral = require "models.mixtral"

return tycho.plan {
  name = "mixtral-8x7b",
  model = tycho.extend(mixtral["8x7b"], { moe = { capacity_factor = 1.25 } }),
  mesh = { tp = 1, pp = 32, dp = "auto", ep = 8, order = { "tp", "dp", "pp" } },

  stages = "balanced",      -- by forward FLOPs: one layer per stage, the head with the last
  recompute = { "attn" },
  zero = 3,

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
