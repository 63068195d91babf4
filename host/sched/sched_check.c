/* sched_check (sched.h): is every rank's list complete and in a legal order? Two passes: the
 * first places every instruction (refusing strangers and repeats), the second walks every
 * (stage, mb) and asks that its forward, backward, recompute and messages exist in the order
 * data flows. In a split list the B half stands where a whole backward would (its gradient is
 * what is sent) and W must follow it on the rank, REDUCE_GRADS following the stage's last W. Whether the lists together can run (no deadlock) is the simulator's question. */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* Where each instruction sits: its index on the rank that must run it, or -1. */
struct places {
  int *fwd, *bwd, *rc, *send_act, *recv_act, *send_grad, *recv_grad; /* (S · m); bwd: BWD or BWD_B */
  int *bww;                                                          /* (S · m) BWD_W */
  int *reduce;                                                       /* (S) */
};

static int *place_of(struct places *pl, int op)
{
  switch (op) {
  case SCHED_FWD: return pl->fwd;
  case SCHED_BWD: case SCHED_BWD_B: return pl->bwd;
  case SCHED_BWD_W: return pl->bww;
  case SCHED_RECOMPUTE: return pl->rc;
  case SCHED_SEND_ACT: return pl->send_act;
  case SCHED_RECV_ACT: return pl->recv_act;
  case SCHED_SEND_GRAD: return pl->send_grad;
  case SCHED_RECV_GRAD: return pl->recv_grad;
  default: return pl->reduce;
  }
}

/* The rank that must run `op` of stage st, or -1 when no such instruction may exist. */
static int owner(const struct sched *s, int op, int st)
{
  int pp = s->pp, S = s->n_stages;
  switch (op) {
  case SCHED_SEND_ACT: return pp > 1 && st < S - 1 ? st % pp : -1;
  case SCHED_RECV_ACT: return pp > 1 && st < S - 1 ? (st + 1) % pp : -1;
  case SCHED_SEND_GRAD: return pp > 1 && st > 0 ? st % pp : -1;
  case SCHED_RECV_GRAD: return pp > 1 && st > 0 ? (st - 1) % pp : -1;
  case SCHED_RECOMPUTE: return s->recompute[st] ? st % pp : -1;
  default: return st % pp;
  }
}

/* The rank a message instruction names as its peer. */
static int expected_peer(const struct sched *s, int op, int st)
{
  switch (op) {
  case SCHED_SEND_ACT: return (st + 1) % s->pp;
  case SCHED_RECV_GRAD: return st % s->pp;
  case SCHED_SEND_GRAD: return (st - 1) % s->pp;
  case SCHED_RECV_ACT: return st % s->pp;
  default: return -1;
  }
}

static int fail(char *err, size_t n, const struct sched *s, int rank, int index, const char *problem,
                const char *detail)
{
  char text[96];
  struct sched_instr in = s->ranks[rank].instr[index];
  errf(err, n, "schedule %s: rank %d #%d %s: %s%s", plan_schedule_name(s->kind), rank, index,
       sched_instr_text(&in, text, sizeof text), problem, detail ? detail : "");
  return SCHED_INCOMPLETE;
}

