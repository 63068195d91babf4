---@meta tycho
-- LuaLS annotations for plan files: editors that run lua-language-server complete plan fields
-- and flag wrong types. The repository's .luarc.json adds this folder to the library; for
-- plans elsewhere, add this folder to "workspace.library". The schema is docs/plans.md.

---@alias tycho.split "column"|"row"|"replicate"|"vocab"
---@alias tycho.module "embed"|"q"|"k"|"v"|"o"|"gate"|"up"|"down"|"head"
---@alias tycho.recompute_part "attn_norm"|"attn_core"|"attn"|"mlp_norm"|"mlp_act"|"mlp"
---@alias tycho.recompute "none"|"full"|tycho.recompute_part|tycho.recompute_part[]
---@alias tycho.dtype "fp32"|"bf16"|"fp16"
---@alias tycho.device "auto"|"cpu"|"cuda"

---@class tycho.model
---@field family? "llama"            # default "llama"
---@field n_layers integer
---@field dim integer                # model width C
---@field n_heads integer            # query heads; dim / n_heads is the head size (even)
---@field n_kv_heads? integer        # key/value heads (grouped-query attention); default n_heads
---@field ffn_dim integer            # SwiGLU hidden width
---@field vocab integer
---@field max_seq integer
---@field norm_eps? number           # RMSNorm epsilon, default 1e-5
---@field rope_theta? number         # default 10000
---@field dropout? number            # on attention probabilities and residual branches, default 0
---@field tie_embeddings? boolean    # LM head shares the embedding matrix, default false
---@field moe? tycho.moe             # mixture of experts: the sparse MLP of some or all layers

---@class tycho.moe
---@field experts integer            # experts per sparse layer (Mixtral: num_local_experts), ≥ 1
---@field top_k integer              # experts per token (num_experts_per_tok), 1 ≤ top_k ≤ experts
---@field ffn_dim? integer           # each expert's SwiGLU width, default model.ffn_dim
---@field layers? "all"|integer[]|fun(layer: integer): boolean   # sparse layers (0-based), default "all"
---@field aux_loss? number           # load-balancing loss coefficient, default 0.01 (Switch Transformer)
---@field z_loss? number             # router z-loss coefficient, default 0 (off; ST-MoE uses 1e-3)
---@field capacity_factor? number    # 0 (default): dropless; > 0: at most ceil(cf · seq · top_k / experts) tokens per expert and sequence

---@class tycho.mesh
---@field tp? integer                # tensor-parallel ranks, default 1
---@field pp? integer                # pipeline stages (ranks), default 1
---@field dp? integer|"auto"         # data-parallel ranks; "auto" = world / (tp · pp) (default)
---@field order? ("tp"|"dp"|"pp")[]  # fastest-varying first; default { "tp", "dp", "pp" }
---@field ep? integer                # expert parallelism: groups of ep consecutive dp ranks share the experts of model.moe; divides dp and the experts; default 1

---@class tycho.schedule
---@field kind? "gpipe"|"1f1b"|"interleaved"   # default "1f1b"

---@class tycho.batch
---@field global integer             # sequences per step, all ranks together
---@field micro? integer             # sequences per micro-batch on one rank, default 1
---@field seq integer                # tokens per sequence (≤ model.max_seq)

---@class tycho.precision
---@field compute? tycho.dtype       # default "fp32" (the CPU backend runs fp32 only)
---@field grads? tycho.dtype         # default "fp32"
---@field master? "fp32"             # default "fp32"

---@class tycho.optimizer
---@field kind? "adamw"
---@field lr? number                 # default 1e-3 (torch.optim.AdamW)
---@field beta1? number              # default 0.9
---@field beta2? number              # default 0.999
---@field eps? number                # default 1e-8
---@field weight_decay? number       # default 0.01; 2-D tensors only
---@field grad_clip? number          # global L2 norm, default 1.0; 0 = off

---@class tycho.lr_schedule
---@field warmup? integer            # linear warm-up steps, default 0
---@field decay? "constant"|"cosine"|"linear"   # default "constant"
---@field decay_steps? integer       # step where min_lr is reached, default train.steps
---@field min_lr? number             # default 0

---@class tycho.seeds
---@field global? integer            # default 1234; the others derive from it unless set
---@field model? integer
---@field data? integer
---@field dropout? integer

---@class tycho.data
---@field train? string              # llm.c .bin or raw uint16 token file
---@field val? string
---@field shuffle? boolean           # permute windows per epoch from the data seed
---@field synthetic? "addition"      # the built-in byte-level addition corpus

---@class tycho.init
---@field from string                # Hugging Face .safetensors or model.safetensors.index.json

---@class tycho.export
---@field path string                # F32 safetensors with Hugging Face names
---@field every? integer             # also every N steps; 0 = only at the end

---@class tycho.train
---@field steps? integer             # default 1000
---@field eval_every? integer        # 0 = no periodic eval
---@field eval_batches? integer      # default 10

---@class tycho.checkpoint
---@field dir string
---@field every? integer
---@field keep? integer              # default 3
---@field async? boolean

---@class tycho.log
---@field every? integer             # progress line every N steps, default 10
---@field metrics? string            # JSON lines, one record per step
---@field trace? string              # Chrome trace-event JSON
---@field trace_steps? integer       # steps the trace keeps (default 5)

---@class tycho.zero_every
---@field grads? "micro_batch"|"step"   # zero 2, 3: reduce-scatter in every backward, or once in each stage's last (whole gradients held meanwhile); default "step" with pp > 1, else "micro_batch"
---@field params? "micro_batch"|"step"  # zero 3: gather for every forward and backward, or once a step and keep; default as grads

---@class tycho.plan_fields
---@field name? string               # default: the file name without .lua
---@field model tycho.model
---@field mesh? tycho.mesh
---@field stages? "even"|"balanced"|(integer|"embed"|"head")[][]|fun(layer: integer): integer
---@field virtual_stages? integer    # > 1 with schedule.kind = "interleaved"
---@field tp_split? table<tycho.module, tycho.split>|fun(layer: integer|nil, module: tycho.module): tycho.split|nil
---@field sequence_parallel? boolean
---@field recompute? tycho.recompute|fun(layer: integer): tycho.recompute|nil
---@field zero? 0|1|2|3
---@field zero_every? tycho.zero_every  # zero 2, 3: reduce-scatters and gathers every micro-batch or once a step
---@field bucket_mb? number           # data-parallel gradient bucket size in MiB, default 25
---@field schedule? tycho.schedule
---@field batch tycho.batch
---@field precision? tycho.precision
---@field device? tycho.device       # default "auto" (this build: the CPU); "cuda": GPU element sizes in check
---@field optimizer? tycho.optimizer
---@field lr_schedule? tycho.lr_schedule
---@field seeds? tycho.seeds
---@field data? tycho.data
---@field init? tycho.init
---@field export? tycho.export
---@field train? tycho.train
---@field checkpoint? tycho.checkpoint
---@field log? tycho.log

---@class tycho
---@field version string
local tycho = {}

---Marks a table as a plan; a plan file ends with `return tycho.plan { ... }`.
---@param fields tycho.plan_fields
---@return tycho.plan_fields
function tycho.plan(fields) end

---Deep-merges `overrides` into a copy of `base`: nested tables merge, lists and other values
---replace. The result is a plan when base is one.
---@param base table
---@param overrides table
---@return table
function tycho.extend(base, overrides) end

return tycho
