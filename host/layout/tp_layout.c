/* The layout algebra of tensor parallelism (tp_layout.h). The collective list below walks a
 * layer in the order runtime/model/model_passes.c executes it; mpi_tp_equiv compares it with the
 * comm layer's counters. */
#include "layout/tp_layout.h"

#include <stdio.h>
#include <string.h>

enum { COMM_AR = 0, COMM_AG = 1, COMM_RS = 2 }; /* enum comm_op's values (comm/comm.h) */

enum tp_layout tp_home(const struct plan *p)
{
  return p->mesh.tp > 1 && p->sequence_parallel ? TP_SEQ : TP_R;
}

void tp_layer_layout(const struct plan *p, int layer, struct tp_layer_layout *out)
{
  memset(out, 0, sizeof *out);
  const int tp = p->mesh.tp;
  for (int m = 0; m < PLAN_N_MODULES; m++) out->split[m] = PLAN_SPLIT_REPLICATE;
  if (tp > 1 && layer >= 0 && layer < p->model.n_layers)
    memcpy(out->split, p->layers[layer].split, sizeof out->split);
  if (tp > 1) {
    out->split[PLAN_MOD_EMBED] = p->embed_split;
    out->split[PLAN_MOD_HEAD] = p->head_split;
  }
  out->home = tp_home(p);
  out->attn_sharded = out->split[PLAN_MOD_Q] == PLAN_SPLIT_COLUMN;
  out->kv = TP_R;
  if (out->attn_sharded) {
    /* Column k and v hold exactly the KV heads of this rank's query heads (tp divides n_kv_heads,
     * checked by the compiler); otherwise they are brought there from R: a slice when the KV
     * heads split evenly, else each query head's KV head copied out. */
    int kv_split = p->model.n_kv_heads % tp == 0;
    out->kv = kv_split ? TP_FEAT : TP_KV;
  }
  out->mlp_sharded = out->split[PLAN_MOD_GATE] == PLAN_SPLIT_COLUMN ||
                     out->split[PLAN_MOD_UP] == PLAN_SPLIT_COLUMN;
}

enum tp_layout tp_split_input(enum plan_split s)
{
  return s == PLAN_SPLIT_ROW ? TP_FEAT : TP_R;
}

enum tp_layout tp_split_output(enum plan_split s)
{
  switch (s) {
  case PLAN_SPLIT_COLUMN: case PLAN_SPLIT_VOCAB: return TP_FEAT;
  case PLAN_SPLIT_ROW: return TP_P;
  default: return TP_R;
  }
}

enum tp_layout tp_embed_output(enum plan_split s)
{
  return s == PLAN_SPLIT_VOCAB ? TP_P : TP_R;
}

enum tp_layout tp_split_input_grad(enum plan_split s)
{
  switch (s) {
  case PLAN_SPLIT_COLUMN: case PLAN_SPLIT_VOCAB: return TP_P;
  case PLAN_SPLIT_ROW: return TP_FEAT;
  default: return TP_R;
  }
}

enum tp_layout tp_dual(enum tp_layout l)
{
  return l == TP_P ? TP_R : l;
}

enum tp_op tp_convert_op(enum tp_layout from, enum tp_layout to)
{
  if (from == to)
    return TP_OP_NONE;
  switch (from) {
  case TP_R:
    if (to == TP_SEQ || to == TP_FEAT) return TP_OP_SLICE;
    if (to == TP_P) return TP_OP_KEEP_RANK0;
    if (to == TP_KV) return TP_OP_EXPAND_KV;
    break;
  case TP_P:
    if (to == TP_R) return TP_OP_ALL_REDUCE;
    if (to == TP_SEQ || to == TP_FEAT) return TP_OP_REDUCE_SCATTER;
    break;
  case TP_SEQ: case TP_FEAT:
    if (to == TP_R) return TP_OP_ALL_GATHER;
    if (to == TP_SEQ || to == TP_FEAT) return TP_OP_ALL_GATHER_SLICE;
    break;
  default:
    break;
  }
  return TP_OP_INVALID;
}