/* First pass: every instruction well-formed, on the right rank, at most once. */
static int place(const struct sched *s, struct places *pl, char *err, size_t n)
{
  int S = s->n_stages, m = s->m;
  for (int r = 0; r < s->pp; r++) {
    const struct sched_list *l = &s->ranks[r];
    for (int i = 0; i < l->n; i++) {
      const struct sched_instr *in = &l->instr[i];
      char why[160];
      if (in->op >= SCHED_N_ALL_OPS) {
        errf(err, n, "schedule %s: rank %d #%d: unknown operation %d", plan_schedule_name(s->kind), r, i, in->op);
        return SCHED_INCOMPLETE;
      }
      if (s->split && in->op == SCHED_BWD)
        return fail(err, n, s, r, i, "a whole backward in a split (zero-bubble) list: it runs BWD_B and BWD_W", NULL);
      if (!s->split && (in->op == SCHED_BWD_B || in->op == SCHED_BWD_W))
        return fail(err, n, s, r, i, "a split backward in a list of whole backwards (only zero-bubble kinds split)", NULL);
      if (in->op == SCHED_OPTIMIZER) {
        if (i != l->n - 1)
          return fail(err, n, s, r, i, "must be the rank's last instruction", NULL);
        continue;
      }
      if (in->stage < 0 || in->stage >= S) {
        snprintf(why, sizeof why, "%d (pp %d × virtual stages %d)", S, s->pp, s->v);
        return fail(err, n, s, r, i, "no such stage: the stages are 0 .. S-1, S = ", why);
      }
      if (in->op != SCHED_REDUCE_GRADS && (in->mb < 0 || in->mb >= m)) {
        snprintf(why, sizeof why, "%d micro-batches", m);
        return fail(err, n, s, r, i, "no such micro-batch: the step has ", why);
      }
      int who = owner(s, in->op, in->stage);
      if (who < 0)
        return fail(err, n, s, r, i, in->op == SCHED_RECOMPUTE ? "the stage does not recompute"
                    : "no such message: it would leave the pipeline or stay on its rank", NULL);
      if (who != r) {
        snprintf(why, sizeof why, "%d", who);
        return fail(err, n, s, r, i, "runs on the wrong rank: it belongs to rank ", why);
      }
      int peer = expected_peer(s, in->op, in->stage);
      if (peer != in->peer && peer >= 0) {
        snprintf(why, sizeof why, "%d", peer);
        return fail(err, n, s, r, i, "wrong peer: the message goes between this rank and rank ", why);
      }
      int *slot = &place_of(pl, in->op)[in->op == SCHED_REDUCE_GRADS ? in->stage : in->stage * m + in->mb];
      if (*slot >= 0) {
        snprintf(why, sizeof why, "%d", *slot);
        return fail(err, n, s, r, i, "appears twice: first at #", why);
      }
      *slot = i;
    }
    if (l->n == 0 || l->instr[l->n - 1].op != SCHED_OPTIMIZER) {
      errf(err, n, "schedule %s: rank %d: OPTIMIZER missing at the end of its list", plan_schedule_name(s->kind), r);
      return SCHED_INCOMPLETE;
    }
  }
  return 0;
}

/* "rank r: <a> missing" or "<b> at #j comes before <a> at #i". */
static int need(char *err, size_t n, const struct sched *s, int rank, const char *what_a, int a_op, int a_st,
                int mb, int a_at, const char *rel, int b_op, int b_st, int b_at)
{
  char ta[96], tb[96];
  struct sched_instr ia = { (uint8_t)a_op, a_st, mb, expected_peer(s, a_op, a_st) };
  struct sched_instr ib = { (uint8_t)b_op, b_st, mb, expected_peer(s, b_op, b_st) };
  sched_instr_text(&ia, ta, sizeof ta);
  sched_instr_text(&ib, tb, sizeof tb);
  if (a_at < 0)
    errf(err, n, "schedule %s: rank %d: %s missing (%s)", plan_schedule_name(s->kind), rank, ta, what_a);
  else
    errf(err, n, "schedule %s: rank %d: %s at #%d must come %s %s at #%d", plan_schedule_name(s->kind),
         rank, ta, a_at, rel, tb, b_at);
  return SCHED_INCOMPLETE;
}

