/* The model: Hugging Face LlamaForCausalLM in fp32 on a kernel table (kernels/ops.h) — its
 * parameter table (HF names and shapes), the initialization every rank agrees on, the saved
 * activations, and forward/backward split into embedding, one layer, and head, so that a
 * pipeline stage can run any subset of layers. The model computes on "B, T" given by the caller;
 * windows, micro-batches and the loss scale belong to the training loop (train.h).
 *
 * Kernels: a model captures the selected table and its context (kernels_active,
 * kernels_active_context) when its table is built, and every kernel call on its tensors goes
 * through them: m->k->linear_forward(m->kctx, ...) here, in model_passes.c, and in the optimizer
 * and dp_optim.c, which take them from the model they update.
 *
 * Block l: x += drop(o(attn(rope(q(n1)), rope(k(n1)), v(n1)))), n1 = rmsnorm(x);
 *          x += drop(down(silu(gate(n2)) ⊙ up(n2))),           n2 = rmsnorm(x).
 * Head:    logits = rmsnorm(x) · headᵀ, head = lm_head.weight or, tied, the embedding.
 *
 * Dimension legend (as kernels/ops.h): B batch, T sequence, C model dim, NH query heads, NKV
 * key/value heads, HS head size, F ffn dim, V vocab, Vp padded vocab (rows stored for the
 * embedding and the head; rows V..Vp−1 are zero and never reach the loss), L layers. */
#ifndef TYCHO_RUNTIME_MODEL_H
#define TYCHO_RUNTIME_MODEL_H
#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "plan/plan.h"
#include "layout/acts.h"
#include "layout/params.h"
#include "layout/tp_layout.h"
#include "real.h"
#include "util/fault.h"

#define MODEL_NAME_MAX LAYOUT_NAME_MAX
#define MODEL_MOE_MAX_EXPERTS 1024 /* model.moe.experts at most */
/* Every parameter tensor and activation buffer starts on a 64-byte boundary (layout/params.h). */
#define MODEL_ALIGN_FLOATS LAYOUT_ALIGN

struct comm_group;
struct cp_ring;

/* The parameter kinds (enum model_param_kind) are the layout's (layout/params.h). */

/* Dropout sites, the low byte of the Philox counter c3 = (layer << 8) | site. */
enum model_dropout_site { MODEL_DROP_ATTN_PROBS, MODEL_DROP_ATTN_OUT, MODEL_DROP_MLP_OUT };

/* A parameter: the layout's (struct layout_param, whose fields it repeats) bound to memory. */
struct model_param {
  char name[MODEL_NAME_MAX]; /* Hugging Face name, e.g. "model.layers.0.mlp.up_proj.weight" */
  enum model_param_kind kind;
  int layer;                 /* −1 outside the blocks */
  int expert;                /* the expert of a MODEL_EXPERT_* tensor, else −1 */
  int n_dims;                /* 1 (norm gains) or 2 */
  int64_t shape[2];          /* Hugging Face shape: unpadded */
  int64_t rows;              /* rows stored: shape[0], or Vp for the embedding and the head */
  size_t n_elems;            /* elements stored on this rank: local[0] · local[1] (2-D) or shape[0] */
  int here;                  /* 1: held on this pipeline rank (else n_elems = 0) */
  int tp_dim;                /* −1 whole on every TP rank; 0 rows or 1 columns split over the TP group */
  int64_t local[2];          /* the stored (rows, columns) on this rank: (rows, shape[1]) cut by tp
                              * along tp_dim; (shape[0], 0) for a norm gain */
  int64_t start[2];          /* where this rank's block starts in the stored (rows, shape[1]) */
  size_t offset;             /* in the flat layout (param_memory, grad_memory), 16-element aligned */
  real *data;               /* (rows, shape[1]) or (shape[0]); NULL where this rank does not hold
                              * it (ZeRO-3 between gathers) */
  real *grad;               /* same shape; accumulates over micro-batches; NULL where not held */
  enum tensor_dtype dtype;   /* the element type of data and grad (the model's kernel table's) */
  int device;                /* the allocator's device data and grad live on (the model's) */
  int weight_decay;          /* 1 for 2-D tensors (embedding, linear, head), 0 for norm gains */
  float init_std;           /* 0.02, scaled by 1/sqrt(2L) for o_proj and down_proj; 0: gain 1.
                             * float in both builds: initial weights are fp32 numbers */
  size_t bf16_offset;        /* where its bf16 compute copy starts in the model's bf16_memory, or
                              * MODEL_NO_BF16 (not held here, or an fp32 model) */
  bf16 *bf16_data;          /* its bf16 copy: in bf16_memory (ZeRO 0-2), or in its gathered
                              * unit's copies while the unit is held (ZeRO 3); else NULL */
};
#define MODEL_NO_BF16 LAYOUT_NO_BF16

