/* Tensor-parallel conversions between the layouts of layout/tp_layout.h, on a model's TP group:
 * the collective (or copy) each conversion names, with the staging that turns a sharded layout's
 * strided parts into the contiguous blocks the comm layer moves. A group of one makes every
 * conversion a copy. Copies and staging go through the model's kernel table (t->k: copy,
 * copy_rows, zero), never touching the memory from here. Failures are recorded in the
 * model_tp (failed, err), not raised. */
#include "runtime/parallel/tp.h"

#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/parallel/dcomm.h"
#include "ops.h"
#include "runtime/model/hostview.h"

void tp_failed(struct model_tp *t, const char *what)
{
  char msg[256]; /* the bound the model's messages had */
  snprintf(msg, sizeof msg, "tensor-parallel %s: %s", what, comm_error());
  fault_set(FAULT_OF(t), FAULT_LEVEL_MODEL, "%s", msg);
}

void tp_all_reduce(struct model_tp *t, real *buf, size_t n, enum comm_reduce op)
{
  if (dcomm_all_reduce(DCOMM_OF(t), t->group, buf, buf, n, COMM_REAL, op, NULL))
    tp_failed(t, "all-reduce");
}

/* A tensor in a sharded layout seen as (outer, tp, inner): rank r holds [:, r, :]. */
struct chunks {
  size_t outer, inner;
};

static struct chunks chunks_of(enum tp_layout l, int B, int T, int X, int tp)
{
  struct chunks c = { (size_t)B * T, (size_t)X / tp }; /* FEAT */
  if (l == TP_SEQ) {
    c.outer = (size_t)B;
    c.inner = (size_t)(T / tp) * X;
  }
  return c;
}

/* full (outer, tp, inner) → this rank's part (outer, inner); part may be full (in place: row o
 * moves down to o·inner from (o·tp + rank)·inner, never onto a row not yet moved). */
static void take_chunk(const struct model_tp *t, real *part, const real *full, struct chunks c, int tp,
                       int rank)
{
  const size_t row = c.inner * sizeof(real);
  size_t first = part == full && rank == 0 ? 1 : 0; /* row 0 already in place */
  if (first >= c.outer)
    return;
  t->k->copy_rows(t->kctx, part + first * c.inner, row, full + (first * tp + rank) * c.inner,
                  (size_t)tp * row, row, c.outer - first);
}

/* Every rank's part → full (outer, tp, inner), through the staging buffer. */
static void all_gather_real(struct model_tp *t, real *full, const real *part, struct chunks c, real *pack)
{
  const int tp = t->size;
  if (dcomm_all_gather(DCOMM_OF(t), t->group, part, pack, c.outer * c.inner, COMM_REAL, NULL))
    tp_failed(t, "all-gather");
  const size_t row = c.inner * sizeof(real);
  for (int r = 0; r < tp; r++)
    t->k->copy_rows(t->kctx, full + (size_t)r * c.inner, (size_t)tp * row, pack + (size_t)r * c.outer * c.inner,
                    row, row, c.outer);
}

static void reduce_scatter_real(struct model_tp *t, real *part, const real *full, struct chunks c, real *pack)
{
  const int tp = t->size;
  const size_t row = c.inner * sizeof(real);
  for (int r = 0; r < tp; r++)
    t->k->copy_rows(t->kctx, pack + (size_t)r * c.outer * c.inner, row, full + (size_t)r * c.inner,
                    (size_t)tp * row, row, c.outer);
  if (dcomm_reduce_scatter(DCOMM_OF(t), t->group, pack, part, c.outer * c.inner, COMM_REAL, COMM_SUM, NULL))
    tp_failed(t, "reduce-scatter");
}