const char *tp_layout_name(enum tp_layout l)
{
  static const char *const names[] = { "R", "P", "S(seq)", "S(feat)", "KV" };
  return l < TP_N_LAYOUTS ? names[l] : "?";
}

const char *tp_op_name(enum tp_op op)
{
  static const char *const names[] = { "none", "slice", "all-reduce", "all-gather",
                                       "reduce-scatter", "all-gather+slice", "keep-rank0",
                                       "expand-kv", "invalid" };
  return op <= TP_OP_INVALID ? names[op] : "?";
}

int tp_op_comm(enum tp_op op)
{
  switch (op) {
  case TP_OP_ALL_REDUCE: return COMM_AR;
  case TP_OP_ALL_GATHER: case TP_OP_ALL_GATHER_SLICE: return COMM_AG;
  case TP_OP_REDUCE_SCATTER: return COMM_RS;
  default: return -1;
  }
}

/* ---- the collective list ---- */

struct lister {
  struct tp_comm *out;
  int max, n, layer, backward;
};

static void add_entry(struct lister *ls, const char *what, enum tp_op op, long long n_elems, int act)
{
  int comm = tp_op_comm(op);
  if (comm < 0)
    return;
  if (ls->n < ls->max) {
    struct tp_comm *c = &ls->out[ls->n];
    c->layer = ls->layer;
    snprintf(c->what, sizeof c->what, "%s", what);
    c->backward = ls->backward;
    c->op = op;
    c->comm = comm;
    c->n_elems = n_elems;
    c->act = act;
  }
  ls->n++;
}

/* A sum of statistics or of the gains' gradients: in the runtime's reals. */
static void add(struct lister *ls, const char *what, enum tp_op op, long long n_elems)
{
  add_entry(ls, what, op, n_elems, 0);
}

static void conv(struct lister *ls, const char *what, enum tp_layout from, enum tp_layout to,
                 long long n_elems)
{
  add_entry(ls, what, tp_convert_op(from, to), n_elems, 1);
}

/* A norm output feeding linears: the forward conversion to each layout they need (R first). */
static void norm_inputs(struct lister *ls, const char *what, const struct tp_layer_layout *y,
                        int first, int last, long long n)
{
  static const enum tp_layout needs[2] = { TP_R, TP_FEAT };
  for (int k = 0; k < 2; k++) {
    int used = 0;
    for (int m = first; m <= last; m++) used |= tp_split_input(y->split[m]) == needs[k];
    if (used) {
      char label[48];
      snprintf(label, sizeof label, "%s -> %s", what, tp_layout_name(needs[k]));
      conv(ls, label, y->home, needs[k], n);
    }
  }
}

/* Their input gradients: summed per forward conversion, converted once to the home layout. */
static void norm_input_grads(struct lister *ls, const char *what, const struct tp_layer_layout *y,
                             int first, int last, long long n)
{
  static const enum tp_layout needs[2] = { TP_R, TP_FEAT };
  for (int k = 0; k < 2; k++) {
    int used = 0, partial = 0;
    for (int m = first; m <= last; m++)
      if (tp_split_input(y->split[m]) == needs[k]) {
        used = 1;
        partial |= tp_split_input_grad(y->split[m]) == TP_P;
      }
    if (used) {
      char label[48];
      enum tp_layout arrival = needs[k] == TP_FEAT ? TP_FEAT : partial ? TP_P : TP_R;
      snprintf(label, sizeof label, "d %s (%s)", what, tp_layout_name(arrival));
      conv(ls, label, arrival, y->home, n);
    }
  }
}

/* Pieces of a layer's forward, as runtime/model/model_passes.c runs them (and reruns them to
 * recompute): P_QKV norm output to q, k, v and on to the attention; P_CORE the attention's
 * output to o; P_ATTN_OUT o's output to the residual; P_MLP_IN to gate, up and SwiGLU; P_MLP_ACT
 * SwiGLU to down; P_MLP_OUT down's output to the residual. */
