/* sched_from_plan (sched.h): the schedule a compiled plan asks for, with per-stage costs from
 * forward FLOPs per token so that uneven stages (and the LM head's extra work) show in the
 * simulated bubble. The FLOP counts are the plan's own (plan_stage_flops), the same that
 * "balanced" stages use. For split backwards (zero-bubble kinds) the weight gradient's share of
 * each stage's backward comes from the same counts: every linear's backward is two products of
 * its forward's size, one for the input gradient (B) and one for the weights (W), while the
 * attention core has no weights, so its whole backward is B. */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

int sched_from_plan(const struct plan *p, struct sched *out, char *err, size_t n)
{
  int S = p->n_stages;
  if (!p->stages || S != p->mesh.pp * p->virtual_stages) {
    memset(out, 0, sizeof *out);
    errf(err, n, "schedule: the plan has %d stages for pp %d × virtual stages %d; compile it first",
         S, p->mesh.pp, p->virtual_stages);
    return SCHED_INVALID;
  }
  uint8_t *recompute = calloc((size_t)S, 1);
  double *rc_flops = calloc((size_t)S, sizeof *rc_flops), *fwd_flops = calloc((size_t)S, sizeof *fwd_flops);
  double *core_flops = calloc((size_t)S, sizeof *core_flops);
  if (!recompute || !rc_flops || !fwd_flops || !core_flops) {
    free(core_flops);
    free(recompute);
    free(rc_flops);
    free(fwd_flops);
    memset(out, 0, sizeof *out);
    errf(err, n, "schedule: out of memory");
    return SCHED_NOMEM;
  }
  double total = 0;
  for (int s = 0; s < S; s++) {
    const struct plan_stage *st = &p->stages[s];
    const struct plan_stage_flops f = plan_stage_flops(p, s);
    fwd_flops[s] = f.forward;
    rc_flops[s] = f.recompute;
    for (int l = st->first_layer; st->first_layer >= 0 && l < st->first_layer + st->n_layers; l++) {
      recompute[s] |= p->layers && p->layers[l].recompute != 0;
      core_flops[s] += plan_layer_flops_of(p, l).attn_core;
    }
    total += fwd_flops[s];
  }
  int rc = sched_build(out, p->schedule, p->mesh.pp, p->batch.microbatches, p->virtual_stages, recompute, err, n);
  if (!rc && total > 0) {
    double unit = total / S; /* the mean stage's forward */
    for (int s = 0; s < S; s++) {
      out->costs.fwd[s] = fwd_flops[s] / unit;
      out->costs.bwd[s] = 2 * fwd_flops[s] / unit;
      out->costs.recompute[s] = rc_flops[s] / unit;
      /* backward 2·forward; W = the forward's linear products again, B the rest */
      if (fwd_flops[s] > 0)
        out->costs.w_share[s] = (fwd_flops[s] - core_flops[s]) / (2 * fwd_flops[s]);
    }
  }
  free(recompute);
  free(rc_flops);
  free(fwd_flops);
  free(core_flops);
  return rc;
}