/* The bf16 compute copies of a layer's weights (precision.compute = "bf16"). */
struct model_layer_weights_bf16 {
  const bf16 *wq, *wk, *wv, *wo, *wgate, *wup, *wdown;
  const bf16 *attn_norm, *mlp_norm;
};

struct model_layer_weights {
  real *attn_norm;          /* (C) */
  real *wq;                 /* (NH·HS, C) */
  real *wk, *wv;            /* (NKV·HS, C) */
  real *wo;                 /* (C, NH·HS) */
  real *mlp_norm;           /* (C) */
  real *wgate, *wup;        /* (F, C) */
  real *wdown;              /* (C, F) */
  /* a sparse layer (model.moe): the router (E, C) and, per expert e, w1[e] = gate (Fe, C),
   * w3[e] = up (Fe, C), w2[e] = down (C, Fe); wgate, wup, wdown NULL. NULL in a dense layer. */
  real *router;
  real **w1, **w2, **w3;    /* (E) each */
};

/* Tensor parallelism (layout/tp_layout.h): the TP group and each layer's layouts. A model made
 * without a plan (model_create_table) has a group of one and every layout replicated. */
/* The levels the runtime's parts record a failure at (util/fault.h): the outer layer's wins. */
enum { FAULT_LEVEL_MODEL, FAULT_LEVEL_DP, FAULT_LEVEL_EXEC };

struct model_tp {
  struct comm_group *group;  /* NULL: a group of one */
  int size, rank;
  const struct kernel_ops *k; /* the model's kernel table and context: staging copies */
  void *kctx;
  int comm_mode;             /* the model's: how its collectives travel (enum dcomm_mode, dcomm.h) */
  int wire_bf16;             /* a bf16 model's: the conversions move activations and their gradients
                              * in bf16 (tp.c), the loss's statistics and gains' sums stay reals */
  void *comm_stream;         /* the model's: the CUDA stream NCCL operations go on (comm_mode nccl) */
  struct tp_layer_layout *layers; /* (L) */
  struct tp_layer_layout io;      /* embedding and head splits, home layout */
  struct fault *fault;       /* where a failed collective is recorded: the trainer's, or NULL
                              * for own_fault (a model used on its own); read with FAULT_OF */
  struct fault own_fault;
};