/* Second pass: for every (stage, mb), the data flows forward and back in order. */
static int flow(const struct sched *s, struct places *pl, char *err, size_t n)
{
  int S = s->n_stages, m = s->m, pp = s->pp;
  const int bop = s->split ? SCHED_BWD_B : SCHED_BWD; /* the backward whose gradient is sent */
  for (int st = 0; st < S; st++)
    for (int mb = 0; mb < m; mb++) {
      int k = st * m + mb, f = pl->fwd[k], b = pl->bwd[k];
      if (f < 0)
        return need(err, n, s, st % pp, "every micro-batch runs forward on every stage", SCHED_FWD, st, mb,
                    -1, "", 0, 0, 0);
      if (b < 0 || b < f)
        return need(err, n, s, st % pp, "every micro-batch runs backward on every stage", bop, st, mb,
                    b, "after", SCHED_FWD, st, f);
      int w = pl->bww[k];
      if (s->split && (w < 0 || w < b))
        return need(err, n, s, st % pp, "every B is followed by its W", SCHED_BWD_W, st, mb, w, "after",
                    SCHED_BWD_B, st, b);
    }
  for (int st = 0; st < S; st++) {
    int r = st % pp, last_bwd = -1;
    for (int mb = 0; mb < m; mb++) {
      int k = st * m + mb, f = pl->fwd[k], b = pl->bwd[k], c = pl->rc[k];
      if (s->recompute[st] && (c < 0 || c < f))
        return need(err, n, s, r, "the stage recomputes", SCHED_RECOMPUTE, st, mb, c, "after", SCHED_FWD, st, f);
      if (s->recompute[st] && c > b)
        return need(err, n, s, r, "", SCHED_RECOMPUTE, st, mb, c, "before", bop, st, b);
      int done = s->split ? pl->bww[k] : b; /* the stage's gradients are complete after W */
      if (done > last_bwd)
        last_bwd = done;
      if (pp == 1) {
        if (st + 1 < S && pl->fwd[k + m] < f)
          return need(err, n, s, r, "", SCHED_FWD, st + 1, mb, pl->fwd[k + m], "after", SCHED_FWD, st, f);
        if (st + 1 < S && pl->bwd[k + m] > b)
          return need(err, n, s, r, "", bop, st + 1, mb, pl->bwd[k + m], "before", bop, st, b);
        continue;
      }
      if (st + 1 < S) {
        int send = pl->send_act[k], recv = pl->recv_act[k], next = (st + 1) % pp;
        if (send < 0 || send < f)
          return need(err, n, s, r, "the next stage needs it", SCHED_SEND_ACT, st, mb, send, "after", SCHED_FWD, st, f);
        if (recv < 0 || recv > pl->fwd[k + m])
          return need(err, n, s, next, "every send is received once", SCHED_RECV_ACT, st, mb, recv,
                      "before", SCHED_FWD, st + 1, pl->fwd[k + m]);
      }
      if (st > 0) {
        int send = pl->send_grad[k], recv = pl->recv_grad[k], prev = (st - 1) % pp;
        if (send < 0 || send < b)
          return need(err, n, s, r, "the previous stage needs it", SCHED_SEND_GRAD, st, mb, send, "after", bop, st, b);
        if (recv < 0 || recv > pl->bwd[k - m])
          return need(err, n, s, prev, "every send is received once", SCHED_RECV_GRAD, st, mb, recv,
                      "before", bop, st - 1, pl->bwd[k - m]);
      }
    }
    int red = pl->reduce[st];
    if (red < 0 || red < last_bwd) {
      char text[96];
      struct sched_instr in = { SCHED_REDUCE_GRADS, st, -1, -1 };
      sched_instr_text(&in, text, sizeof text);
      if (red < 0)
        errf(err, n, "schedule %s: rank %d: %s missing (once per step, after the stage's last backward)",
             plan_schedule_name(s->kind), r, text);
      else
        errf(err, n, "schedule %s: rank %d: %s at #%d must come after the stage's last backward at #%d",
             plan_schedule_name(s->kind), r, text, red, last_bwd);
      return SCHED_INCOMPLETE;
    }
  }
  return 0;
}

int sched_check(const struct sched *s, char *err, size_t n)
{
  if (!s->ranks || s->pp < 1 || s->m < 1 || s->v < 1 || s->n_stages != s->pp * s->v) {
    errf(err, n, "schedule: empty or malformed (pp %d, virtual stages %d, %d stages, %d micro-batches)",
         s->pp, s->v, s->n_stages, s->m);
    return SCHED_INVALID;
  }
  size_t cells = (size_t)s->n_stages * (size_t)s->m;
  struct places pl;
  int *all = malloc((8 * cells + (size_t)s->n_stages) * sizeof *all);
  if (!all) {
    errf(err, n, "schedule %s: out of memory", plan_schedule_name(s->kind));
    return SCHED_NOMEM;
  }
  memset(all, 0xff, (8 * cells + (size_t)s->n_stages) * sizeof *all); /* -1 everywhere */
  int **slots[] = { &pl.fwd, &pl.bwd, &pl.rc, &pl.send_act, &pl.recv_act, &pl.send_grad, &pl.recv_grad, &pl.bww };
  for (int i = 0; i < 8; i++)
    *slots[i] = all + (size_t)i * cells;
  pl.reduce = all + 8 * cells;
  int rc = place(s, &pl, err, n);
  if (!rc)
    rc = flow(s, &pl, err, n);
  free(all);
  return rc;
}
