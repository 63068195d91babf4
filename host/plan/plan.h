/* The compiled plan: what a plan file says, validated, with every Lua function already evaluated
 * (docs/design.md, "Plans are compiled once"). Pure data and pure C: nothing here includes lua.h,
 * so the mesh, layout, schedule, cost model and runtime read plans without a Lua state.
 *
 * Dimension legend (as in kernels/ops.h): C model dim, NH query heads, NKV key/value heads,
 * HS head size, F ffn dim, V vocab, Vp padded vocab, L layers, S stages. */
#ifndef TYCHO_PLAN_H
#define TYCHO_PLAN_H
#include <stddef.h>
#include <stdint.h>

#define PLAN_NAME_MAX 128
#define PLAN_PATH_MAX 1024
#define PLAN_TEXT_FILES_MAX 32 /* data.text's files */

enum plan_module {
  PLAN_MOD_EMBED, PLAN_MOD_Q, PLAN_MOD_K, PLAN_MOD_V, PLAN_MOD_O,
  PLAN_MOD_GATE, PLAN_MOD_UP, PLAN_MOD_DOWN, PLAN_MOD_HEAD, PLAN_N_MODULES
};
/* Modules that exist once per layer: q .. down. */
#define PLAN_LAYER_MOD_FIRST PLAN_MOD_Q
#define PLAN_LAYER_MOD_LAST PLAN_MOD_DOWN

enum plan_split { PLAN_SPLIT_REPLICATE, PLAN_SPLIT_COLUMN, PLAN_SPLIT_ROW, PLAN_SPLIT_VOCAB };

/* Recompute parts, one bit each; "full" is all of them. */
enum plan_recompute {
  PLAN_RC_ATTN_NORM = 1 << 0, /* the RMSNorm before attention */
  PLAN_RC_ATTN_CORE = 1 << 1, /* scores, softmax, dropout, ·v (Megatron's "selective") */
  PLAN_RC_ATTN = 1 << 2,      /* the whole attention sub-block */
  PLAN_RC_MLP_NORM = 1 << 3,
  PLAN_RC_MLP_ACT = 1 << 4,   /* SwiGLU */
  PLAN_RC_MLP = 1 << 5,       /* the whole MLP sub-block */
  PLAN_RC_FULL = (1 << 6) - 1,
  PLAN_RC_N_PARTS = 6
};

enum plan_schedule { PLAN_SCHED_GPIPE, PLAN_SCHED_1F1B, PLAN_SCHED_INTERLEAVED, PLAN_SCHED_ZB_H1 };
enum plan_dtype { PLAN_FP32, PLAN_BF16, PLAN_FP16 };
enum plan_decay { PLAN_DECAY_CONSTANT, PLAN_DECAY_COSINE, PLAN_DECAY_LINEAR };
/* cp (context parallelism) comes last so the other axes keep their indexes; its place in the mesh
 * is mesh.order's (default tp, cp, dp, pp). */
enum plan_axis { PLAN_AXIS_TP, PLAN_AXIS_DP, PLAN_AXIS_PP, PLAN_AXIS_CP, PLAN_N_AXES };
enum plan_stages_kind { PLAN_STAGES_EVEN, PLAN_STAGES_BALANCED, PLAN_STAGES_LIST, PLAN_STAGES_FUNCTION };
enum plan_seed { PLAN_SEED_MODEL, PLAN_SEED_DATA, PLAN_SEED_DROPOUT, PLAN_N_SEEDS };
/* Which runtime the plan runs on and `tycho check` describes: "auto" (the default) is CUDA
 * where the build has the CUDA backend and a device is visible, else the CPU (the trainer
 * resolves it at open, runtime/model/device.h; the plan stays a function of its file), "cpu" the
 * CPU runtime, "cuda" the GPU runtime (`check` describes a cuda plan with the GPU runtime's
 * element sizes; `run` refuses it, naming why, without the backend or a device). Not compared on
 * resume: a checkpoint may move between devices. */
