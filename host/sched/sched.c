/* The schedule generators (sched.h): each decides only the order of forwards and backwards
 * (whole, or split into B and W) on every pipeline rank; one expansion then adds the messages,
 * recomputes, gradient reductions and the optimizer the same way for all of them, so they
 * cannot disagree on those. */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* Enough for pp 64 × v 8 × m 4096 with room to spare, small enough to allocate. */
#define SCHED_MAX_COMPUTE (1LL << 24)

const char *sched_op_name(int op)
{
  static const char *const names[] = { "FWD", "BWD", "RECOMPUTE", "SEND_ACT", "RECV_ACT",
                                       "SEND_GRAD", "RECV_GRAD", "REDUCE_GRADS", "OPTIMIZER",
                                       "BWD_B", "BWD_W" };
  return (unsigned)op < SCHED_N_ALL_OPS ? names[op] : "?";
}

const char *sched_instr_text(const struct sched_instr *in, char *buf, size_t n)
{
  const char *name = sched_op_name(in->op);
  switch (in->op) {
  case SCHED_SEND_ACT: case SCHED_SEND_GRAD:
    snprintf(buf, n, "%s(stage %d, mb %d) to rank %d", name, in->stage, in->mb, in->peer);
    break;
  case SCHED_RECV_ACT: case SCHED_RECV_GRAD:
    snprintf(buf, n, "%s(stage %d, mb %d) from rank %d", name, in->stage, in->mb, in->peer);
    break;
  case SCHED_REDUCE_GRADS:
    snprintf(buf, n, "%s(stage %d)", name, in->stage);
    break;
  case SCHED_OPTIMIZER:
    snprintf(buf, n, "%s", name);
    break;
  default:
    snprintf(buf, n, "%s(stage %d, mb %d)", name, in->stage, in->mb);
  }
  return buf;
}

void sched_free(struct sched *s)
{
  if (s->ranks)
    for (int r = 0; r < s->pp; r++)
      free(s->ranks[r].instr);
  free(s->ranks);
  free(s->recompute);
  free(s->costs.fwd);
  free(s->costs.bwd);
  free(s->costs.recompute);
  free(s->costs.w_share);
  memset(s, 0, sizeof *s);
}

static int push(struct sched_list *l, enum sched_op op, int stage, int mb, int peer)
{
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    struct sched_instr *in = realloc(l->instr, (size_t)cap * sizeof *in);
    if (!in)
      return -1;
    l->instr = in;
    l->cap = cap;
  }
  l->instr[l->n++] = (struct sched_instr){ .op = (uint8_t)op, .stage = stage, .mb = mb, .peer = peer };
  return 0;
}

/* Validates the shape and allocates the schedule with default costs and empty lists. */
static int sched_alloc(struct sched *s, enum plan_schedule kind, int pp, int m, int v,
                       const uint8_t *recompute, char *err, size_t n)
{
  memset(s, 0, sizeof *s);
  if (pp < 1 || m < 1 || v < 1) {
    errf(err, n, "schedule %s: pp = %d, micro-batches = %d, virtual stages = %d: each must be at least 1",
         plan_schedule_name(kind), pp, m, v);
    return SCHED_INVALID;
  }
  if ((long long)pp * v * m > SCHED_MAX_COMPUTE / 2) {
    errf(err, n, "schedule %s: pp %d × virtual stages %d × micro-batches %d is too large to schedule",
         plan_schedule_name(kind), pp, v, m);
    return SCHED_INVALID;
  }
  int S = pp * v;
  s->kind = kind;
  s->pp = pp;
  s->v = v;
  s->m = m;
  s->n_stages = S;
  s->ranks = calloc((size_t)pp, sizeof *s->ranks);
  s->recompute = calloc((size_t)S, 1);
  s->costs.fwd = malloc((size_t)S * sizeof(double));
  s->costs.bwd = malloc((size_t)S * sizeof(double));
  s->costs.recompute = malloc((size_t)S * sizeof(double));
  s->costs.w_share = malloc((size_t)S * sizeof(double));
  if (!s->ranks || !s->recompute || !s->costs.fwd || !s->costs.bwd || !s->costs.recompute || !s->costs.w_share) {
    errf(err, n, "schedule %s: out of memory", plan_schedule_name(kind));
    return SCHED_NOMEM;
  }
  for (int i = 0; i < S; i++) {
    s->recompute[i] = recompute ? recompute[i] != 0 : 0;
    s->costs.fwd[i] = 1;
    s->costs.bwd[i] = 2;
    s->costs.recompute[i] = 1;
    s->costs.w_share[i] = 0.5;
  }
  return 0;
}

