/* sched_simulate (sched.h): all ranks' lists run together under the cost model. Sends are
 * buffered (the executor posts them non-blocking and keeps the buffer until completion), so
 * only a receive can wait; the times therefore follow from the data dependencies alone and do
 * not depend on the order in which the simulator visits ranks. It advances every rank as far
 * as it can, round after round, until all are done or none can move: a deadlock. */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

void sched_sim_free(struct sched_sim *r)
{
  if (r->ranks)
    for (int i = 0; i < r->pp; i++) {
      free(r->ranks[i].start);
      free(r->ranks[i].end);
    }
  free(r->ranks);
  memset(r, 0, sizeof *r);
}

static double cost_of(const struct sched *s, const struct sched_instr *in)
{
  switch (in->op) {
  case SCHED_FWD: return s->costs.fwd[in->stage];
  case SCHED_BWD: return s->costs.bwd[in->stage];
  case SCHED_BWD_B: return s->costs.bwd[in->stage] * (1 - s->costs.w_share[in->stage]);
  case SCHED_BWD_W: return s->costs.bwd[in->stage] * s->costs.w_share[in->stage];
  case SCHED_RECOMPUTE: return s->costs.recompute[in->stage];
  case SCHED_REDUCE_GRADS: return s->costs.reduce_grads;
  case SCHED_OPTIMIZER: return s->costs.optimizer;
  default: return 0;
  }
}

/* The deadlock message: each stuck rank's first stuck instruction, and where the message it
 * waits for sits in its sender's list (behind that rank's own stuck point, or absent). */
static void deadlock_message(const struct sched *s, const struct sched_sim *r, char *err, size_t n)
{
  struct strbuf b;
  sb_init(&b);
  sb_printf(&b, "schedule %s: deadlock:", plan_schedule_name(s->kind));
  const char *sep = " ";
  for (int rank = 0; rank < s->pp; rank++) {
    int at = r->ranks[rank].stuck_at;
    if (at < 0)
      continue;
    const struct sched_instr *in = &s->ranks[rank].instr[at];
    char text[96];
    sb_printf(&b, "%srank %d waits at #%d %s", sep, rank, at, sched_instr_text(in, text, sizeof text));
    sep = "; ";
    int want = in->op == SCHED_RECV_ACT ? SCHED_SEND_ACT : SCHED_SEND_GRAD;
    const struct sched_list *peer = &s->ranks[in->peer];
    for (int i = 0; i < peer->n; i++)
      if (peer->instr[i].op == want && peer->instr[i].stage == in->stage && peer->instr[i].mb == in->mb) {
        sb_printf(&b, ", sent by rank %d only at #%d, after its own wait at #%d", in->peer, i,
                  r->ranks[in->peer].stuck_at);
        break;
      }
  }
  errf(err, n, "%s", b.failed || !b.s ? "schedule: deadlock (out of memory for the detail)" : b.s);
  sb_free(&b);
}

int sched_simulate(const struct sched *s, struct sched_sim *out, char *err, size_t n)
{
  memset(out, 0, sizeof *out);
  int rc = sched_check(s, err, n);
  if (rc)
    return rc;
  int pp = s->pp, S = s->n_stages, m = s->m;
  out->pp = pp;
  out->ranks = calloc((size_t)pp, sizeof *out->ranks);
  /* when each message became receivable; < 0 not yet sent */
  double *act_ready = malloc((size_t)S * m * sizeof *act_ready);
  double *grad_ready = malloc((size_t)S * m * sizeof *grad_ready);
  int *pc = calloc((size_t)pp, sizeof *pc), *inflight = calloc((size_t)pp, sizeof *inflight);
  double *clock = calloc((size_t)pp, sizeof *clock);
  int nomem = !out->ranks || !act_ready || !grad_ready || !pc || !inflight || !clock;
  for (int r = 0; r < pp && !nomem; r++) {
    out->ranks[r].start = calloc((size_t)s->ranks[r].n, sizeof(double));
    out->ranks[r].end = calloc((size_t)s->ranks[r].n, sizeof(double));
    nomem = !out->ranks[r].start || !out->ranks[r].end;
  }
  if (nomem) {
    rc = SCHED_NOMEM;
    errf(err, n, "schedule %s: out of memory for the simulation", plan_schedule_name(s->kind));
    goto done;
  }
  for (int i = 0; i < S * m; i++)
    act_ready[i] = grad_ready[i] = -1;

  for (int progress = 1; progress;) {
    progress = 0;
    for (int r = 0; r < pp; r++) {
      const struct sched_list *l = &s->ranks[r];
      struct sched_sim_rank *sr = &out->ranks[r];
      for (; pc[r] < l->n; pc[r]++) {
        const struct sched_instr *in = &l->instr[pc[r]];
        int k = in->stage * m + in->mb;
        double t = clock[r];
        if (in->op == SCHED_RECV_ACT || in->op == SCHED_RECV_GRAD) {
          double ready = (in->op == SCHED_RECV_ACT ? act_ready : grad_ready)[k];
          if (ready < 0)
            break;
          if (ready > t)
            t = ready;
        } else if (in->op == SCHED_SEND_ACT || in->op == SCHED_SEND_GRAD) {
          (in->op == SCHED_SEND_ACT ? act_ready : grad_ready)[k] = t + s->costs.comm;
        } else {
          double d = cost_of(s, in);
          t += d;
          sr->busy += d;
          if (in->op == SCHED_FWD && ++inflight[r] > sr->peak_inflight)
            sr->peak_inflight = inflight[r];
          if (in->op == SCHED_BWD || in->op == SCHED_BWD_W) /* W needs what the forward kept */
            inflight[r]--;
        }
        sr->start[pc[r]] = clock[r];
        sr->end[pc[r]] = clock[r] = t;
        progress = 1;
      }
    }
  }

  double busy = 0;
  for (int r = 0; r < pp; r++) {
    struct sched_sim_rank *sr = &out->ranks[r];
    sr->finish = clock[r];
    sr->stuck_at = pc[r] < s->ranks[r].n ? pc[r] : -1;
    if (sr->stuck_at >= 0)
      rc = SCHED_DEADLOCK;
    if (clock[r] > out->makespan)
      out->makespan = clock[r];
    busy += sr->busy;
  }
  out->idle = pp * out->makespan - busy;
  out->bubble_fraction = out->makespan > 0 ? out->idle / (pp * out->makespan) : 0;
  out->bubble_over_ideal = busy > 0 ? out->idle / busy : 0;
  if (rc)
    deadlock_message(s, out, err, n);
done:
  free(act_ready);
  free(grad_ready);
  free(pc);
  free(inflight);
  free(clock);
  return rc;
}
