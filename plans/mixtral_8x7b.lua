-- Mixtral 8x7B (plans/models/mixtral.lua: 46.7B parameters, 12.9B active per token) on 141 GB
-- GPUs (H200), 8 per node, for 256 ranks (32 nodes): 32 pipeline stages of one layer each across
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
-- `tycho check plans/mixtral_8x7b.lua --world 256 --cluster plans/clusters/h200_141g_ib.lua`:
-- 88.4 GiB on the fullest rank (stage 0, whose activations are 74.1 GiB: 32 micro-batches in
-- flight, in the bf16 mode's element sizes — fp32, a sparse layer's inputs rounded per product;
-- the async snapshot's 2.2 GiB of it is host memory), 34% headroom on 141 GB (131.3 GiB) for the 86.2 GiB
-- on the GPU; 4.2 s per step, MFU 31.4%. On 80 GB GPUs (h100_80g_ib.lua) the first stages do
-- not fit, and `tycho tune` finds no layout that does: the activations are the limit. The same
-- layout at ep 1 is 3.9 s and 79.6 GiB (its activations hold fewer rows; its gathers bring all
-- 8 experts): where the model fits either way the cost model sees ep's exchange and not its
-- larger expert products; on 64 H200s, with the fp32 master sharded with the optimizer, tune's
-- best is pp 8 × dp 8 with the experts whole (ZeRO 1, 117.3 GiB), layouts sharding them over
-- ep 2 close behind.
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