/* The bf16 wire (wire_bf16): what a rank sends is its tensor rounded to bf16 once (round to
 * nearest even, the kernel table's round_bf16), what arrives is widened back, so every rank ends
 * with the same values, its own part rounded as the others' are. A reduction adds in fp32 and
 * rounds each combination once (the comm layer's bf16 sum: NCCL's, or the MPI backend's own op).
 * The staging buffer (n reals for n = the whole tensor's elements, at least 4n bytes) holds two
 * bf16 tensors of n: lo = pack, hi = lo + n. */
static void all_gather_bf16(struct model_tp *t, real *full, const real *part, struct chunks c, real *pack)
{
  const int tp = t->size;
  const size_t n_part = c.outer * c.inner, n = n_part * (size_t)tp, row = c.inner * sizeof(bf16);
  bf16 *lo = (bf16 *)pack, *hi = lo + n;
  t->k->round_bf16(t->kctx, hi, part, n_part);
  if (dcomm_all_gather(DCOMM_OF(t), t->group, hi, lo, n_part, COMM_BF16, NULL))
    tp_failed(t, "all-gather");
  for (int r = 0; r < tp; r++) /* (tp, outer, inner) → (outer, tp, inner) */
    t->k->copy_rows(t->kctx, hi + (size_t)r * c.inner, (size_t)tp * row, lo + (size_t)r * n_part, row, row,
                    c.outer);
  t->k->widen_bf16(t->kctx, full, hi, n);
}

static void reduce_scatter_bf16(struct model_tp *t, real *part, const real *full, struct chunks c, real *pack)
{
  const int tp = t->size;
  const size_t n_part = c.outer * c.inner, n = n_part * (size_t)tp, row = c.inner * sizeof(bf16);
  bf16 *lo = (bf16 *)pack, *hi = lo + n;
  t->k->round_bf16(t->kctx, hi, full, n);
  for (int r = 0; r < tp; r++) /* (outer, tp, inner) → (tp, outer, inner) */
    t->k->copy_rows(t->kctx, lo + (size_t)r * n_part, row, hi + (size_t)r * c.inner, (size_t)tp * row, row,
                    c.outer);
  if (dcomm_reduce_scatter(DCOMM_OF(t), t->group, lo, hi, n_part, COMM_BF16, COMM_SUM, NULL))
    tp_failed(t, "reduce-scatter");
  t->k->widen_bf16(t->kctx, part, hi, n_part);
}

static void all_gather_chunks(struct model_tp *t, real *full, const real *part, struct chunks c, real *pack)
{
  (t->wire_bf16 ? all_gather_bf16 : all_gather_real)(t, full, part, c, pack);
}

static void reduce_scatter_chunks(struct model_tp *t, real *part, const real *full, struct chunks c, real *pack)
{
  (t->wire_bf16 ? reduce_scatter_bf16 : reduce_scatter_real)(t, part, full, c, pack);
}

/* out ← the sum of every rank's in (n elements): in reals, or on the bf16 wire through pack. */
static void all_reduce_act(struct model_tp *t, real *out, const real *in, size_t n, real *pack)
{
  if (!t->wire_bf16) {
    if (out != in)
      t->k->copy(t->kctx, out, in, n * sizeof(real));
    tp_all_reduce(t, out, n, COMM_SUM);
    return;
  }
  bf16 *lo = (bf16 *)pack;
  t->k->round_bf16(t->kctx, lo, in, n);
  if (dcomm_all_reduce(DCOMM_OF(t), t->group, lo, lo, n, COMM_BF16, COMM_SUM, NULL))
    tp_failed(t, "all-reduce");
  t->k->widen_bf16(t->kctx, out, lo, n);
}

size_t tp_local_elems(enum tp_layout l, int B, int T, int X, int tp)
{
  return l == TP_SEQ || l == TP_FEAT ? (size_t)B * T * X / tp : (size_t)B * T * X;
}