enum { P_QKV = 1, P_CORE = 2, P_ATTN_OUT = 4, P_MLP_IN = 8, P_MLP_ACT = 16, P_MLP_OUT = 32, P_ALL = 63 };

static int recompute_pieces(uint8_t rc)
{
  int f = 0;
  if (rc & PLAN_RC_ATTN)
    f |= P_QKV | P_CORE | P_ATTN_OUT;
  if (rc & PLAN_RC_ATTN_CORE)
    f |= P_CORE;
  if (rc & PLAN_RC_MLP)
    f |= P_MLP_IN | P_MLP_ACT;
  if (rc & PLAN_RC_MLP_ACT)
    f |= P_MLP_ACT;
  return f;
}

static void forward_pieces(struct lister *ls, const struct plan *p, int l, long long N, int pieces,
                           const char *prefix)
{
  struct tp_layer_layout y;
  tp_layer_layout(p, l, &y);
  const long long C = p->model.dim, KVD = (long long)p->model.n_kv_heads * p->model.head_dim;
  const long long F = p->model.ffn_dim;
  const uint8_t *s = y.split;
  const enum tp_layout A = y.attn_sharded ? TP_FEAT : TP_R;
  const enum tp_layout M = y.mlp_sharded ? TP_FEAT : TP_R;
  static const char *const names[] = { "q", "k", "v" };
  char label[48], what[40];

  ls->layer = l;
  if (pieces & P_QKV) {
    snprintf(what, sizeof what, "%sattn_norm", prefix);
    norm_inputs(ls, what, &y, PLAN_MOD_Q, PLAN_MOD_V, N * C);
    for (int j = 0; j < 3; j++) {
      enum tp_layout out = tp_split_output(s[PLAN_MOD_Q + j]);
      long long n = (j == 0 ? C : KVD) * N;
      enum tp_layout want = j == 0 ? A : y.kv;
      snprintf(label, sizeof label, "%s%s -> attention", prefix, names[j]);
      conv(ls, label, out, want == TP_KV ? TP_R : want, n); /* KV: through R */
    }
  }
  if (pieces & P_CORE) {
    snprintf(label, sizeof label, "%sattention -> o", prefix);
    conv(ls, label, A, tp_split_input(s[PLAN_MOD_O]), N * C);
  }
  if (pieces & P_ATTN_OUT) {
    snprintf(label, sizeof label, "%so -> residual", prefix);
    conv(ls, label, tp_split_output(s[PLAN_MOD_O]), y.home, N * C);
  }
  if (pieces & P_MLP_IN) {
    snprintf(what, sizeof what, "%smlp_norm", prefix);
    norm_inputs(ls, what, &y, PLAN_MOD_GATE, PLAN_MOD_UP, N * C);
    snprintf(label, sizeof label, "%sgate -> swiglu", prefix);
    conv(ls, label, tp_split_output(s[PLAN_MOD_GATE]), M, N * F);
    snprintf(label, sizeof label, "%sup -> swiglu", prefix);
    conv(ls, label, tp_split_output(s[PLAN_MOD_UP]), M, N * F);
  }
  if (pieces & P_MLP_ACT) {
    snprintf(label, sizeof label, "%sswiglu -> down", prefix);
    conv(ls, label, M, tp_split_input(s[PLAN_MOD_DOWN]), N * F);
  }
  if (pieces & P_MLP_OUT) {
    snprintf(label, sizeof label, "%sdown -> residual", prefix);
    conv(ls, label, tp_split_output(s[PLAN_MOD_DOWN]), y.home, N * C);
  }
}

static void layer_comms(struct lister *ls, const struct plan *p, int l, long long N)
{
  ls->backward = 0;
  forward_pieces(ls, p, l, N, P_ALL, "");
}