/* Turns each rank's order of FWD and BWD into the full list: the receive just before the
 * compute that needs it (receives block, so none is posted earlier than it must be), the send
 * just after the compute that produced it, RECOMPUTE before the gradient's receive (it needs
 * only the stage's saved input, so it can run while the gradient travels), REDUCE_GRADS after
 * the stage's last backward, OPTIMIZER last. A split list's B is expanded as a whole backward
 * is (its gradient is what is sent); its W stands alone, and the stage's last W is what
 * REDUCE_GRADS follows. */
static int expand(struct sched *s, char *err, size_t n)
{
  int pp = s->pp, S = s->n_stages;
  int *bwd_done = calloc((size_t)S, sizeof *bwd_done);
  if (!bwd_done)
    goto nomem;
  for (int r = 0; r < pp; r++) {
    struct sched_list order = s->ranks[r], out = { 0, 0, NULL };
    int fail = 0;
    for (int i = 0; i < order.n; i++) {
      int st = order.instr[i].stage, mb = order.instr[i].mb;
      int op = order.instr[i].op;
      if (op == SCHED_FWD) {
        fail |= st > 0 && pp > 1 && push(&out, SCHED_RECV_ACT, st - 1, mb, (st - 1) % pp);
        fail |= push(&out, SCHED_FWD, st, mb, -1);
        fail |= st < S - 1 && pp > 1 && push(&out, SCHED_SEND_ACT, st, mb, (st + 1) % pp);
      } else if (op == SCHED_BWD || op == SCHED_BWD_B) {
        fail |= s->recompute[st] && push(&out, SCHED_RECOMPUTE, st, mb, -1);
        fail |= st < S - 1 && pp > 1 && push(&out, SCHED_RECV_GRAD, st + 1, mb, (st + 1) % pp);
        fail |= push(&out, (enum sched_op)op, st, mb, -1);
        fail |= st > 0 && pp > 1 && push(&out, SCHED_SEND_GRAD, st, mb, (st - 1) % pp);
      }
      if (op == SCHED_BWD_W)
        fail |= push(&out, (enum sched_op)op, st, mb, -1);
      if (op == (s->split ? SCHED_BWD_W : SCHED_BWD))
        fail |= ++bwd_done[st] == s->m && push(&out, SCHED_REDUCE_GRADS, st, -1, -1);
    }
    fail |= push(&out, SCHED_OPTIMIZER, -1, -1, -1);
    free(order.instr);
    s->ranks[r] = out;
    if (fail)
      goto nomem;
  }
  free(bwd_done);
  return 0;
nomem:
  free(bwd_done);
  errf(err, n, "schedule %s: out of memory", plan_schedule_name(s->kind));
  return SCHED_NOMEM;
}

/* Pushes FWD or BWD of the given (stage, mb); the expansion completes the list. */
static int compute(struct sched *s, int r, int op, int stage, int mb)
{
  return push(&s->ranks[r], (enum sched_op)op, stage, mb, -1);
}

int sched_gpipe(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t n)
{
  int rc = sched_alloc(s, PLAN_SCHED_GPIPE, pp, m, v, recompute, err, n);
  if (rc)
    return rc;
  int fail = 0;
  for (int r = 0; r < pp; r++) {
    for (int c = 0; c < v; c++)
      for (int mb = 0; mb < m; mb++)
        fail |= compute(s, r, SCHED_FWD, c * pp + r, mb);
    for (int c = v - 1; c >= 0; c--)
      for (int mb = 0; mb < m; mb++)
        fail |= compute(s, r, SCHED_BWD, c * pp + r, mb);
  }
  if (fail) {
    errf(err, n, "schedule gpipe: out of memory");
    return SCHED_NOMEM;
  }
  return expand(s, err, n);
}