struct model {
  /* What the model is laid out from (layout/params.h): the rank, which owns the arrays tp.layers,
   * layer_here, recompute and moe point to, and the parameter table params is built from, whose
   * offsets the data-parallel layout rewrites (dp_layout_build) and which owns layer_param0. */
  struct layout_rank rank;
  struct layout_params table;
  struct plan_model config;  /* head_dim and vocab_padded filled in */
  const struct kernel_ops *k; /* the kernel table, selected when the table was built */
  void *kctx;                /* its execution context (NULL on the CPU) */
  int comm_mode;             /* how collectives on its memory travel: direct, host staging or NCCL
                              * (enum dcomm_mode, runtime/parallel/dcomm.h; the trainer sets it
                              * from plan.comm with dcomm_choose) */
  void *comm_stream;         /* the CUDA stream NCCL operations go on (comm_mode nccl), else NULL */
  int device;                /* the allocator's device its memory lives on (alloc.h; the host on
                              * the CPU), current when the table was built */
  struct model_tp tp;
  /* Pipeline stages: what this pipeline rank holds. Parameters elsewhere have no elements here
   * (n_elems 0, `here` 0) and activations are only laid out for what is here. */
  uint8_t *layer_here;       /* (L) 1: layer l runs on this rank */
  int embed_here, head_here; /* the embedding (first stage); the final norm and head (last) */
  uint8_t *recompute;        /* (L) enum plan_recompute bits: what layer l's backward recomputes */
  uint8_t *moe;              /* (L) 1: layer l's MLP is the sparse one of config.moe */
  int *layer_param0;         /* (L) index in params of layer l's first parameter */
  real **moe_views;          /* the w1/w2/w3 pointer arrays of the layers' weights and grads */
  /* (L) each sparse layer's routing summed over the forwards since model_moe_stats_reset, while
   * moe_collect is 1 (training forwards; the trainer turns it off for evaluation). Host memory;
   * NULL in a dense model. */
  struct model_moe_stat {
    double aux;              /* Σ over sequences of the load-balancing loss (moe_aux_loss) */
    double z;                /* Σ over tokens of logsumexp(router logits)² */
    long long sequences, tokens;
    long long assigned, dropped; /* assignments (tokens · top_k), and those over capacity */
    long long *routed;       /* (E) assignments per expert before dropping */
  } *moe_stat;
  int moe_collect;
  /* expert parallelism (mesh.ep, docs/moe.md): this rank computes experts [rank·E/size,
   * (rank + 1)·E/size) of every sparse layer for the tokens of its ep group, which exchange rows by
   * all-to-all. The table holds only those experts' parameters (the others have no elements
   * here, as another pipeline stage's), so their gradients and AdamW state are this rank's alone;
   * dp.h reduces them over the ranks that hold the same experts. size and rank from the plan and
   * the table's maker (model_create_table_at); group from the trainer (NULL: a group of one, or
   * the bill's table). */
  struct model_ep {
    struct comm_group *group;
    int size, rank;
  } ep;
  /* context parallelism (mesh.cp, runtime/parallel/cp.h; model_cp.c): this rank holds 2 of each
   * sequence's 2·size chunks, its rows chunk `rank` then chunk 2·size − 1 − rank. The passes take
   * the whole sequence's T and token ids and compute on the rank's Tl = attention_cp_rank_tokens
   * rows (model_acts.T is Tl, seq_T the whole T): RoPE at the rows' global positions, the
   * attention through the ring, dropout drawn at the global positions; every other op is per
   * token. size 1 (group NULL): none. The trainer sets group and opens the ring
   * (model_cp_open). */
  struct model_cp {
    struct comm_group *group;
    int size, rank;
    struct cp_ring *ring;    /* B_max × T_max's buffers; reshaped for a shorter forward */
    int *ids;                /* host: a forward's ids cut to this rank's rows (B_max × Tl_max) */
    int seq_T, Tl;           /* of the last forward begun: the whole T, this rank's rows */
  } cp;
  int n_params;
  struct model_param *params; /* (n_params) in Hugging Face order: embedding, layers, norm, head */
  size_t n_elems;            /* floats in the flat layout, padding included */
  real *param_memory;       /* every parameter, contiguous: one norm, one all-reduce; NULL when
                              * the data-parallel layer keeps only a shard (ZeRO-3) */
  real *grad_memory;        /* likewise; NULL under ZeRO-2 and 3 */
  struct model_layer_weights *layers, *layer_grads; /* (L) views into the memories */
  real *wte, *dwte;         /* (Vp, C) */
  real *final_norm, *dfinal_norm; /* (C) */
  real *head, *dhead;       /* (Vp, C); the embedding's when tie_embeddings */
  /* precision.compute = "bf16" (docs/design.md, "Kernels and backends"): the passes read every
   * weight from its bf16 copy — the linears' products on bf16 operands (ops.h, "bf16 compute"),
   * the norms' gains widened from theirs (acts' gain_w), the embedding's rows widened as they are
   * looked up — so what a step computes depends on the copies only; the fp32 weights are the
   * master the optimizer updates (param_memory whole under ZeRO 0; from ZeRO 1 on only the dp
   * shard, runtime/parallel/dp.h: dp_master_sharded, billed "optimizer"), gradients are fp32 or
   * precision.grads. The copies lie at their fp32 weights' flat offsets in bf16_memory (billed
   * "params"); AdamW writes the copies of what it updates (adamw_update_bf16), ZeRO 1 and 2
   * all-gather them in bf16, and dp_bf16_refresh rounds them again after any other write.
   * Under ZeRO 3 there is no bf16_memory: each gathered unit's copies arrive in bf16 from the
   * ranks' shards' copies and are freed with it (runtime/parallel/dp_passes.c). */
  int bf16;
  int grads_bf16;            /* precision.grads = "bf16" (ZeRO 2, 3): the gradients a rank keeps
                              * between micro-batches, its shard, are bf16 and reduce-scatter in
                              * bf16; each backward still sums a unit's in fp32 (dp.h) */
  int zero;                  /* the plan's ZeRO stage (0 for a model made without a plan) */
  size_t n_bf16;             /* elements of bf16_memory, padding included */
  bf16 *bf16_memory;
  int bf16_fresh;            /* 1: the copies hold the fp32 weights rounded */
  struct model_layer_weights_bf16 *layers_bf16; /* (L) views into bf16_memory */
  const bf16 *head_bf16;     /* (Vp, C); the embedding's when tied */
  const bf16 *wte_bf16;      /* (Vp, C) the embedding's */
  const bf16 *final_norm_bf16; /* (C) */
};