static void layer_grad_comms(struct lister *ls, const struct plan *p, int l, long long N)
{
  struct tp_layer_layout y;
  tp_layer_layout(p, l, &y);
  const long long C = p->model.dim, KVD = (long long)p->model.n_kv_heads * p->model.head_dim;
  const long long F = p->model.ffn_dim;
  const uint8_t *s = y.split;
  const enum tp_layout A = y.attn_sharded ? TP_FEAT : TP_R;
  const enum tp_layout M = y.mlp_sharded ? TP_FEAT : TP_R;
  static const char *const names[] = { "q", "k", "v" };
  char label[48];

  ls->backward = 1;
  if (p->layers[l].recompute) /* what the policy discarded, computed again first */
    forward_pieces(ls, p, l, N, recompute_pieces(p->layers[l].recompute), "recompute: ");
  ls->layer = l;
  conv(ls, "d down output", y.home, tp_dual(tp_split_output(s[PLAN_MOD_DOWN])), N * C);
  conv(ls, "d swiglu output", tp_split_input_grad(s[PLAN_MOD_DOWN]), M, N * F);
  conv(ls, "d gate output", M, tp_dual(tp_split_output(s[PLAN_MOD_GATE])), N * F);
  conv(ls, "d up output", M, tp_dual(tp_split_output(s[PLAN_MOD_UP])), N * F);
  norm_inputs(ls, "mlp_norm (again)", &y, PLAN_MOD_GATE, PLAN_MOD_UP, N * C);
  norm_input_grads(ls, "mlp_norm", &y, PLAN_MOD_GATE, PLAN_MOD_UP, N * C);

  conv(ls, "d o output", y.home, tp_dual(tp_split_output(s[PLAN_MOD_O])), N * C);
  conv(ls, "d attention output", tp_split_input_grad(s[PLAN_MOD_O]), A, N * C);
  for (int j = 0; j < 3; j++) {
    enum tp_layout out = tp_split_output(s[PLAN_MOD_Q + j]);
    long long n = (j == 0 ? C : KVD) * N;
    enum tp_layout have = j == 0 ? A : y.kv;
    snprintf(label, sizeof label, "d %s output", names[j]);
    if (have == TP_KV) /* scattered back to a zero-padded whole: partial sums */
      conv(ls, label, TP_P, tp_dual(out), n);
    else
      conv(ls, label, have, tp_dual(out), n);
  }
  norm_inputs(ls, "attn_norm (again)", &y, PLAN_MOD_Q, PLAN_MOD_V, N * C);
  norm_input_grads(ls, "attn_norm", &y, PLAN_MOD_Q, PLAN_MOD_V, N * C);
  if (y.home == TP_SEQ)
    add(ls, "norm gains (sequence parallel)", TP_OP_ALL_REDUCE, 2 * C);
}

int tp_comm_list(const struct plan *p, int B, int T, struct tp_comm *out, int max)
{
  struct lister ls = { out, max, 0, -1, 0 };
  if (p->mesh.tp <= 1)
    return 0;
  const long long N = (long long)B * T, C = p->model.dim;
  const int L = p->model.n_layers;
  const enum tp_layout H = tp_home(p);
  /* forward: embedding, layers, head with the vocab-parallel cross-entropy */
  ls.layer = -1;
  conv(&ls, "embedding -> residual", tp_embed_output(p->embed_split), H, N * C);
  for (int l = 0; l < L; l++) layer_comms(&ls, p, l, N);
  ls.layer = L;
  conv(&ls, "final_norm -> head", H, TP_R, N * C);
  if (p->head_split == PLAN_SPLIT_VOCAB) {
    add(&ls, "cross-entropy max", TP_OP_ALL_REDUCE, N);
    add(&ls, "cross-entropy sum-exp, target", TP_OP_ALL_REDUCE, 2 * N);
  }
  /* backward: head, layers from the last, embedding */
  ls.backward = 1;
  conv(&ls, "d final_norm output", tp_split_input_grad(p->head_split), H, N * C);
  if (H == TP_SEQ)
    add(&ls, "final_norm gain (sequence parallel)", TP_OP_ALL_REDUCE, C);
  for (int l = L - 1; l >= 0; l--) layer_grad_comms(&ls, p, l, N);
  ls.layer = -1;
  ls.backward = 1;
  conv(&ls, "d embedding output", H, tp_dual(tp_embed_output(p->embed_split)), N * C);
  return ls.n;
}
