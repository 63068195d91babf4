/* The activation and workspace layout of a rank, as layout: every buffer the runtime's activations
 * (runtime/model/model.h, struct model_acts) hold, as an area and an offset in it, for B_max ×
 * T_max tokens over a scope of the rank's layers. Three areas: the saved activations of one slot,
 * the recompute area (what recomputed parts write: one layer's worth, shared by every layer and
 * slot) and the workspace. Each buffer starts on a LAYOUT_ALIGN boundary; bf16 buffers and ids
 * (tokens, targets, the routing's ints) are carved as whole elements of this build's `real`.
 *
 * One walk of the buffers: the runtime (model_acts.c) allocates the areas at these sizes and binds
 * its pointers at these offsets, and the memory bill (bill.h) reads the sizes, so the bill counts
 * what is carved. The buffers are named once, in ACTS_LAYER_BUFFERS and ACTS_BUFFERS, which the
 * layout and the runtime's struct model_acts both follow.
 *
 * Element types, stated here only (every kernel table takes them so: ops.h): every buffer is
 * `real` (fp32: the CPU's and the CUDA kernels' float; the attention scratch too) but the bf16
 * ones of a bf16 plan — ln1_b, o_in_b, ln2_b, down_in_b, head_in_b (the linears' inputs, as their
 * producers write them, on one tensor-parallel rank), a sparse layer's expert rows (moe_x_b,
 * gate_b, up_b, hidden_b, moe_ye_b: what its backward keeps, on any layout), in_b (a product's
 * input rounded, at tp > 1) and dout_b (the products' output gradient) — and the ids (tokens,
 * targets, moe_topi, moe_slot, moe_counts, moe_routed: ints). The areas' sizes n[] are in reals
 * with those carved in, so the runtime allocates n[a] reals and the bill counts n[a] elements of
 * the runtime's real (on the CPU, and for an fp32 cuda plan). */
#ifndef TYCHO_LAYOUT_ACTS_H
#define TYCHO_LAYOUT_ACTS_H
#include <stddef.h>

#include "layout/params.h"

struct kernel_ops;

/* This rank's widths in layer l (features per token), from the layer's layouts. */
struct model_layer_dims {
  int NHl, NKVl;             /* heads the attention runs on here (KV heads after expansion) */
  int w_out[PLAN_N_MODULES]; /* output width of each linear q .. down as stored here */
  int w_in[PLAN_N_MODULES];  /* input width each linear reads */
  int A;                     /* attention output width: NHl · HS */
  int Fl;                    /* SwiGLU width (an expert's in a sparse layer) */
};
void layout_layer_dims(const struct layout_rank *r, int layer, struct model_layer_dims *d);
/* Tokens per sample in the home layout: T, or T / tp under sequence parallelism. */
int layout_home_T(const struct layout_rank *r, int T);
/* Rows of the dispatched buffers of a sparse layer for B × T tokens: B·T·K dropless, else at most
 * min(B·T·K, B·E·capacity(T)). 0 for a dense model. */
size_t layout_moe_rows(const struct plan_model *c, int B, int T);
/* Rows a rank's experts can receive from its ep group (of ep_size): E·B·capacity(T) at capacity
 * (padded), ep·B·T·min(K, E/ep) dropless; layout_moe_rows at ep 1. */
size_t layout_moe_rows_received(const struct plan_model *c, int ep_size, int B, int T);

/* What a set of saved activations covers: layers [first, first + n) and the embedding and head
 * as flagged (all of them only where the rank holds them). NULL: everything the rank holds. */
struct model_acts_scope {
  int first, n, embed, head;
};

/* Where a buffer is: ACTS_UNSET not laid out by this scope (left as it is), ACTS_NULL none, else
 * its area and its offset there in elements. */
enum acts_area { ACTS_UNSET, ACTS_NULL, ACTS_SAVED, ACTS_RECOMPUTE, ACTS_WORK, ACTS_N_AREAS };
struct acts_at {
  size_t off;
  enum acts_area area;
};

/* A layer's buffers (struct model_layer_acts names them the same). */
#define ACTS_LAYER_BUFFERS(X)                                                                      \
  X(ln1) X(ln1_rstd) X(q) X(k) X(v) X(lse) X(atty) X(o_in) X(attn_mask) X(mid)                    \
  X(ln2) X(ln2_rstd) X(gate) X(up) X(hidden) X(down_in) X(mlp_mask) X(ln1_b) X(o_in_b) X(ln2_b)   \
  X(down_in_b) X(moe_probs) X(moe_topw) X(moe_lse) X(moe_topi) X(moe_slot) X(moe_counts)          \
  X(moe_routed) X(moe_xe) X(moe_ye) X(moe_xr) X(gate_b) X(up_b) X(hidden_b) X(moe_x_b) X(moe_ye_b)