/* Allocates the bf16 copies (m->bf16, after the parameter memory is bound); 0, or nonzero out of
 * memory. A no-op for an fp32 model. */
int model_bf16_alloc(struct model *m);
/* The copies from the whole fp32 weights when they are not fresh (after init, a load); a
 * sharded master's are dp_bf16_refresh's. */
void model_bf16_sync(struct model *m);
/* Points the copies of parameters first .. last at block `base`, whose first element is the
 * copy at bf16_offset base_offset (base NULL: at nothing); the views follow at model_bind_views.
 * model_bf16_round rounds those of them whose fp32 weights are bound. ZeRO 3's units. */
void model_bf16_bind(struct model *m, int first, int last, bf16 *base, size_t base_offset);
void model_bf16_round(struct model *m, int first, int last);
/* The copy of parameter p at element `at` of it, or NULL (no copy). */
bf16 *model_param_bf16(const struct model *m, const struct model_param *p, size_t at);

/* This rank's widths in layer l (layout/acts.h). */
void model_layer_dims(const struct model *m, int layer, struct model_layer_dims *d);
/* 1 when layer l's gate and up run as one linear (output width 2F) over the two weights, which
 * the flat layout stores one after the other ("fused"): one tensor-parallel rank, ZeRO ≤ 1
 * (gradients in grad_memory, in the same layout) and F·C a multiple of the alignment, so no gap
 * lies between the weights, their gradients or their bf16 copies. The layer's activations then
 * hold gate and up as rows of [gate | up] (model_layer_acts.gate, (B, T, 2·Fl); up NULL), which
 * the kernels' swiglu_*_rows read, and backward's one product gives the sum of both input
 * gradients. */
int model_gate_up_fused(const struct model *m, int layer);
/* The same for q, k and v (one linear of output width (NH + 2·NKV)·HS over the three weights):
 * the layer's q then holds rows of [q | k | v] ((B, T, (NH + 2·NKV)·HS)), k and v point into
 * them, and the kernels' rope_*_qkv and attention_*_qkv read that layout. */
int model_qkv_fused(const struct model *m, int layer);
/* Tokens per sample in the home layout: T, or T / tp under sequence parallelism. */
int model_home_T(const struct model *m, int T);

/* Activations of one forward, kept for backward, for up to B_max × T_max tokens. */
/* Sizes are this rank's: "Th" is T, or T/tp in the home layout under sequence parallelism;
 * NHl, NKVl the heads the attention runs on here; Fl the ffn columns SwiGLU runs on here. */
struct model_layer_acts {
  real *ln1;                /* (B, Th, C) output of the attention norm */
  real *ln1_rstd;           /* (B, Th) */
  real *q;                  /* (B, T, NHl, HS) after RoPE; fused (model_qkv_fused): rows of
                             * [q | k | v], k and v pointing into them */
  real *k;                  /* (B, T, NKVl, HS) after RoPE */
  real *v;                  /* (B, T, NKVl, HS) */
  real *lse;                /* (B, NHl, T) each query row's log-sum-exp of its scores: with q, k,
                             * v and atty, all the attention's backward reads (no (T, T) matrix;
                             * the dropout is drawn again from Philox) */
  real *atty;               /* (B, T, NHl·HS) the attention's output, fp32 (bf16 models too) */
  real *o_in;               /* input of o_proj in the layout its split needs (atty when equal) */
  real *attn_mask;          /* (B, Th, C) dropout mask on the attention branch, or NULL */
  real *mid;                /* (B, Th, C) the residual stream between attention and MLP */
  real *ln2;                /* (B, Th, C) output of the MLP norm */
  real *ln2_rstd;           /* (B, Th) */
  real *gate, *up;          /* (B, T, Fl) in SwiGLU's layout; fused (model_gate_up_fused): gate
                             * (B, T, 2·Fl) rows of [gate | up], up NULL */
  real *hidden;             /* (B, T, Fl) silu(gate) ⊙ up */
  real *down_in;            /* input of down_proj in the layout its split needs (hidden when equal) */
  real *mlp_mask;           /* (B, Th, C) dropout mask on the MLP branch, or NULL */
  /* bf16 models on one TP rank: the linears' inputs as their producers write them (ln1, o_in,
   * ln2, down_in stay NULL: no fp32 copy is kept; atty is, for the attention's backward). At
   * tp > 1 these are NULL and the fp32 ones kept, each product rounding its input into in_b. */
  bf16 *ln1_b, *o_in_b, *ln2_b, *down_in_b;
  /* a sparse layer (model_moe.c): the router's outputs, the routing and the dispatched rows
   * (R rows, expert-major: kernels/ops.h). gate, up and hidden then hold (R, Fe) rows. */
  real *moe_probs;          /* (B, T, E) */
  real *moe_topw;           /* (B, T, K) */
  real *moe_lse;            /* (B, T) */
  int *moe_topi, *moe_slot; /* (B, T, K) */
  int *moe_counts, *moe_routed; /* (E) */
  real *moe_xe;             /* (R, C) the experts' inputs */
  real *moe_ye;             /* (R, C) the experts' outputs */
  /* expert parallelism: the rows this rank's experts received from its ep group, source-major,
   * then expert ((R_recv, C): model_moe_rows_received), and how many per (source, local expert)
   * (host memory, ep · E/ep) */
  real *moe_xr;
  int *moe_rows;
  /* a bf16 model's sparse layer keeps its experts' rows in bf16 (moe_xe, moe_ye, moe_xr, gate, up
   * and hidden NULL; model_moe.c): moe_x_b the experts' inputs ((R, C) at ep 1, (R_recv, C) as
   * received under ep), gate_b, up_b and hidden_b ((R_recv, Fe): the w1 and w3 products' outputs
   * rounded, SwiGLU's output), moe_ye_b the experts' outputs back home ((R, C)) */
  bf16 *moe_x_b, *gate_b, *up_b, *hidden_b, *moe_ye_b;
};

