/* The data-parallel flat layout (dp.h): buckets in the order backward finishes gradients, each
 * padded so that every rank owns an equal, 16-element aligned share of it; and the units the
 * passes read. A pure function of the parameter table, the group size, the stage and the
 * bucket size, so every rank computes the same layout; with expert parallelism the ranks of a dp
 * group hold different experts of the same shapes, and the layout's sizes are still the same. */
#include <stdlib.h>
#include <string.h>

#include "runtime/parallel/dp.h"
#include "util/err.h"

enum { ALIGN_FLOATS = 16 };

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* The unit of parameter i: 0 embedding, 1 + l layer l, L + 1 the final norm and the head. */
static int is_expert(const struct model *m, int i)
{
  const enum model_param_kind k = m->params[i].kind;
  return m->ep.size > 1 && (k == MODEL_EXPERT_W1 || k == MODEL_EXPERT_W2 || k == MODEL_EXPERT_W3);
}

static int unit_of(const struct model *m, int i)
{
  const struct model_param *p = &m->params[i];
  if (p->layer >= 0)
    return 1 + p->layer;
  return p->kind == MODEL_EMBED ? 0 : m->config.n_layers + 1;
}

int dp_layout_build(struct dp_layout *l, struct model *m, int size, int zero, double bucket_mb,
                    char *err, size_t err_size)
{
  memset(l, 0, sizeof *l);
  l->size = size;
  l->ep = m->ep.size > 1 ? m->ep.size : 1;
  l->expert_size = size % l->ep == 0 && size >= l->ep ? size / l->ep : 1;
  l->zero = zero;
  l->n_units = m->config.n_layers + 2;
  const int n = m->n_params;
  l->buckets = calloc((size_t)n, sizeof *l->buckets); /* at most one bucket per parameter */
  l->units = calloc((size_t)l->n_units, sizeof *l->units);
  l->param_bucket = calloc((size_t)n, sizeof *l->param_bucket);
  if (!l->buckets || !l->units || !l->param_bucket) {
    dp_layout_free(l);
    return errf(err, err_size, "out of memory for the data-parallel layout");
  }
  double cap = bucket_mb * 1024.0 * 1024.0 / sizeof(real);
  size_t cap_elems = cap < 1.0 ? 1 : cap > 1e18 ? (size_t)1e18 : (size_t)cap;

  /* Walk from the last parameter (whose gradient backward finishes first) to the first. The
   * buckets come out last-first; they are reversed into flat order below. */
  int last = n - 1;
  size_t held = 0;
  for (int i = n - 1; i >= 0; i--) {
    held += align_up(m->params[i].n_elems, ALIGN_FLOATS);
    /* experts' buckets hold experts only; a full bucket of them also takes the other ep ranks'
     * experts below it (no elements here), so every rank of the dp group cuts at the same sizes */
    const int kind_change = i > 0 && is_expert(m, i - 1) != is_expert(m, i);
    const int cut = held >= cap_elems &&
                    !(i > 0 && is_expert(m, i) && is_expert(m, i - 1) && m->params[i - 1].n_elems == 0);
    int boundary = i == 0 || cut || kind_change ||
                   (zero >= 2 && unit_of(m, i - 1) != unit_of(m, i));
    if (boundary) {
      l->buckets[l->n_buckets++] = (struct dp_bucket){ .first_param = i, .last_param = last,
                                                       .expert = is_expert(m, i) };
      last = i - 1;
      held = 0;
    }
  }
  for (int a = 0, b = l->n_buckets - 1; a < b; a++, b--) {
    struct dp_bucket t = l->buckets[a];
    l->buckets[a] = l->buckets[b];
    l->buckets[b] = t;
  }

  size_t pos = 0, shard = 0;
  for (int b = 0; b < l->n_buckets; b++) {
    struct dp_bucket *k = &l->buckets[b];
    k->start = pos;
    k->first_held = k->first_param;
    while (k->first_held < k->last_param && m->params[k->first_held].n_elems == 0) k->first_held++;
    for (int i = k->first_param; i <= k->last_param; i++) {
      m->params[i].offset = pos;
      pos += align_up(m->params[i].n_elems, ALIGN_FLOATS);
      l->param_bucket[i] = b;
    }
    size_t used = pos - k->start;
    const size_t over = (size_t)(k->expert ? l->expert_size : size); /* the ranks that share it */
    k->share = align_up((used + over - 1) / over, ALIGN_FLOATS);
    k->n_elems = k->share * over;
    k->shard_offset = shard;
    shard += k->share;
    pos = k->start + k->n_elems;
    if (k->n_elems > l->max_bucket_elems)
      l->max_bucket_elems = k->n_elems;
  }
  l->n_elems = pos;
  l->n_shard = shard;
  m->n_elems = pos;

  for (int u = 0; u < l->n_units; u++)
    l->units[u] = (struct dp_unit){ .first_param = -1, .first_bucket = -1 };
  for (int i = 0; i < n; i++) {
    struct dp_unit *u = &l->units[unit_of(m, i)];
    if (u->first_param < 0) {
      u->first_param = i;
      u->first_bucket = l->param_bucket[i];
    }
    u->last_param = i;
    u->last_bucket = l->param_bucket[i];
  }
  return 0;
}

void dp_layout_free(struct dp_layout *l)
{
  free(l->buckets);
  free(l->units);
  free(l->param_bucket);
  memset(l, 0, sizeof *l);
}