/* The buffers outside the layers (struct model_acts names them the same). */
#define ACTS_BUFFERS(X)                                                                            \
  X(lnf) X(lnf_rstd) X(head_in) X(logits) X(losses) X(targets) X(ce_stats) X(rope_cos) X(rope_sin) \
  X(tokens) X(dresidual) X(work_c1) X(work_c2) X(work_c3) X(work_c4) X(in_r) X(in_f) X(dq) X(dk)   \
  X(dv) X(dhidden) X(dgate) X(dup) X(work_f1) X(work_f2) X(pack) X(gains) X(gain_w) X(attn_scratch) \
  X(moe_dxe) X(moe_dye) X(moe_dgate) X(moe_dup) X(moe_dhid) X(moe_logits) X(moe_dtopw) X(moe_aux)  \
  X(moe_pad) X(moe_yr) X(moe_dyr) X(moe_dxr) X(moe_wire_out) X(moe_wire_in) X(head_in_b) X(dout_b) \
  X(in_b) X(moe_xw)

struct acts_layer_layout {
  int in_scope;              /* 0: the layer is not laid out (every buffer ACTS_UNSET) */
#define ACTS_AT_(f) struct acts_at f;
  ACTS_LAYER_BUFFERS(ACTS_AT_)
};

struct acts_layout {
  struct acts_at *residual;  /* (L + 1) */
  struct acts_layer_layout *layers; /* (L) */
  ACTS_BUFFERS(ACTS_AT_)
#undef ACTS_AT_
  size_t n[ACTS_N_AREAS];    /* elements of each area (ACTS_SAVED, ACTS_RECOMPUTE, ACTS_WORK) */
  size_t ids;                /* of n[ACTS_SAVED]: what holds ids rather than compute elements */
};

/* The layout of rank r (its table t: which layers' q|k|v and gate|up are fused) for B_max ×
 * T_max tokens over `scope` (NULL: all). shares 1: a slot that shares another's recompute area
 * and workspace (the workspace is not laid out). k, kctx: the kernel table whose attention
 * scratch the workspace holds. elem_bytes: the bytes of one compute element where the areas
 * live, which sets how many a bf16 buffer takes — 0 for this build's real (the runtime's), 4
 * where a float64 build bills a GPU plan (the GPU runtime's fp32). 0, or −1 out of memory. */
int layout_acts_build(struct acts_layout *a, const struct layout_rank *r, const struct layout_params *t,
                      const struct kernel_ops *k, void *kctx, int B_max, int T_max,
                      const struct model_acts_scope *scope, int shares, size_t elem_bytes);
void layout_acts_free(struct acts_layout *a);

/* A split backward (zero-bubble schedules): the elements a micro-batch of stage `stage` holds
 * between its B and its W — every linear's output gradient (q, k, v, o, gate, up, down and the
 * head: the other operand of its weight-gradient product), in the products' operand dtype
 * (fp32, or bf16 on a bf16 plan), plus, for an embedding tied to a head on the same pipeline
 * rank, its input gradient (dim per token, which W adds after the head's product); at tp > 1
 * every product's input too, whatever each linear's split makes its widths on r, the layouts of
 * a tp rank of the stage's pipeline rank (layout_rank_of_plan; read only at tp > 1) — and at
 * most how many such products the stage has. The executor allocates one such area per
 * micro-batch past B (model.h, struct model_split); the bill counts them. */
double layout_split_held_elems(const struct plan *p, int stage, const struct layout_rank *r);
int layout_split_products(const struct plan *p, int stage);

/* Context parallelism (mesh.cp; runtime/parallel/cp.h). layout_cp_rows: the most rows any of cp
 * ranks holds of a T-long sequence (its two chunks, kernels.h: attention_cp_rank_tokens), T at
 * cp ≤ 1: the rows every cp rank's activations, slot gradients and token ids are sized for, so
 * every cp rank allocates the same. layout_cp_heads: the most query and key/value heads any of
 * rank r's layers runs its attention on (layout_layer_dims: its tensor-parallel share), which the
 * ring's buffers are sized for. */
int layout_cp_rows(int T, int cp);
void layout_cp_heads(const struct layout_rank *r, int *NH, int *NKV);
/* The ring's buffers for B samples of T tokens over cp ranks, NH query and NKV key/value heads of
 * HS (elements of the runtime's real): kv, the k | v pair one rank holds (2 · B · maxTl · NKV ·
 * HS); rows, B · maxTl; scratch, the block kernels' (table k's attention_cp_scratch_n_elems). The
 * runtime (cp_ring_init) allocates from these, and the bill counts them: comm, the transfers'
 * buffers (two received pairs and two travelling dk | dv accumulators: 4 · kv, billed as comm:
 * they are what the ring's sends and receives read and write, as the pipeline's slot gradients
 * and the reduce-scatter outputs are); work, what the blocks compute in (a step's dk | dv share,
 * kv; a block's partial out, rows · NH · HS, and lse, rows · NH; Σ dout · out per row, rows · NH;
 * the scratch), billed as workspace. */
struct layout_cp_ring {
  int maxTl;
  size_t kv, rows, scratch;
  size_t comm, work;
};
void layout_cp_ring(struct layout_cp_ring *out, const struct kernel_ops *k, void *kctx, int B, int T, int cp, int NH,
                    int NKV, int HS);

#endif