struct model_acts {
  int B_max, T_max;
  int B, T;                  /* of the last forward (T: this rank's rows under mesh.cp) */
  int seq_T;                 /* the whole sequence's T of the last forward (T without mesh.cp) */
  int cp_rope_T;             /* mesh.cp: the whole T rope_cos, rope_sin hold this rank's rows of
                              * (model_cp.c); 0: positions 0 … T_max − 1 (model_acts_create's) */
  int moe_in_step;           /* the forward belongs to a training step (dp_run_pass sets it): every
                              * rank of an ep group then runs batch.micro sequences */
  real loss_scale;           /* d(objective)/d(each token's loss), 1/(global · T): set by the
                              * backward's caller (model_backward, the passes) before a layer's
                              * backward; the sparse layers scale their router losses by it */
  int dropout_on;            /* the last forward applied dropout */
  struct model_dropout_state { /* the last forward's dropout, for recompute */
    real p;
    uint64_t seed;
    uint32_t step;
    uint64_t *samples;       /* (B_max) host memory: the host draws the masks' counters */
    uint32_t *c2;            /* (B_max) host memory: each sample's c2 (its index's low 32 bits),
                              * which the attention kernels draw their dropout with */
  } drop;
  int *tokens;               /* (B, T) inputs of the last forward (backend memory) */
  int *targets;              /* (B, T) targets of the last forward through the head with a loss
                              * (backend memory); NULL where the head is not laid out */
  real **residual;          /* (L + 1) of (B_max·Th_max, C): [0] embeddings, [l + 1] output of layer l;
                              * NULL where neither side of it is on this pipeline rank */
  struct model_layer_acts *layers; /* (L) */
  real *lnf;                /* (B, Th, C) final RMSNorm output */
  real *lnf_rstd;           /* (B, Th) */
  real *head_in;            /* (B, T, C) the head's input, gathered (lnf when equal) */
  real *logits;             /* (B, T, Vl): logits, then probabilities (in place), then dlogits;
                              * Vl = Vp, or Vp/tp columns of the vocabulary when the head is split */
  real *losses;             /* (B, T) */
  real *ce_stats;           /* (B, T, 3) vocab-parallel cross-entropy: max, Σ exp, target logit */
  real *rope_cos, *rope_sin; /* (T_max, HS/2) */
  /* workspace, forward and backward (all (B, T, ·) with the full width unless said) */
  real *dresidual;          /* (B, Th, C) gradient of the residual stream */
  real *work_c1, *work_c2, *work_c3, *work_c4; /* (B, T, C) */
  real *in_r, *in_f;        /* (B, T, C) a norm's output brought to R and to FEAT */
  real *dq;                 /* (B, T, C); (B, T, (NH + 2·NKV)·HS) when a layer's q|k|v is fused */
  real *dk, *dv;            /* (B, T, C) */
  real *dhidden, *dgate, *dup; /* (B, T, F); dgate (B, T, 2F) when a layer is fused: [dgate | dup] */
  real *work_f1, *work_f2;  /* (B, T, F) */
  real *pack;               /* (B, T, max(C, F, Vp)) staging for gathers and reduce-scatters */
  real *gains;              /* (2C) norm-gain gradients of sequence-parallel norms */
  real *gain_w;             /* (C) bf16 models: the norm gain in use, widened from its bf16 copy */
  real *attn_scratch;       /* attention_scratch_n_elems(B_max, T_max, NH, NH, HS) */
  /* sparse layers' workspace (NULL in a dense model): R = model_moe_rows(B_max, T_max) */
  real *moe_dxe, *moe_dye;  /* (R, C) */
  real *moe_dgate, *moe_dup, *moe_dhid; /* (R, Fe) */
  real *moe_logits;         /* (B, T, E) the router's logits, then their gradient */
  real *moe_dtopw;          /* (B, T, K) */
  real *moe_aux;            /* (B) the load-balancing loss of each sequence */
  /* expert parallelism: the capacity-padded send buffer ((E · B · capacity, C); NULL dropless),
   * the received rows' outputs and the two backward exchanges ((R_recv, C) each) */
  real *moe_pad, *moe_yr, *moe_dyr, *moe_dxr;
  bf16 *moe_wire_out, *moe_wire_in; /* bf16 models under expert parallelism: the rows an exchange
                                     * sends, rounded, and receives ((max(R_sent, R_recv), C) each) */
  int *moe_rows_memory;     /* host memory: every layer's moe_rows */
  bf16 *head_in_b;          /* bf16 models on one TP rank: the head's input (lnf and head_in NULL) */
  bf16 *dout_b;             /* bf16 models, workspace: a product's output gradient, rounded once
                             * for both of its products ((B, T, max(C, F, Vl))) */
  bf16 *in_b;               /* bf16 models at tp > 1, workspace: a product's fp32 input rounded
                             * ((B, T, max(C, F, NH·HS))); on one tp rank a sparse model's router's
                             * ((B, T, C)); NULL elsewhere (model_passes_bf16.c) */
  real *moe_xw;             /* bf16 models with sparse layers, workspace ((R, C)): the dispatched
                             * rows before they are rounded, then the experts' outputs the combine
                             * reads (widened from moe_ye_b) */
  real *activation_memory;  /* the one block tokens .. rope_sin live in (billed "activations") */
  real *recompute_memory;   /* what recomputed parts write: one layer's worth, shared by every
                              * layer and every slot (billed "activations") */
  real *workspace_memory;   /* the one block dresidual .. attn_scratch live in ("workspace") */
  int shares;                /* 1: recompute and workspace memory belong to another model_acts */
  struct model_split *split; /* a split backward's half in progress (the executor sets it around
                              * a BWD_B or BWD_W); NULL: whole backwards */
};

