/* The parameter table of one rank, as layout: what a rank at (tp, pp, ep) of a plan holds of
 * every parameter (kind, layer, Hugging Face name, shape, its tensor-parallel block, where it
 * sits in the flat layout, whether it is held here at all), and the rank's description the
 * table is computed from (its layers' tensor-parallel layouts, which layers, the embedding and
 * the head it holds, the recompute policy, the sparse layers, the expert-parallel rank).
 *
 * Pure sizes, offsets and shapes: the runtime's model (runtime/model/model.h) builds its
 * parameters from this table and binds memory at its offsets; the memory bill (bill.h) reads the
 * same table without allocating. Parameters live in one contiguous layout, each tensor on a
 * 64-byte boundary (LAYOUT_ALIGN elements); the data-parallel layout (dp_buckets.h) lays them
 * out in buckets instead and rewrites the offsets. */
#ifndef TYCHO_LAYOUT_PARAMS_H
#define TYCHO_LAYOUT_PARAMS_H
#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"
#include "layout/tp_layout.h"

#define LAYOUT_NAME_MAX 96
/* Every parameter tensor and activation buffer starts on a 64-byte boundary: 16 floats. */
#define LAYOUT_ALIGN 16
#define LAYOUT_NO_BF16 ((size_t)-1)

/* The model's parameter kinds, in a layer's table order. */
enum model_param_kind {
  MODEL_EMBED, MODEL_ATTN_NORM, MODEL_Q, MODEL_K, MODEL_V, MODEL_O, MODEL_MLP_NORM,
  MODEL_GATE, MODEL_UP, MODEL_DOWN, MODEL_FINAL_NORM, MODEL_HEAD,
  /* a sparse layer's MLP (model.moe, docs/moe.md), in place of gate, up and down: the router
   * (E, C) and each expert's SwiGLU, Hugging Face Mixtral's w1 = gate (Fe, C), w2 = down (C, Fe),
   * w3 = up (Fe, C) */
  MODEL_ROUTER, MODEL_EXPERT_W1, MODEL_EXPERT_W2, MODEL_EXPERT_W3, MODEL_N_KINDS
};

/* What a rank is, for the layout: from a plan (layout_rank_of_plan) or a whole model on one rank
 * (layout_rank_whole). */
struct layout_rank {
  struct plan_model config;        /* head_dim and vocab_padded filled in by layout_params_build */
  int tp_size, tp_rank;
  struct tp_layer_layout io;       /* embedding and head splits, home layout */
  struct tp_layer_layout *layers;  /* (L); an outline's: the layers here only */
  uint8_t *layer_here;             /* (L) 1: layer l runs on this rank */
  int embed_here, head_here;       /* the embedding (first stage); the final norm and head (last) */
  uint8_t *recompute;              /* (L) enum plan_recompute bits, or NULL (none) */
  uint8_t *moe;                    /* (L) 1: layer l's MLP is sparse, or NULL (a dense model) */
  int ep_size, ep_rank;            /* mesh.ep and this rank's place in its ep group (1, 0 without) */
  int zero;                        /* the plan's ZeRO stage (0 without a plan) */
  int cp_size;                     /* mesh.cp (0 or 1: none): q, k and v are never fused then */
  int bf16;                        /* 1: bf16 compute copies of every parameter (bf16 plan) */
  int grads_bf16;                  /* 1: precision.grads = "bf16" (a bf16 plan's gradient shard) */
  int outline;                     /* see layout_rank_of_plan */
};

/* The rank (tp_rank, pp_rank, ep_rank) of plan p. outline 1: what the memory bill and the traffic
 * read, at a cost in the parameters this rank holds rather than the model's, so that a check of
 * thousands of pipeline stages stays near-linear in them: the layouts of the layers here only,
 * and a table (layout_params_build) with the same parameters, sizes and offsets for the
 * embedding, the final norm, the head and the layers here; the layers elsewhere, which have no
 * elements here, as empty parameters that the data-parallel layout (dp_buckets_build) cuts into
 * the same buckets as their own (it tells parameters apart by unit and by whether they are
 * experts, and nothing empty reaches its bucket-size cut there): one per layer, three for a
 * sparse layer under mesh.ep > 1 (the attention and router, the experts, the norms), and under
 * zero < 2, where units do not cut, one for a run of such layers without those experts; no names.
 * 0, or −1 out of memory with a message. */
int layout_rank_of_plan(struct layout_rank *r, const struct plan *p, int tp_rank, int pp_rank, int ep_rank,
                        int outline, char *err, size_t err_size);
/* A whole model on one rank, without a plan: every layer here, every layout replicated; with
 * experts, the layers flagged in sparse ((L), as a plan's plan_layer.moe; NULL: every layer).
 * 0, or −1 out of memory with a message. */
int layout_rank_whole(struct layout_rank *r, const struct plan_model *cfg, const uint8_t *sparse, char *err,
                      size_t err_size);
void layout_rank_free(struct layout_rank *r);

struct layout_param {
  char name[LAYOUT_NAME_MAX]; /* Hugging Face name, e.g. "model.layers.0.mlp.up_proj.weight"; ""
                               * in an outline */
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
  size_t offset;             /* in the flat layout, LAYOUT_ALIGN-element aligned */
  int weight_decay;          /* 1 for 2-D tensors (embedding, linear, head), 0 for norm gains */
  float init_std;            /* 0.02, scaled by 1/sqrt(2L) for o_proj and down_proj; 0: gain 1 */
  size_t bf16_offset;        /* where its bf16 compute copy starts among the copies, or
                              * LAYOUT_NO_BF16 (not held here, or an fp32 model) */
};

struct layout_params {
  int n;
  struct layout_param *p;    /* (n) in Hugging Face order: embedding, layers, norm, head */
  int *layer_param0;         /* (L) index in p of layer l's first parameter */
  size_t n_elems;            /* elements of the flat layout, padding included */
  size_t n_bf16;             /* elements of the bf16 copies, padding included */
};

/* The table of rank r. Checks r->config first (and fills its head_dim and vocab_padded when 0).
 * 0, or −1 with a message (an inconsistent shape, out of memory). */
int layout_params_build(struct layout_params *t, struct layout_rank *r, char *err, size_t err_size);
void layout_params_free(struct layout_params *t);

/* Whether parameters of kinds first .. last of layer l (one after the other in the table) lie one
 * after the other in the flat layout as laid out and among the bf16 copies, so that one product
 * over them can read their weights and write their gradients as one matrix. One TP rank and ZeRO
 * ≤ 1 only (gradients in one flat memory). */
int layout_params_adjacent(const struct layout_rank *r, const struct layout_params *t, int layer,
                           enum model_param_kind first, enum model_param_kind last);

#endif
