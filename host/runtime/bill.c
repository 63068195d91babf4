/* The predicted memory bill (bill.h). */
#include "runtime/bill.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/dp.h"
#include "runtime/model.h"
#include "sched/sched.h"
#include "util/err.h"

static double dtype_bytes(enum plan_dtype d)
{
  return d == PLAN_FP32 ? 4.0 : 2.0;
}

/* Floats of unit u's buckets. */
static size_t unit_elems(const struct dp_layout *l, int u)
{
  const struct dp_unit *k = &l->units[u];
  if (k->first_bucket < 0)
    return 0;
  const struct dp_bucket *a = &l->buckets[k->first_bucket], *b = &l->buckets[k->last_bucket];
  return b->start + b->n_elems - a->start;
}

static size_t unit_shares(const struct dp_layout *l, int u)
{
  const struct dp_unit *k = &l->units[u];
  size_t n = 0;
  for (int b = k->first_bucket; k->first_bucket >= 0 && b <= k->last_bucket; b++) n += l->buckets[b].share;
  return n;
}

/* Zero ≥ 2: gradients of the unit in backward and of the one reducing (backward goes head,
 * layers from the last, embedding; a tied embedding's bucket is filled from the head on), and
 * the reduce-scatter outputs of one unit. Zero 3: parameters of two consecutive steps. */
static void zero_peaks(const struct dp_layout *l, const struct model *m, int microbatches,
                       size_t *grads, size_t *params, size_t *comm)
{
  const int L = m->config.n_layers, tied = m->config.tie_embeddings;
  const int n_units = L + 2;
  int *order = malloc((size_t)n_units * sizeof *order);
  if (!order)
    return;
  int n = 0;
  order[n++] = L + 1;
  for (int u = L; u >= 0; u--) order[n++] = u;
  size_t g = 0, c = 0;
  for (int i = 0; i < n; i++) {
    int cur = order[i], prev = i > 0 ? order[i - 1] : microbatches > 1 ? 0 : -1;
    size_t held = unit_elems(l, cur) + (prev >= 0 && prev != cur ? unit_elems(l, prev) : 0);
    if (tied && cur != 0 && prev != 0)
      held += unit_elems(l, 0);
    g = held > g ? held : g;
    size_t s = unit_shares(l, cur);
    c = s > c ? s : c;
  }
  *grads = g;
  *comm = c;
  /* Zero 3: the steps' units: embed; layers; head (+ embedding when tied) twice; layers back. */
  int (*steps)[2] = malloc((size_t)(2 * L + 4) * sizeof *steps);
  if (!steps) {
    free(order);
    return;
  }
  int ns = 0;
  steps[ns][0] = 0, steps[ns++][1] = -1;
  for (int u = 1; u <= L; u++) steps[ns][0] = u, steps[ns++][1] = -1;
  for (int k = 0; k < 2; k++) steps[ns][0] = L + 1, steps[ns++][1] = tied ? 0 : -1;
  for (int u = L; u >= 1; u--) steps[ns][0] = u, steps[ns++][1] = -1;
  size_t pmax = 0;
  for (int j = 0; j < ns; j++) {
    int units[4] = { steps[j][0], steps[j][1], j + 1 < ns ? steps[j + 1][0] : -1, j + 1 < ns ? steps[j + 1][1] : -1 };
    size_t sum = 0;
    for (int a = 0; a < 4; a++) {
      int dup = units[a] < 0;
      for (int b = 0; b < a && !dup; b++) dup = units[b] == units[a];
      if (!dup)
        sum += unit_elems(l, units[a]);
    }
    pmax = sum > pmax ? sum : pmax;
  }
  *params = pmax;
  free(steps);
  free(order);
}

int bill_predict(const struct plan *p, int pp_rank, struct bill *out, char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  struct model m;
  if (model_create_table_at(&m, p, 0, pp_rank, err, err_size))
    return 1;
  struct dp_layout l;
  if (dp_layout_build(&l, &m, p->mesh.dp, p->zero, p->bucket_mb, err, err_size)) {
    model_free(&m);
    return 1;
  }
  const int micro = p->batch.micro, seq = p->batch.seq, zero = p->zero;
  size_t acts[3];
  if (model_acts_count(&m, micro, seq, acts)) {
    dp_layout_free(&l);
    model_free(&m);
    return errf(err, err_size, "out of memory counting activations");
  }
  int slots = 1;
  if (p->mesh.pp > 1) {
    struct sched s;
    struct sched_sim sim;
    if (sched_from_plan(p, &s, err, err_size) || sched_simulate(&s, &sim, err, err_size)) {
      sched_free(&s);
      dp_layout_free(&l);
      model_free(&m);
      return 1;
    }
    slots = sim.ranks[pp_rank].peak_inflight + 1;
    sched_sim_free(&sim);
    sched_free(&s);
  }

  /* elements (floats) as the fp32 runtime allocates them */
  double params = 0, grads = 0, comm = 0, activations, workspace;
  if (zero < 3)
    params = (double)l.n_elems;
  if (zero < 2)
    grads = (double)l.n_elems;
  if (zero >= 2) {
    size_t g = 0, pz = 0, c = 0;
    zero_peaks(&l, &m, p->batch.microbatches, &g, &pz, &c);
    grads = (double)(l.n_shard + g);
    comm = (double)c;
    if (zero == 3)
      params = (double)(l.n_shard + pz);
  }
  const double state = (double)(zero == 0 ? l.n_elems : l.n_shard);
  activations = (double)acts[0] * slots + (double)acts[1];
  workspace = (double)acts[2];
  const double boundary = (double)micro * (p->sequence_parallel && p->mesh.tp > 1 ? seq / p->mesh.tp : seq) *
                          p->model.dim;
  if (p->mesh.pp > 1) {
    comm += boundary * slots;                       /* a gradient buffer per slot */
    if (m.head_here)
      activations += (double)micro * seq * slots;   /* the targets each slot keeps */
  }
  /* the trainer's batch: inputs and targets (ints), each row's window index (8 bytes) */
  const double batch_bytes = 2.0 * micro * seq * sizeof(int) + (double)micro * sizeof(uint64_t);

  const double c = dtype_bytes(p->precision.compute), g = dtype_bytes(p->precision.grads);
  const double master = p->precision.compute == PLAN_FP32 ? 0.0 : 4.0;
  out->bytes[ALLOC_PARAMS] = params * c;
  out->bytes[ALLOC_GRADS] = grads * g;
  out->bytes[ALLOC_OPTIMIZER] = state * (8.0 + master);
  out->bytes[ALLOC_ACTIVATIONS] = activations * c;
  out->bytes[ALLOC_COMM] = comm * c;
  out->bytes[ALLOC_WORKSPACE] = workspace * c + batch_bytes;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) out->total += out->bytes[k];
  out->n_slots = slots;
  for (int i = 0; i < m.n_params; i++) out->n_params += (long long)m.params[i].n_elems;
  dp_layout_free(&l);
  model_free(&m);
  return 0;
}