enum plan_device { PLAN_DEVICE_AUTO, PLAN_DEVICE_CPU, PLAN_DEVICE_CUDA };
/* How collectives reach the model's memory (runtime/parallel/dcomm.h): "mpi" hands the buffers
 * to MPI as they are (memory the host can see only), "staged" copies them through host staging
 * buffers (any memory, any number of ranks per device), "nccl" is the NCCL backend (not built
 * yet: refused), "auto" (the default) mpi where the host can see the memory, else staged. The
 * trainer resolves it at open; `check` shows it. Not compared on resume: the bits are the same. */
enum plan_comm { PLAN_COMM_AUTO, PLAN_COMM_STAGED, PLAN_COMM_MPI, PLAN_COMM_NCCL };
/* zero_every.grads / .params: how often ZeRO reduce-scatters the gradients (zero ≥ 2) and
 * gathers the parameters (zero 3) within a step: for every micro-batch's backward (and, for the
 * parameters, its forward), or once per step (docs/plans.md). */
enum plan_zero_every { PLAN_ZERO_EVERY_MICRO_BATCH, PLAN_ZERO_EVERY_STEP };

/* model.moe (docs/moe.md): the sparse MLP of the layers plan_layer.moe marks. experts 0: a dense
 * model (no layer is sparse). */
struct plan_moe {
  int experts;             /* experts per sparse layer (Mixtral's num_local_experts) */
  int top_k;               /* experts per token (num_experts_per_tok) */
  int ffn_dim;             /* each expert's SwiGLU width (default model.ffn_dim) */
  double aux_loss;         /* coefficient of the load-balancing loss (default 0.01) */
  double z_loss;           /* coefficient of the router z-loss (default 0: off) */
  double capacity_factor;  /* 0: dropless; else each sequence keeps at most
                            * ceil(capacity_factor · T · top_k / experts) assignments per expert */
  int n_layers;            /* sparse layers */
  int layers_is_function;
};

struct plan_model {
  char family[32];
  int n_layers, dim, n_heads, n_kv_heads, ffn_dim, vocab, max_seq;
  double norm_eps, rope_theta, dropout;
  int tie_embeddings;
  struct plan_moe moe;
  int head_dim;     /* derived: dim / n_heads */
  int vocab_padded; /* derived: vocab rounded up to a multiple of tp when embed or head is vocab-split */
};

struct plan_mesh {
  int world;        /* tp · cp · pp · dp */
  int tp, pp, dp;
  /* context parallelism: each sequence's tokens over cp ranks, two balanced chunks on each
   * (runtime/parallel/cp.h); 1: none */
  int cp;
  int dp_auto;      /* dp was "auto": world / (tp · pp) */
  int world_assumed; /* no world size was given: dp "auto" became 1 */
  enum plan_axis order[PLAN_N_AXES]; /* fastest-varying first */
  /* expert parallelism (model.moe, docs/moe.md): each data-parallel group is cut into groups of
   * ep consecutive dp ranks (the fastest-varying part of dp, next to tp as in Megatron-Core's
   * order tp-ep-dp), whose ranks hold experts/ep experts each of every sparse layer and exchange
   * tokens by all-to-all. ep divides dp and the experts; 0 or 1: none. Read it with plan_ep. */
  int ep;
};
/* mesh.ep, 1 when unset. */
#define plan_ep(p) ((p)->mesh.ep > 1 ? (p)->mesh.ep : 1)

struct plan_stage {
  int index;        /* 0 .. n_stages-1, in model order */
  int pp_rank;      /* index mod pp (Megatron's interleaving: chunk c of rank i is stage c·pp + i) */
  int chunk;        /* index / pp */
  int first_layer;  /* -1 when the stage holds no layer */
  int n_layers;
  int has_embed, has_head; /* the final norm goes with the head */
};

struct plan_layer {
  int stage;
  uint8_t split[PLAN_N_MODULES]; /* enum plan_split for q .. down; embed/head unused here */
  uint8_t recompute;             /* enum plan_recompute bits */
  uint8_t moe;                   /* 1: the MLP is model.moe's sparse MLP */
};

/* Where a field of the plan was written, for error messages: "plans/x.lua:12". */
struct plan_loc {
  char path[96];
  char where[PLAN_PATH_MAX + 32];
};