real *tp_convert(struct model_tp *t, real *pack, real *out, real *in, enum tp_layout from,
                  enum tp_layout to, int B, int T, int X, real *tmp)
{
  const int tp = t->size, rank = t->rank;
  enum tp_op op = tp == 1 ? TP_OP_NONE : tp_convert_op(from, to);
  switch (op) {
  case TP_OP_NONE:
    if (out != in)
      t->k->copy(t->kctx, out, in, tp_local_elems(from, B, T, X, tp) * sizeof(real));
    break;
  case TP_OP_SLICE:
    take_chunk(t, out, in, chunks_of(to, B, T, X, tp), tp, rank);
    break;
  case TP_OP_ALL_REDUCE:
    all_reduce_act(t, out, in, (size_t)B * T * X, pack);
    break;
  case TP_OP_ALL_GATHER:
    all_gather_chunks(t, out, in, chunks_of(from, B, T, X, tp), pack);
    break;
  case TP_OP_REDUCE_SCATTER:
    reduce_scatter_chunks(t, out, in, chunks_of(to, B, T, X, tp), pack);
    break;
  case TP_OP_ALL_GATHER_SLICE:
    all_gather_chunks(t, tmp, in, chunks_of(from, B, T, X, tp), pack);
    take_chunk(t, out, tmp, chunks_of(to, B, T, X, tp), tp, rank);
    break;
  case TP_OP_KEEP_RANK0:
    if (rank != 0)
      t->k->zero(t->kctx, out, (size_t)B * T * X * sizeof(real));
    else if (out != in)
      t->k->copy(t->kctx, out, in, (size_t)B * T * X * sizeof(real));
    break;
  default: /* plan_validate refuses the plans that would need one; the same on every rank */
    fault_set(FAULT_OF(t), FAULT_LEVEL_MODEL, "tensor parallelism: no conversion from %s to %s", tp_layout_name(from),
              tp_layout_name(to));
  }
  return out;
}

void tp_expand_kv(const struct model_tp *t, const struct plan_model *c, real *out, const real *in,
                  int BT, int NHl)
{
  const int HS = c->head_dim, NKV = c->n_kv_heads, group = c->n_heads / NKV, h0 = t->rank * NHl;
  const size_t head = (size_t)HS * sizeof(real);
  for (int i = 0; i < NHl; i++) /* query head i reads KV head (h0 + i) / group, in every token */
    t->k->copy_rows(t->kctx, out + (size_t)i * HS, (size_t)NHl * head, in + (size_t)((h0 + i) / group) * HS,
                    (size_t)NKV * head, head, (size_t)BT);
}

void tp_expand_kv_backward(struct model_tp *t, const struct plan_model *c, real *out,
                           const real *in, int BT, int NHl)
{
  const int HS = c->head_dim, NKV = c->n_kv_heads, group = c->n_heads / NKV, h0 = t->rank * NHl;
  /* arithmetic on the host, through views (on the CPU, the memory itself) */
  const size_t n_out = (size_t)BT * NKV * HS * sizeof(real), n_in = (size_t)BT * NHl * HS * sizeof(real);
  real *o_view = hostview_open(t->k, t->kctx, out, n_out, 0);
  const real *g_view = hostview_open(t->k, t->kctx, in, n_in, 1);
  if (!o_view || !g_view) {
    hostview_close(t->k, t->kctx, out, o_view, n_out, 0);
    hostview_close(t->k, t->kctx, (void *)in, (void *)g_view, n_in, 0);
    fault_set(FAULT_OF(t), FAULT_LEVEL_MODEL, "tensor parallelism: out of host memory for the KV heads' gradient");
    return;
  }
  memset(o_view, 0, n_out);
  for (int bt = 0; bt < BT; bt++)
    for (int i = 0; i < NHl; i++) {
      real *o = o_view + ((size_t)bt * NKV + (h0 + i) / group) * HS;
      const real *g = g_view + ((size_t)bt * NHl + i) * HS;
      for (int e = 0; e < HS; e++) o[e] += g[e];
    }
  hostview_close(t->k, t->kctx, (void *)in, (void *)g_view, n_in, 0);
  hostview_close(t->k, t->kctx, out, o_view, n_out, 1);
}
