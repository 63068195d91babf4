/* check_zb (check_zb.h): the memory a zero-bubble schedule's deferred W's hold. Where the runtime
 * splits its backwards (bill_split_runs: ZeRO 0 and 1, ZeRO 2 and 3 with zero_every "step") the bill walks the split list and counts
 * it (the slots kept until W, the held areas), and this only says how much of it is W's; else
 * it is what the W's hold beyond the bill. The in-flight counts are those of the schedule's own order (the simulator's peak_inflight
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
#include "layout/bill.h"
#include "sched/sched.h"
#include "util/err.h"

int check_zb_held(const struct plan *p, const struct bill *bills, struct check_zb_held *out, char *err, size_t n)
{
  memset(out, 0, (size_t)p->mesh.pp * sizeof *out);
  struct sched s;
  if (sched_from_plan(p, &s, err, n)) {
    sched_free(&s);
    return -1;
  }
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
    int areas;
    out[r].dout_bytes = bill_split_held_bytes(p, l, r, &areas); /* as the executor sizes an area */
    if (out[r].dout_bytes < 0) {
      sched_free(&s);
      return errf(err, n, "out of memory");
    }
    out[r].in_bill = bill_split_runs(p);
    check_zb_rank_bytes(&out[r], bills ? &bills[r] : NULL);
  }
  sched_free(&s);
  return 0;
}

double check_zb_rank_bytes(struct check_zb_held *h, const struct bill *b)
{
  h->slot_bytes = b && b->n_slots > 0 ? b->bytes[ALLOC_ACTIVATIONS] / b->n_slots : 0;
  h->bytes = h->in_bill ? 0 : h->extra * h->slot_bytes + h->pending * h->dout_bytes;
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
  const int in_bill = h[0].in_bill;
  if (in_bill)
    fprintf(f, "   W-held   %s: after B a micro-batch waits for its W (weight gradient), holding its slot and its "
            "linears'\n             output gradients; in the bill above (activations), as the runtime's split "
            "backward allocates them:\n", plan_schedule_name(p->schedule));
  else
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
    if (in_bill) {
      fprintf(f, "   %7d  %d more micro-batch%s in flight than 1F1B (their slots) + %d past B × %s (their linears' "
              "output gradients%s)\n", r, h[r].extra, h[r].extra == 1 ? "" : "es", h[r].pending,
              check_format_bytes(h[r].dout_bytes, c, sizeof c), p->mesh.tp > 1 ? " and inputs" : "");
      continue;
    }
    fprintf(f, "   %7d  +%s: %d more micro-batch%s in flight × %s (the bill's activations per slot) + %d past B "
            "× %s (their linears' output gradients%s); total with it %s\n", r,
            check_format_bytes(h[r].bytes, a, sizeof a), h[r].extra, h[r].extra == 1 ? "" : "es",
            check_format_bytes(h[r].slot_bytes, b, sizeof b), h[r].pending,
            check_format_bytes(h[r].dout_bytes, c, sizeof c), p->mesh.tp > 1 ? " and inputs" : "", check_format_bytes(bills[r].total + h[r].bytes, t, sizeof t));
  }
  free(h);
}