struct plan {
  char name[PLAN_NAME_MAX];
  char file[PLAN_PATH_MAX];
  struct plan_model model;
  struct plan_mesh mesh;

  enum plan_stages_kind stages_kind;
  int virtual_stages;
  int n_stages;               /* pp · virtual_stages */
  struct plan_stage *stages;  /* (n_stages) */
  struct plan_layer *layers;  /* (n_layers) */
  uint8_t embed_split, head_split;
  int sequence_parallel;
  int tp_split_is_function, recompute_is_function, stages_is_function;
  enum plan_device device;    /* as written ("auto" unless given); plan_on_cpu resolves it */
  enum plan_comm comm;        /* as written ("auto" unless given); the trainer resolves it */

  int zero;
  struct {
    enum plan_zero_every grads, params; /* resolved: as written, else the default (plan_validate) */
    int grads_set, params_set;          /* 1: written in the plan */
  } zero_every;
  double bucket_mb;           /* data-parallel gradient bucket size in MiB (DDP's default 25) */
  enum plan_schedule schedule;
  struct { int global, micro, seq, microbatches; } batch; /* microbatches per step per rank */
  struct { enum plan_dtype compute, grads, master; } precision;
  struct { char kind[16]; double lr, beta1, beta2, eps, weight_decay, grad_clip; } optimizer;
  struct {
    int warmup;
    enum plan_decay decay;
    long long decay_steps;
    int decay_steps_derived; /* 1: not written, so it follows train.steps */
    double min_lr;
  } lr_schedule;
  struct {
    long long global;
    long long value[PLAN_N_SEEDS];
    int derived[PLAN_N_SEEDS]; /* 1: derived from global and the purpose's name */
  } seeds;
  struct {
    char train[PLAN_PATH_MAX], val[PLAN_PATH_MAX], synthetic[32];
    int shuffle;
    /* data.text: text files tokenized at run start into a cached token file (data/text_cache.h) */
    char text[PLAN_TEXT_FILES_MAX][PLAN_PATH_MAX], tokenizer[PLAN_PATH_MAX];
    char fetch[PLAN_PATH_MAX]; /* data.fetch: the command that makes missing texts, for the refusal */
    int n_text;
    double val_fraction; /* the last this fraction of the text's tokens: the validation set */
  } data;
  struct { char from[PLAN_PATH_MAX]; } init;
  struct {
    char path[PLAN_PATH_MAX];
    int every;
    char format[16];  /* "safetensors" (one file) or "hf" (a Hugging Face model folder) */
    double shard_mb;  /* "hf": each shard at most this many MB (10^6 bytes) */
  } export_;
  struct {
    long long steps;
    int eval_every, eval_batches;
    double max_loss_jump; /* 0: off; else a step whose loss exceeds it × the recent mean is skipped */
    struct { /* train.sample: a generation from the prompt after each evaluation (train_run.c) */
      char prompt[256];
      int max_tokens, top_k, given;
      double temperature;
      long long seed;
    } sample;
  } train;
  struct {
    char dir[PLAN_PATH_MAX];
    int every, keep, async;
    uint32_t allow_changes; /* bit i: resume field i (plan_resume_field_name) may differ */
  } checkpoint;
  struct {
    int every;
    char metrics[PLAN_PATH_MAX], trace[PLAN_PATH_MAX];
    int trace_steps; /* the trace holds the run's first trace_steps steps */
    char tensorboard[PLAN_PATH_MAX]; /* a folder of TensorBoard event files; "" none */
    char tensorboard_ranks[8];       /* "0": rank 0 writes; "all": every rank, in DIR/rank<N>/ */
  } log;

  int n_locs, cap_locs;
  struct plan_loc *locs;
};

/* Rows per expert a group of T tokens keeps under model.moe's capacity factor:
 * min(T, ceil(capacity_factor · T · top_k / experts)); 0 when dropless (capacity_factor 0) or
 * the model is dense. */
int plan_moe_capacity(const struct plan_model *m, int T);

/* The all-to-alls of expert parallelism (docs/moe.md, "Expert parallelism") on one ep rank, per
 * sparse layer and micro-batch of batch.micro × batch.seq tokens: the same for every sparse layer,
 * and all 0 at ep 1 (or for a dense model). The comm layer counts a rank's send buffer, its own
 * block included (host/comm/comm.h), and so does this. */
