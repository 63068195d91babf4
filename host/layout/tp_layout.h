/* The layout algebra of tensor parallelism (docs/design.md, "Layout algebra"), as pure functions of
 * the compiled plan: the layout of every activation of a layer on its TP group, the conversion
 * between two layouts, and the list of collectives a micro-batch's forward and backward issue. The
 * runtime (runtime/model/model_passes.c) executes these decisions and `tycho check` prints the list; a
 * test holds the comm layer's counters of a real run to the list, so the two cannot drift apart.
 *
 * Layouts of an activation (B, T, X) on a TP group of size tp:
 *   R     replicated: every rank holds all of it;
 *   P     partial sums: the tensor is the sum of every rank's copy;
 *   SEQ   sharded on the sequence: rank r holds positions [r·T/tp, (r+1)·T/tp) of every sample;
 *   FEAT  sharded on the feature dim: rank r holds columns [r·X/tp, (r+1)·X/tp) (whole heads for
 *         q, k, v and the attention output; an ffn slice for gate, up and their product);
 *   KV    key/value heads expanded to this rank's query heads (when the attention runs on a head
 *         shard and tp does not divide the KV heads evenly into that shard).
 *
 * What each module split needs and produces (a linear y = x·Wᵀ):
 *   replicate  x R → y R        input grad arrives R
 *   column     x R → y FEAT     input grad arrives P (each rank saw part of the outputs)
 *   row        x FEAT → y P     input grad arrives FEAT
 *   vocab      embedding: tokens → P; head: x R → logits FEAT over the padded vocabulary, with
 *              the cross-entropy reduced across the group (max, then Σ exp and the target logit).
 * The residual stream lives in the home layout: R, or SEQ under sequence parallelism. The
 * attention core runs on this rank's query heads when q is column-split (k and v are brought to
 * the matching KV heads), else on all heads (q, k, v brought to R). SwiGLU runs on an ffn slice
 * when gate or up is column-split (the other brought to FEAT), else on all of it.
 *
 * Conversions (forward; the backward of from → to converts the arriving gradient to the dual of
 * `from`: R and P → R, SEQ → SEQ, FEAT → FEAT), tp_convert_op:
 *   equal → nothing; R → SEQ/FEAT slice; P → R all-reduce; P → SEQ/FEAT reduce-scatter;
 *   SEQ/FEAT → R all-gather; SEQ ↔ FEAT all-gather then slice; R → P (gradients only) keep on
 *   rank 0, zero elsewhere.
 * Gradients of one tensor arriving from several consumers are summed per forward conversion
 * they came through (R arrivals joining P ones as "kept on rank 0"), then converted once. */
#ifndef TYCHO_LAYOUT_TP_LAYOUT_H
#define TYCHO_LAYOUT_TP_LAYOUT_H
#include <stddef.h>

#include "plan/plan.h"

enum tp_layout { TP_R, TP_P, TP_SEQ, TP_FEAT, TP_KV, TP_N_LAYOUTS };

enum tp_op {
  TP_OP_NONE,            /* same layout: no work */
  TP_OP_SLICE,           /* keep this rank's part: no communication */
  TP_OP_ALL_REDUCE,
  TP_OP_ALL_GATHER,
  TP_OP_REDUCE_SCATTER,
  TP_OP_ALL_GATHER_SLICE, /* SEQ ↔ FEAT: gather, keep the other part */
  TP_OP_KEEP_RANK0,      /* R → P: rank 0 keeps the values, the others zero */
  TP_OP_EXPAND_KV,       /* R → KV: copy each of this rank's query heads' KV head */
  TP_OP_INVALID
};

/* The layouts of one layer (or of the embedding and head, in `embed` and `head`). */
struct tp_layer_layout {
  uint8_t split[PLAN_N_MODULES]; /* enum plan_split of q .. down (all replicate when tp = 1) */
  enum tp_layout home;           /* of the residual stream and the norms: R or SEQ */
  int attn_sharded;              /* the attention core runs on this rank's query heads */
  enum tp_layout kv;             /* layout of k and v at the attention: FEAT, KV or R */
  int mlp_sharded;               /* SwiGLU on this rank's ffn slice */
};

/* The layer's layouts. tp = 1 gives all-replicated, home R, nothing sharded. */
void tp_layer_layout(const struct plan *p, int layer, struct tp_layer_layout *out);
enum tp_layout tp_home(const struct plan *p);

/* What a linear with this split needs, produces, and how its input gradient arrives. The
 * embedding and head use PLAN_SPLIT_VOCAB / PLAN_SPLIT_REPLICATE. */
enum tp_layout tp_split_input(enum plan_split s);
enum tp_layout tp_split_output(enum plan_split s);
enum tp_layout tp_split_input_grad(enum plan_split s);
/* The embedding's output: P when split by vocabulary (rows outside a rank's shard give 0), else R. */
enum tp_layout tp_embed_output(enum plan_split s);
/* The layout a gradient must reach to flow into the producer of a tensor in layout l. */
enum tp_layout tp_dual(enum tp_layout l);
/* The operation that turns `from` into `to` (TP_OP_INVALID when none exists). */
enum tp_op tp_convert_op(enum tp_layout from, enum tp_layout to);
const char *tp_layout_name(enum tp_layout l);
const char *tp_op_name(enum tp_op op);
/* The comm operation an op issues (enum comm_op values ALL_REDUCE 0, ALL_GATHER 1,
 * REDUCE_SCATTER 2), or −1 for none. */
int tp_op_comm(enum tp_op op);

/* One collective of a micro-batch on the TP group. */
struct tp_comm {
  int layer;            /* −1 embedding, n_layers the head and final norm, else the layer */
  char what[48];        /* the tensor or conversion, e.g. "o -> residual", "qkv input" */
  int backward;         /* 0 forward, 1 backward */
  enum tp_op op;
  int comm;             /* enum comm_op of the collective */
  long long n_elems;    /* the logical elements the comm layer counts: the whole tensor for
                         * all-gather and reduce-scatter, the buffer for all-reduce */
  int act;              /* 1: a layout conversion of an activation or its gradient, which a bf16
                         * model moves in bf16 (traffic_tp_element_bytes); 0: the cross-entropy's statistics
                         * or the norm gains' partial gradients, in the runtime's reals */
};

/* The collectives of one micro-batch (forward and backward, in issue order per direction) for
 * micro-batches of B × T tokens. Writes up to max entries; returns how many there are (so a
 * first call with max 0 sizes the array). With tp = 1 there are none. */
int tp_comm_list(const struct plan *p, int B, int T, struct tp_comm *out, int max);

#endif