/* A split backward (zero-bubble schedules, exec.h): B computes every activation gradient and,
 * for each linear's weight gradient, keeps the product's output gradient (in the product's
 * operand dtype: the bf16 rounding on a bf16 model) in `held` and notes the product; W runs the
 * noted products, the same kernel on the same operands (the linears' inputs stay in the
 * micro-batch's slot, or are recomputed as B recomputed them; at tp > 1, where they are the
 * workspace's, B holds copies of them too), so B then W is the whole backward bit for bit. The norms' gains, the embedding and the attention core stay in B, as
 * the cost model prices them (check/cost.c), but for a tied embedding whose head is on the same
 * model: its rows wait for W (after the head's product, into the same gradient), their input
 * gradient held too. One per micro-batch between its B and its W. */
enum model_split_phase { MODEL_SPLIT_B = 1, MODEL_SPLIT_W };
struct model_split_product {
  int layer;                /* the block, L for the head, −1 for a tied embedding's rows (in: the
                             * tokens, IC: dim) */
  real *dweight;            /* where B found the weight gradient; W writes at the same place of
                             * `param`'s gradient as it is bound then (bf16 gradients sum each
                             * pass's in an area of its own: runtime/parallel/dp.h) */
  int param;                /* the parameter whose gradient holds dweight, at element `off`; −1:
                             * none (W writes at dweight) */
  size_t off;
  const void *in, *w;       /* real, or bf16 on a bf16 product */
  int bf16, N, IC, OC;
  size_t at;                /* bytes into held */
  const void *key;          /* tp > 1: the input B read (the fp32 one a bf16 product rounded) */
  int group;                /* tp > 1: the norm_inputs call its input came from */
};
struct model_split {
  enum model_split_phase phase;
  int layer;                /* the piece B is in (the products' owner) */
  int group;                /* counts the norm outputs' conversions (norm_inputs): products of one
                             * group reading the same input share its held copy */
  const void *in_src;       /* set around a bf16 product at tp > 1: the fp32 input it rounds */
  unsigned char *held;      /* runtime memory (ALLOC_ACTIVATIONS), cap bytes */
  size_t cap, used;
  struct model_split_product *products; /* host memory, cap_products */
  int n_products, cap_products;
};