int sched_1f1b(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t n)
{
  int rc = sched_alloc(s, PLAN_SCHED_1F1B, pp, m, v, recompute, err, n);
  if (rc)
    return rc;
  if (v != 1) {
    errf(err, n, "schedule 1f1b: virtual stages = %d: 1F1B runs one stage per rank; use the "
         "interleaved schedule for virtual stages", v);
    return SCHED_INVALID;
  }
  int fail = 0;
  for (int r = 0; r < pp; r++) {
    int warmup = pp - r - 1 < m ? pp - r - 1 : m;
    for (int i = 0; i < warmup; i++)
      fail |= compute(s, r, SCHED_FWD, r, i);
    for (int i = 0; i < m - warmup; i++) {
      fail |= compute(s, r, SCHED_FWD, r, warmup + i);
      fail |= compute(s, r, SCHED_BWD, r, i);
    }
    for (int i = m - warmup; i < m; i++)
      fail |= compute(s, r, SCHED_BWD, r, i);
  }
  if (fail) {
    errf(err, n, "schedule 1f1b: out of memory");
    return SCHED_NOMEM;
  }
  return expand(s, err, n);
}

/* The k-th forward (or backward) of rank r, as Megatron-LM's get_model_chunk_id and
 * get_microbatch_id_in_model_chunk: micro-batches go through the chunks in groups of pp;
 * backwards walk the chunks in reverse. */
static int interleaved_compute(struct sched *s, int r, enum sched_op op, int k)
{
  int pp = s->pp, v = s->v, in_group = k % (pp * v);
  int chunk = op == SCHED_FWD ? in_group / pp : v - 1 - in_group / pp;
  return compute(s, r, op, chunk * pp + r, k / (pp * v) * pp + k % pp);
}

int sched_interleaved(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t n)
{
  int rc = sched_alloc(s, PLAN_SCHED_INTERLEAVED, pp, m, v, recompute, err, n);
  if (rc)
    return rc;
  if (v < 2) {
    errf(err, n, "schedule interleaved: virtual stages = %d: needs at least 2; use 1f1b for one "
         "stage per rank", v);
    return SCHED_INVALID;
  }
  if (m % pp) {
    errf(err, n, "schedule interleaved: %d micro-batches is not a multiple of pp = %d (micro-batches "
         "go through each chunk in groups of pp)", m, pp);
    return SCHED_INVALID;
  }
  int total = m * v, fail = 0;
  for (int r = 0; r < pp; r++) {
    int warmup = (pp - r - 1) * 2 + (v - 1) * pp;
    if (m == pp || warmup > total)
      warmup = total;
    for (int k = 0; k < warmup; k++)
      fail |= interleaved_compute(s, r, SCHED_FWD, k);
    for (int i = 0; i < total - warmup; i++) {
      fail |= interleaved_compute(s, r, SCHED_FWD, warmup + i);
      fail |= interleaved_compute(s, r, SCHED_BWD, i);
    }
    for (int i = total - warmup; i < total; i++)
      fail |= interleaved_compute(s, r, SCHED_BWD, i);
  }
  if (fail) {
    errf(err, n, "schedule interleaved: out of memory");
    return SCHED_NOMEM;
  }
  return expand(s, err, n);
}

/* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024): 1F1B's order of forwards with
 * each backward's B where 1F1B runs the backward, so gradients travel upstream after B alone.
 * Rank r holds back up to r of its W's (runs a W only when more than r are pending) and runs
 * the rest after its last B: rank 0 holds none, the last rank pp − 1. A micro-batch is in
 * flight until its W, so every rank's peak is pp, 1F1B's rank 0 count: the pipeline's peak
 * memory stays 1F1B's (later ranks hold more than under 1F1B, never more than rank 0 does).
 * The deferred W's fill the cool-down's waits: with equal stages the idle time per rank is
 * (pp − 1)(F + B − W), the time until the first gradient comes back. */