struct plan_ep_exchange {
  int row_calls;          /* all-to-alls of rows: dispatch and combine in forward, their duals in backward (4) */
  long long row_elems;    /* elements each of them sends from a rank: at capacity experts · micro · capacity · dim
                           * (every (peer, expert) block padded to micro · capacity rows), exact; dropless
                           * micro · seq · top_k · dim: exact for the dispatch and the combine's dual (each
                           * of the rank's assignments once, wherever it goes), the mean over the ep group
                           * for the combine and the dispatch's dual (they send back the rows the rank
                           * received, as the routing spread them), so exact summed over the group */
  int count_calls;        /* the row-count exchange before them: 1 dropless, 0 at capacity */
  long long count_bytes;  /* its bytes from a rank: one int32 per expert of each peer, 4 · experts */
  int padded;             /* 1 at capacity: each per-peer block is fixed; 0 dropless: the split follows the routing */
};
struct plan_ep_exchange plan_ep_exchange(const struct plan *p);
/* The expert-parallel traffic of one training step on the ep group of pipeline rank pp_rank: every
 * micro-batch's exchanges of the sparse layers of its stages, with elem_bytes bytes per row element
 * (what the comm layer moves: traffic_element_bytes). Evaluation is not in a step. */
void plan_ep_step_traffic(const struct plan *p, int pp_rank, double elem_bytes, unsigned long long *calls,
                          unsigned long long *bytes);

void plan_init(struct plan *p);
void plan_free(struct plan *p);
/* A deep copy (stages, layers, field locations), to be plan_free'd; 0, or -1 out of memory
 * (dst then empty). */
int plan_copy(struct plan *dst, const struct plan *src);

/* Records where the field `path` was written. 0 ok, -1 out of memory. */
int plan_set_loc(struct plan *p, const char *path, const char *where);
/* Where field `path` was written: the closest known location (the path itself, else its
 * closest recorded parent, else the plan file). Never NULL. */
const char *plan_where(const struct plan *p, const char *path);

/* Names, for messages and output. */
const char *plan_module_name(enum plan_module m);
const char *plan_split_name(enum plan_split s);
const char *plan_schedule_name(enum plan_schedule s);
const char *plan_zero_every_name(enum plan_zero_every e); /* "micro_batch", "step" */
const char *plan_dtype_name(enum plan_dtype d);
const char *plan_decay_name(enum plan_decay d);
const char *plan_axis_name(enum plan_axis a);
/* mesh.order as "tp, dp, pp": cp named only where mesh.cp > 1 (its place changes no rank else). */
const char *plan_mesh_order_text(const struct plan_mesh *m, char *buf, size_t n);
const char *plan_seed_name(enum plan_seed s);
const char *plan_device_name(enum plan_device d);
const char *plan_comm_name(enum plan_comm c);
/* 1 when the plan's figures are this build's CPU runtime's: device "cpu", or "auto" as written
 * (a trainer that finds a CUDA device makes its own copy "cuda"; `check` describes auto as the
 * CPU, saying why); 0 for "cuda". */
int plan_on_cpu(const struct plan *p);
const char *plan_recompute_part_name(int bit_index);
/* "none", "full" or a comma list of parts, into buf. */
const char *plan_recompute_text(uint8_t mask, char *buf, size_t n);

/* What a resume compares (checkpoint.allow_changes, docs/design.md, "Checkpoints"): the fields that
 * change what the run computes, not how it is laid out. The mesh, splits, ZeRO stage, schedule,
 * micro-batch and recompute may change (the checkpoint reshards); these may not, unless the plan
 * lists them in checkpoint.allow_changes. The last PLAN_N_RESUME_PARENTS names are not compared
 * themselves: they are what a derived field follows (seeds.global for the seeds, train.steps for
 * lr_schedule.decay_steps), and allowing one allows the fields that follow it. The names are the
 * plan-field table's EQUAL and PARENT rows (fields.h), in the order of their resume_index. */