/* The dropout of one forward: masks are drawn from (seed, c1 = step, c2 = sample index (its low
 * 32 bits), c3 = (layer << 8) | site, element index in that sample's full logical tensor: (NH, T,
 * T) for the attention probabilities, (T, C) for a branch). */
struct model_dropout {
  real p;                   /* 0: no dropout (evaluation) */
  uint64_t seed;
  uint32_t step;
  const uint64_t *samples;   /* (B) global sample (window) index of each row */
};

/* Builds the parameter table and allocates parameters and gradients (zeroed; call model_init
 * or weights_load next). cfg->head_dim and cfg->vocab_padded may be 0 (then C/NH and V).
 * 0 ok; nonzero with a message. */
int model_create(struct model *m, const struct plan_model *cfg, char *err, size_t err_size);
/* The parameter table alone: offsets packed as model_create packs them, n_elems set, no memory,
 * every data and grad pointer NULL. The caller lays out and binds the memory (dp.h). */
int model_create_table(struct model *m, const struct plan_model *cfg, char *err, size_t err_size);
/* The same with the sparse layers of a model with experts given (sparse: (L) flags, as a plan's
 * plan_layer.moe; NULL: every layer sparse, as model_create_table makes it). */
int model_create_table_sparse(struct model *m, const struct plan_model *cfg, const uint8_t *sparse,
                              char *err, size_t err_size);
/* The same for this rank of the plan's TP group (tp: NULL for a group of one, else of size
 * mesh.tp) and pipeline rank pp_rank: split parameters hold this rank's block, parameters of
 * stages on other pipeline ranks none, the layers follow the plan's layouts and recompute; with
 * mesh.ep > 1, experts of other ranks of its ep group (ep_rank of mesh.ep) none. */
int model_create_table_tp(struct model *m, const struct plan *p, struct comm_group *tp,
                          int pp_rank, int ep_rank, char *err, size_t err_size);
/* The same without a group: the table TP rank tp_rank of mesh.tp would build (for the memory
 * bill; the group pointers stay NULL). */
int model_create_table_at(struct model *m, const struct plan *p, int tp_rank, int pp_rank, int ep_rank,
                          char *err, size_t err_size);
/* Copies this rank's block of parameter p out of its whole stored tensor (rows, shape[1]).
 * Both in host memory (a file's tensor, a host view of p->data: hostview.h). */
void model_param_take_block(const struct model_param *p, const real *whole, real *block);
/* The inverse: writes the block of TP rank `tp_rank` into the whole stored tensor. */
void model_param_put_block(const struct model_param *p, int tp_size, int tp_rank,
                           const real *block, real *whole);
/* Points every parameter at params + offset and grads + offset (NULL gives NULL), then the views. */
void model_bind_memory(struct model *m, real *params, real *grads);
/* Refreshes the views (layers, layer_grads, wte, head, ...) from the parameters' data and grad
 * pointers; call after changing any of them. */
void model_bind_views(struct model *m);
/* Frees what model_create allocated (param_memory, grad_memory) and the table. */
void model_free(struct model *m);
/* Element i of parameter `name` = init_std · philox_normal(seed, stream = FNV-1a 64 of name,
 * i) for 2-D tensors (i over the unpadded tensor; padding rows stay 0); norm gains = 1. A
 * function of (seed, name, i) only: a TP rank computes its block of the same values.
 * Parameters whose data is NULL are skipped. Written through host views (hostview.h): 0, or −1
 * when a view's host block cannot be had (never on the CPU; err says which tensor). */
int model_init(struct model *m, uint64_t seed, char *err, size_t err_size);
const struct model_param *model_find(const struct model *m, const char *name);
void model_zero_grads(struct model *m);
/* Parameters in the Hugging Face sense (unpadded, the tied head not counted twice). */
long long model_n_params(const struct model *m);

int model_acts_create(struct model_acts *a, const struct model *m, int B_max, int T_max,
                      char *err, size_t err_size);
/* What a set of saved activations covers: struct model_acts_scope (layout/acts.h), where the
 * sizes and offsets of every buffer are laid out. */
/* Another set of saved activations (a pipeline slot for one more micro-batch in flight of one
 * stage: `scope`, NULL for everything) that shares `first`'s workspace and recompute area. */
