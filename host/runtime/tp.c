/* Tensor-parallel conversions between the layouts of plan/tp_layout.h, on a model's TP group:
 * the collective (or copy) each conversion names, with the staging that turns a sharded layout's
 * strided parts into the contiguous blocks the comm layer moves. A group of one makes every
 * conversion a copy. Failures are recorded in the model_tp (failed, err), not raised. */
#include "runtime/tp.h"

#include <stdio.h>
#include <string.h>

#include "comm/comm.h"

void tp_failed(struct model_tp *t, const char *what)
{
  if (!t->failed)
    snprintf(t->err, sizeof t->err, "tensor-parallel %s: %s", what, comm_error());
  t->failed = 1;
}

void tp_all_reduce(struct model_tp *t, real *buf, size_t n, enum comm_reduce op)
{
  if (comm_all_reduce(t->group, buf, buf, n, COMM_REAL, op, NULL))
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

/* full (outer, tp, inner) → this rank's part (outer, inner). */
static void take_chunk(real *part, const real *full, struct chunks c, int tp, int rank)
{
  for (size_t o = 0; o < c.outer; o++)
    memmove(part + o * c.inner, full + (o * tp + rank) * c.inner, c.inner * sizeof(real));
}

/* Every rank's part → full (outer, tp, inner), through the staging buffer. */
static void all_gather_chunks(struct model_tp *t, real *full, const real *part, struct chunks c,
                              real *pack)
{
  const int tp = t->size;
  if (comm_all_gather(t->group, part, pack, c.outer * c.inner, COMM_REAL, NULL))
    tp_failed(t, "all-gather");
  for (int r = 0; r < tp; r++)
    for (size_t o = 0; o < c.outer; o++)
      memcpy(full + (o * tp + r) * c.inner, pack + ((size_t)r * c.outer + o) * c.inner,
             c.inner * sizeof(real));
}

static void reduce_scatter_chunks(struct model_tp *t, real *part, const real *full,
                                  struct chunks c, real *pack)
{
  const int tp = t->size;
  for (int r = 0; r < tp; r++)
    for (size_t o = 0; o < c.outer; o++)
      memcpy(pack + ((size_t)r * c.outer + o) * c.inner, full + (o * tp + r) * c.inner,
             c.inner * sizeof(real));
  if (comm_reduce_scatter(t->group, pack, part, c.outer * c.inner, COMM_REAL, COMM_SUM, NULL))
    tp_failed(t, "reduce-scatter");
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
      memcpy(out, in, tp_local_elems(from, B, T, X, tp) * sizeof(real));
    break;
  case TP_OP_SLICE:
    take_chunk(out, in, chunks_of(to, B, T, X, tp), tp, rank);
    break;
  case TP_OP_ALL_REDUCE:
    if (out != in)
      memcpy(out, in, (size_t)B * T * X * sizeof(real));
    tp_all_reduce(t, out, (size_t)B * T * X, COMM_SUM);
    break;
  case TP_OP_ALL_GATHER:
    all_gather_chunks(t, out, in, chunks_of(from, B, T, X, tp), pack);
    break;
  case TP_OP_REDUCE_SCATTER:
    reduce_scatter_chunks(t, out, in, chunks_of(to, B, T, X, tp), pack);
    break;
  case TP_OP_ALL_GATHER_SLICE:
    all_gather_chunks(t, tmp, in, chunks_of(from, B, T, X, tp), pack);
    take_chunk(out, tmp, chunks_of(to, B, T, X, tp), tp, rank);
    break;
  case TP_OP_KEEP_RANK0:
    if (rank != 0)
      memset(out, 0, (size_t)B * T * X * sizeof(real));
    else if (out != in)
      memcpy(out, in, (size_t)B * T * X * sizeof(real));
    break;
  default: /* plan_validate refuses the plans that would need one; the same on every rank */
    if (!t->failed)
      snprintf(t->err, sizeof t->err, "tensor parallelism: no conversion from %s to %s", tp_layout_name(from),
               tp_layout_name(to));
    t->failed = 1;
  }
  return out;
}

void tp_expand_kv(const struct model_tp *t, const struct plan_model *c, real *out, const real *in,
                  int BT, int NHl)
{
  const int HS = c->head_dim, group = c->n_heads / c->n_kv_heads, h0 = t->rank * NHl;
  for (int bt = 0; bt < BT; bt++)
    for (int i = 0; i < NHl; i++)
      memcpy(out + ((size_t)bt * NHl + i) * HS,
             in + ((size_t)bt * c->n_kv_heads + (h0 + i) / group) * HS, (size_t)HS * sizeof(real));
}

void tp_expand_kv_backward(const struct model_tp *t, const struct plan_model *c, real *out,
                           const real *in, int BT, int NHl)
{
  const int HS = c->head_dim, NKV = c->n_kv_heads, group = c->n_heads / NKV, h0 = t->rank * NHl;
  memset(out, 0, (size_t)BT * NKV * HS * sizeof(real));
  for (int bt = 0; bt < BT; bt++)
    for (int i = 0; i < NHl; i++) {
      real *o = out + ((size_t)bt * NKV + (h0 + i) / group) * HS;
      const real *g = in + ((size_t)bt * NHl + i) * HS;
      for (int e = 0; e < HS; e++) o[e] += g[e];
    }
}

