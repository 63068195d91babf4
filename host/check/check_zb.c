/* check_zb (check_zb.h): the memory a zero-bubble schedule's deferred W's hold beyond the bill.
 * The in-flight counts are those of the schedule's own order (the simulator's peak_inflight
 * counts the same way): a micro-batch enters at its forward and leaves at its W, where the bill
 * lets it leave at its backward. What it holds in between is billed at two stated sizes, not
 * buffer by buffer: the extra micro-batches at the bill's activations per slot (every saved
 * activation of the stage, a little more than W itself reads), and every micro-batch past B at
 * its linears' output gradients (q, k, v, o, gate, up, down and the head: the other operand of
 * each weight-gradient product), in the compute dtype. */
#include "check/check_zb.h"

#include <string.h>
#include <stdlib.h>

#include "check/check_ep.h"
#include "check/check_internal.h"
#include "sched/sched.h"
#include "util/err.h"

/* Elements of the linears' outputs per token of stage st on one tp rank: column-split outputs
 * (q, k, v, gate, up; the head's vocab) are 1/tp, row-split ones (o, down) whole before their
 * reduction; a sparse layer's experts are whole on every tp rank, top_k of them per token. */
static double dout_per_token(const struct plan *p, int st)
{
  const struct plan_model *c = &p->model;
  const struct plan_stage *s = &p->stages[st];
  const double tp = p->mesh.tp, hd = c->head_dim;
  double e = 0;
  for (int l = s->first_layer; s->first_layer >= 0 && l < s->first_layer + s->n_layers; l++) {
    e += (c->n_heads * hd + 2.0 * c->n_kv_heads * hd) / tp + c->dim; /* q, k, v; o */
    if (p->layers && p->layers[l].moe)
      e += (double)c->moe.top_k * (2.0 * c->moe.ffn_dim + c->dim);
    else
      e += 2.0 * c->ffn_dim / tp + c->dim; /* gate, up; down */
  }
  if (s->has_head)
    e += (double)(c->vocab_padded > 0 ? c->vocab_padded : c->vocab) / tp;
  return e;
}

int check_zb_held(const struct plan *p, const struct bill *bills, struct check_zb_held *out, char *err, size_t n)
{
  memset(out, 0, (size_t)p->mesh.pp * sizeof *out);
  struct sched s;
  if (sched_from_plan(p, &s, err, n)) {
    sched_free(&s);
    return -1;
  }
  const double tokens = (double)p->batch.micro * p->batch.seq, elem = plan_dtype_bytes(p->precision.compute);
  for (int r = 0; r < s.pp && s.split; r++) {
    const struct sched_list *l = &s.ranks[r];
    int held = 0, whole = 0, past_b = 0, peak_held = 0, peak_whole = 0;
    for (int i = 0; i < l->n; i++) {
      const int op = l->instr[i].op;
      held += op == SCHED_FWD ? 1 : op == SCHED_BWD_W ? -1 : 0;
      whole += op == SCHED_FWD ? 1 : op == SCHED_BWD_B ? -1 : 0;
      past_b += op == SCHED_BWD_B ? 1 : op == SCHED_BWD_W ? -1 : 0;
      peak_held = held > peak_held ? held : peak_held;
      peak_whole = whole > peak_whole ? whole : peak_whole;
      out[r].pending = past_b > out[r].pending ? past_b : out[r].pending;
    }
    out[r].extra = peak_held - peak_whole;
    for (int st = r; st < s.n_stages; st += s.pp)
      out[r].dout_bytes += tokens * dout_per_token(p, st) * elem;
    check_zb_rank_bytes(&out[r], bills ? &bills[r] : NULL);
  }
  sched_free(&s);
  return 0;
}

double check_zb_rank_bytes(struct check_zb_held *h, const struct bill *b)
{
  h->slot_bytes = b && b->n_slots > 0 ? b->bytes[ALLOC_ACTIVATIONS] / b->n_slots : 0;
  h->bytes = h->extra * h->slot_bytes + h->pending * h->dout_bytes;
  return h->bytes;
}

void check_zb_print(FILE *f, const struct plan *p, const struct bill *bills, int (*shown)(int rank, int pp))
{
  if (p->schedule != PLAN_SCHED_ZB_H1)
    return;
  char err[512];
  struct check_zb_held *h = calloc((size_t)p->mesh.pp, sizeof *h);
  if (!h || check_zb_held(p, bills, h, err, sizeof err)) {
    fprintf(f, "           (W-held memory not counted: %s)\n", h ? err : "out of memory");
    free(h);
    return;
  }
  fprintf(f, "   W-held   %s: after B a micro-batch waits for its W (weight gradient), holding more than "
          "the bill above,\n             which counts whole backwards in the same order (1F1B's); not in its "
          "totals:\n", plan_schedule_name(p->schedule));
  for (int r = 0; r < p->mesh.pp; r++) {
    if (!shown(r, p->mesh.pp)) {
      if (r > 0 && shown(r - 1, p->mesh.pp))
        fprintf(f, "   ...\n");
      continue;
    }
    char a[32], b[32], c[32], t[32];
    fprintf(f, "   %7d  +%s: %d more micro-batch%s in flight × %s (the bill's activations per slot) + %d past B "
            "× %s (their linears' output gradients); total with it %s\n", r,
            check_format_bytes(h[r].bytes, a, sizeof a), h[r].extra, h[r].extra == 1 ? "" : "es",
            check_format_bytes(h[r].slot_bytes, b, sizeof b), h[r].pending,
            check_format_bytes(h[r].dout_bytes, c, sizeof c), check_format_bytes(bills[r].total + h[r].bytes, t, sizeof t));
  }
  free(h);
}