int model_acts_create_slot(struct model_acts *a, const struct model *m, const struct model_acts *first,
                           const struct model_acts_scope *scope, char *err, size_t err_size);
void model_acts_free(struct model_acts *a);

/* The sparse MLP of layer `layer` (model_moe.c): out (B·T, C) = Σ_k weight · expert(x) over the
 * kept assignments of x (B·T, C), the MLP norm's output; saves what backward reads and adds to
 * the layer's statistics when m->moe_collect. */
void model_moe_forward(struct model *m, struct model_acts *a, int layer, const real *x, real *out);
/* Its backward: dx (B·T, C) = d/dx, assigned; the router's and experts' gradients accumulate;
 * the router losses (model.moe.aux_loss, z_loss) enter here, scaled by a->loss_scale. tmp: a
 * (B·T, C) workspace. */
void model_moe_backward(struct model *m, struct model_acts *a, int layer, const real *x,
                        const real *dout, real *dx, real *tmp);
/* Zeroes every sparse layer's routing statistics. */
void model_moe_stats_reset(struct model *m);

/* Rows of the dispatched buffers of a sparse layer for B × T tokens: B·T·K dropless, else at most
 * min(B·T·K, B·E·capacity(T)). 0 for a dense model. */
size_t model_moe_rows(const struct model *m, int B, int T);
/* Rows a rank's experts can receive from its ep group: E·B·capacity(T) at capacity (padded),
 * ep·B·T·min(K, E/ep) dropless; model_moe_rows at ep 1. */
size_t model_moe_rows_received(const struct model *m, int B, int T);

/* ---- forward and backward (model_passes.c), B ≤ B_max, T ≤ T_max --------------------------- */
/* Starts a forward of B × T tokens: records B, T and the dropout (for recompute). The embedding's
 * forward calls it; a pipeline stage without the embedding calls it itself. */
void model_forward_begin(const struct model *m, struct model_acts *a,
                         const struct model_dropout *dropout, int B, int T);
/* residual[0] = embedding of tokens (B, T, host memory: copied to a->tokens). Starts a forward
 * (model_forward_begin). */
void model_embed_forward(const struct model *m, struct model_acts *a, const int *tokens,
                         const struct model_dropout *dropout, int B, int T);
/* residual[layer + 1] = block `layer` applied to residual[layer]. */
void model_layer_forward(const struct model *m, struct model_acts *a, int layer,
                         const struct model_dropout *dropout);
/* logits from residual[L]; with targets (B, T, host memory: copied to a->targets for backward)
 * also the losses: returns Σ losses (the sum over the B·T tokens, targets −1 excluded), else 0
 * and logits stay in a->logits. */
double model_head_forward(const struct model *m, struct model_acts *a, const int *targets);
/* After model_head_forward: out[i] = the token with the largest logit in row rows[i] (of the
 * B·T rows; the first such token on ties), over the whole vocabulary when the head is split.
 * Collective on the TP group. n ≤ B·T. */
void model_head_argmax(struct model *m, struct model_acts *a, const int *rows, int n, int *out);
/* All of the above: Σ losses of the batch. dropout may be NULL (none). */
double model_forward(const struct model *m, struct model_acts *a, const int *tokens,
                     const int *targets, const struct model_dropout *dropout, int B, int T);

/* dresidual = d(loss_scale · Σ losses)/d residual[L]; head gradients accumulate. After a
 * model_head_forward with targets (it reads them from a->targets). */
void model_head_backward(struct model *m, struct model_acts *a, real loss_scale);
/* dresidual: from d/d residual[layer + 1] to d/d residual[layer]; layer gradients accumulate.
 * First recomputes what the layer's recompute policy discarded in forward. */
void model_layer_backward(struct model *m, struct model_acts *a, int layer);
/* Embedding gradient += dresidual at the forward's tokens. */
void model_embed_backward(struct model *m, struct model_acts *a);
/* Under a->split: B is model_head_backward .. model_embed_backward with phase MODEL_SPLIT_B; W is
 * the same calls with phase MODEL_SPLIT_W (each runs the products its B noted; the embedding's
 * does nothing), W's pieces in B's order. model_split_open: held of cap bytes (the category
 * ALLOC_ACTIVATIONS, on m's device) and room for cap_products products; 0, or −1 out of memory. */
int model_split_open(struct model_split *s, const struct model *m, size_t cap, int cap_products);
void model_split_close(struct model_split *s);
/* All of the above, after model_forward with targets. */
void model_backward(struct model *m, struct model_acts *a, real loss_scale);

#endif