#define PLAN_N_RESUME_FIELDS 30
#define PLAN_N_RESUME_PARENTS 2
#define PLAN_N_RESUME_NAMES (PLAN_N_RESUME_FIELDS + PLAN_N_RESUME_PARENTS)
/* checkpoint.allow_changes holds one bit per name */
_Static_assert(PLAN_N_RESUME_NAMES <= 32, "checkpoint.allow_changes is a uint32_t: widen it first");
/* Field i's dotted name (i < PLAN_N_RESUME_NAMES), else NULL. */
const char *plan_resume_field_name(int i);
/* Field i's value in p as text (numbers with all their digits, strings quoted), into buf.
 * Returns the index of the parent name it follows in p (seeds derived from seeds.global,
 * decay_steps from train.steps), or -1. */
int plan_resume_field(const struct plan *p, int i, char *buf, size_t n);

/* The derived seed for a purpose: a Philox4x32-10 draw keyed by the global seed, with the
 * purpose name's FNV-1a hash as the counter, kept to 53 bits so it survives JSON. */
long long plan_derive_seed(long long global, const char *purpose);

/* Forward FLOPs per token of the parts of one layer (a multiply-add counts 2; norms and the
 * SwiGLU product are free). The cost model behind "balanced" stages and the schedule. */
struct plan_layer_flops {
  double attn_proj; /* q, k, v, o */
  double attn_core; /* scores and ·v under the causal mask: 2 · (T/2) · 2 per head dim */
  double mlp;       /* gate, up, down */
};
/* A dense layer's parts (every layer of a dense model). */
struct plan_layer_flops plan_layer_flops(const struct plan *p);
/* Layer l's parts: a sparse layer's mlp is its router (2 · C · experts) and the top_k experts a
 * token goes to (top_k · 6 · C · moe.ffn_dim). */
struct plan_layer_flops plan_layer_flops_of(const struct plan *p, int l);
/* Forward FLOPs per token of the whole model: every layer and the head. */
double plan_model_flops(const struct plan *p);
double plan_head_flops(const struct plan *p); /* the LM head: 2 · dim · vocab */
/* What recomputing the parts in `mask` costs per token (the whole attention block includes its
 * core; norms and SwiGLU are free). */
double plan_recompute_flops(const struct plan_layer_flops *lf, uint8_t mask);
/* Forward FLOPs per token of pipeline stage s (its layers and, on the last, the head) and what
 * its recompute policy adds in backward, for the whole tp group (divide by tp for a rank; a
 * sparse MLP, whole on every tp rank, counts tp times). The
 * one count behind the schedule's costs, the step-time model and the trace's compute spans. */
struct plan_stage_flops { double forward, recompute; };
struct plan_stage_flops plan_stage_flops(const struct plan *p, int s);
/* FLOPs of one micro-batch (batch.micro × batch.seq tokens) through stage s on one rank of its
 * tp group: the forward, or the backward (twice the forward plus what recompute reruns). */
double plan_stage_micro_batch_flops(const struct plan *p, int s, int backward);
/* Bytes of one element of a dtype: 4 for fp32, 2 for bf16 and fp16. */
double plan_dtype_bytes(enum plan_dtype d);

/* Parameters of the model (with the padded vocab when padded): every expert of every sparse
 * layer (model.moe) counted. */
long long plan_param_count(const struct plan *p);
/* The parameters one token's forward uses: as plan_param_count, with top_k experts per sparse
 * layer instead of all of them (the router counted whole). A dense model's are all of them. */
long long plan_active_param_count(const struct plan *p);

/* Checks everything that needs the whole plan (divisibility, mesh, stages, batch, ...) and
 * derives what follows from it. Called by the compiler after reading the fields. 0 ok; -1
 * with a one-line message "<where>: <field> = <value>: <problem>; <hint>" in err. */
int plan_validate(struct plan *p, char *err, size_t err_size);

/* Assigns layers to stages for "even" and "balanced". */
int plan_assign_stages(struct plan *p, char *err, size_t err_size);

/* The stable hash of the compiled plan (FNV-1a 64 over its canonical JSON). */
uint64_t plan_hash(const struct plan *p);

#endif
