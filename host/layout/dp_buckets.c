/* The data-parallel flat layout (dp_buckets.h). */
#include "layout/dp_buckets.h"

#include <stdlib.h>
#include <string.h>

#include "real.h"
#include "util/err.h"

enum { ALIGN_FLOATS = 16 };

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Whether parameter i is an expert the layout keeps apart (mesh.ep > 1). */
static int is_expert(const struct layout_params *t, int ep, int i)
{
  const enum model_param_kind k = t->p[i].kind;
  return ep > 1 && (k == MODEL_EXPERT_W1 || k == MODEL_EXPERT_W2 || k == MODEL_EXPERT_W3);
}

/* The unit of parameter i: 0 embedding, 1 + l layer l, L + 1 the final norm and the head. */
static int unit_of(const struct layout_params *t, int n_layers, int i)
{
  const struct layout_param *p = &t->p[i];
  if (p->layer >= 0)
    return 1 + p->layer;
  return p->kind == MODEL_EMBED ? 0 : n_layers + 1;
}

int dp_buckets_build(struct dp_layout *l, struct layout_params *t, int n_layers, int ep_size, int size, int zero,
                     double bucket_mb, char *err, size_t err_size)
{
  memset(l, 0, sizeof *l);
  l->size = size;
  l->ep = ep_size > 1 ? ep_size : 1;
  l->expert_size = size % l->ep == 0 && size >= l->ep ? size / l->ep : 1;
  l->zero = zero;
  l->n_units = n_layers + 2;
  const int n = t->n, ep = l->ep;
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
    held += align_up(t->p[i].n_elems, ALIGN_FLOATS);
    /* experts' buckets hold experts only; a full bucket of them also takes the other ep ranks'
     * experts below it (no elements here), so every rank of the dp group cuts at the same sizes */
    const int kind_change = i > 0 && is_expert(t, ep, i - 1) != is_expert(t, ep, i);
    const int cut = held >= cap_elems &&
                    !(i > 0 && is_expert(t, ep, i) && is_expert(t, ep, i - 1) && t->p[i - 1].n_elems == 0);
    int boundary = i == 0 || cut || kind_change ||
                   (zero >= 2 && unit_of(t, n_layers, i - 1) != unit_of(t, n_layers, i));
    if (boundary) {
      l->buckets[l->n_buckets++] = (struct dp_bucket){ .first_param = i, .last_param = last,
                                                       .expert = is_expert(t, ep, i) };
      last = i - 1;
      held = 0;
    }
  }
  for (int a = 0, b = l->n_buckets - 1; a < b; a++, b--) {
    struct dp_bucket swap = l->buckets[a];
    l->buckets[a] = l->buckets[b];
    l->buckets[b] = swap;
  }

  size_t pos = 0, shard = 0;
  for (int b = 0; b < l->n_buckets; b++) {
    struct dp_bucket *k = &l->buckets[b];
    k->start = pos;
    k->first_held = k->first_param;
    while (k->first_held < k->last_param && t->p[k->first_held].n_elems == 0) k->first_held++;
    for (int i = k->first_param; i <= k->last_param; i++) {
      t->p[i].offset = pos;
      pos += align_up(t->p[i].n_elems, ALIGN_FLOATS);
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
  t->n_elems = pos;
  /* bf16 models: the copies lie at the same flat offsets (bf16 elements), padding included, so a
   * rank's slice of a bucket is the same range of the copies: AdamW writes the copies of its
   * shard and the all-gather after the step (or ZeRO-3's gather of a unit) moves them in bf16 */
  int has_copies = 0;
  for (int i = 0; i < n; i++) {
    if (t->p[i].bf16_offset == LAYOUT_NO_BF16)
      continue;
    t->p[i].bf16_offset = t->p[i].offset;
    has_copies = 1;
  }
  if (has_copies)
    t->n_bf16 = pos;

  for (int u = 0; u < l->n_units; u++)
    l->units[u] = (struct dp_unit){ .first_param = -1, .first_bucket = -1 };
  for (int i = 0; i < n; i++) {
    struct dp_unit *u = &l->units[unit_of(t, n_layers, i)];
    if (u->first_param < 0) {
      u->first_param = i;
      u->first_bucket = l->param_bucket[i];
    }
    u->last_param = i;
    u->last_bucket = l->param_bucket[i];
  }
  return 0;
}

size_t dp_unit_span(const struct dp_layout *l, const struct layout_params *t, int u, size_t *start)
{
  const struct dp_unit *unit = &l->units[u];
  *start = 0;
  if (unit->first_param < 0)
    return 0;
  const struct layout_param *a = &t->p[unit->first_param], *b = &t->p[unit->last_param];
  *start = a->offset;
  return align_up(b->offset + b->n_elems - a->offset, ALIGN_FLOATS);
}

void dp_layout_free(struct dp_layout *l)
{
  free(l->buckets);
  free(l->units);
  free(l->param_bucket);
  memset(l, 0, sizeof *l);
}

int dp_master_is_sharded(int zero, int bf16, int dp_size)
{
  return zero == 3 || (bf16 && zero >= 1 && dp_size > 1);
}

size_t dp_snapshot_elems(size_t layout_elems, size_t shard_elems, int zero, int bf16, int dp_size)
{
  const size_t params = dp_master_is_sharded(zero, bf16, dp_size) ? shard_elems : layout_elems;
  const size_t state = zero == 0 ? layout_elems : shard_elems;
  return params + 2 * state;
}