int sched_zb_h1(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t n)
{
  int rc = sched_alloc(s, PLAN_SCHED_ZB_H1, pp, m, v, recompute, err, n);
  if (rc)
    return rc;
  s->split = 1;
  if (v != 1) {
    errf(err, n, "schedule zb-h1: virtual stages = %d: ZB-H1 runs one stage per rank", v);
    return SCHED_INVALID;
  }
  if (m < pp) {
    errf(err, n, "schedule zb-h1: %d micro-batch%s for pp = %d: ZB-H1 needs at least pp micro-batches "
         "(with fewer, 1F1B's steady state it fills does not exist; use 1f1b or gpipe)", m, m == 1 ? "" : "es", pp);
    return SCHED_INVALID;
  }
  int fail = 0;
  for (int r = 0; r < pp; r++) {
    int warmup = pp - r - 1, w_done = 0, b_done = 0;
    for (int i = 0; i < warmup; i++)
      fail |= compute(s, r, SCHED_FWD, r, i);
    for (int i = 0; i < m - warmup; i++) {
      fail |= compute(s, r, SCHED_FWD, r, warmup + i);
      fail |= compute(s, r, SCHED_BWD_B, r, b_done++);
      if (b_done - w_done > r)
        fail |= compute(s, r, SCHED_BWD_W, r, w_done++);
    }
    for (int i = m - warmup; i < m; i++) {
      fail |= compute(s, r, SCHED_BWD_B, r, b_done++);
      fail |= compute(s, r, SCHED_BWD_W, r, w_done++);
    }
    while (w_done < m)
      fail |= compute(s, r, SCHED_BWD_W, r, w_done++);
  }
  if (fail) {
    errf(err, n, "schedule zb-h1: out of memory");
    return SCHED_NOMEM;
  }
  return expand(s, err, n);
}

int sched_merge_split(struct sched *s, char *err, size_t n)
{
  if (!s->split)
    return 0;
  for (int r = 0; r < s->pp; r++) {
    struct sched_list *l = &s->ranks[r];
    int k = 0;
    for (int i = 0; i < l->n; i++) {
      struct sched_instr in = l->instr[i];
      if (in.op == SCHED_BWD_W || in.op == SCHED_REDUCE_GRADS)
        continue;
      if (in.op == SCHED_BWD_B)
        in.op = SCHED_BWD;
      l->instr[k++] = in;
    }
    l->n = k;
    /* REDUCE_GRADS back after each stage's last backward and its send (n stays ≤ the old n) */
    for (int i = k - 1; i >= 0; i--) {
      struct sched_instr in = l->instr[i];
      int last = in.op == SCHED_BWD;
      for (int j = i + 1; last && j < l->n; j++)
        last = !(l->instr[j].op == SCHED_BWD && l->instr[j].stage == in.stage);
      if (!last)
        continue;
      int at = i + 1 < l->n && l->instr[i + 1].op == SCHED_SEND_GRAD ? i + 2 : i + 1; /* as expand() */
      memmove(&l->instr[at + 1], &l->instr[at], (size_t)(l->n - at) * sizeof in);
      l->instr[at] = (struct sched_instr){ SCHED_REDUCE_GRADS, in.stage, -1, -1 };
      l->n++;
    }
  }
  s->split = 0;
  return sched_check(s, err, n);
}

int sched_build(struct sched *s, enum plan_schedule kind, int pp, int m, int v, const uint8_t *recompute,
                char *err, size_t n)
{
  switch (kind) {
  case PLAN_SCHED_GPIPE: return sched_gpipe(s, pp, m, v, recompute, err, n);
  case PLAN_SCHED_1F1B: return sched_1f1b(s, pp, m, v, recompute, err, n);
  case PLAN_SCHED_INTERLEAVED: return sched_interleaved(s, pp, m, v, recompute, err, n);
  case PLAN_SCHED_ZB_H1: return sched_zb_h1(s, pp, m, v, recompute, err, n);
  }
  memset(s, 0, sizeof *s);
  errf(err, n, "schedule: unknown kind %d", (int)kind);
  return SCHED_INVALID;
}
