/* The run's view of its sparse layers (train_moe.h). */
#include "runtime/train/train_moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "util/err.h"

int train_moe_open(struct train_moe *m, const struct trainer *t, char *err, size_t n)
{
  memset(m, 0, sizeof *m);
  const struct model *md = &t->model;
  if (!md->moe_stat)
    return 0;
  const int L = md->config.n_layers;
  m->E = md->config.moe.experts;
  for (int l = 0; l < L; l++) m->n += md->moe[l];
  m->layer = calloc((size_t)m->n, sizeof *m->layer);
  m->step = calloc((size_t)m->n * (TRAIN_MOE_FIELDS + m->E), sizeof *m->step);
  m->window = calloc((size_t)m->n * (1 + m->E), sizeof *m->window);
  if (!m->layer || !m->step || !m->window) {
    train_moe_close(m);
    return errf(err, n, "out of memory for the routing statistics of %d sparse layers", m->n);
  }
  for (int l = 0, i = 0; l < L; l++)
    if (md->moe[l])
      m->layer[i++] = l;
  m->window_first = t->step;
  return 0;
}

void train_moe_close(struct train_moe *m)
{
  free(m->layer);
  free(m->step);
  free(m->window);
  memset(m, 0, sizeof *m);
}

/* This rank's statistics of every sparse layer (zeros for layers on other pipeline ranks). */
static void pack(const struct train_moe *m, const struct model *md, double *out)
{
  const int W = TRAIN_MOE_FIELDS + m->E;
  memset(out, 0, (size_t)m->n * W * sizeof *out);
  for (int i = 0; i < m->n; i++) {
    const struct model_moe_stat *s = &md->moe_stat[m->layer[i]];
    double *o = out + (size_t)i * W;
    o[0] = s->aux;
    o[1] = s->z;
    o[2] = (double)s->sequences;
    o[3] = (double)s->tokens;
    o[4] = (double)s->assigned;
    o[5] = (double)s->dropped;
    for (int e = 0; e < m->E; e++) o[TRAIN_MOE_FIELDS + e] = (double)s->routed[e];
  }
}

int train_moe_gather(struct train_moe *m, const struct trainer *t, char *err, size_t n)
{
  if (!m->n)
    return 0;
  const size_t count = (size_t)m->n * (TRAIN_MOE_FIELDS + m->E), bytes = count * sizeof(double);
  double *mine = malloc(bytes);
  if (!mine)
    return errf(err, n, "out of memory for the routing statistics");
  pack(m, &t->model, mine);
  if (t->model.tp.rank != 0) /* the tp ranks route the same tokens alike: counted once */
    memset(mine, 0, bytes);
  struct comm_group *g = t->world;
  if (!g || g->size == 1) {
    memcpy(m->step, mine, bytes);
    free(mine);
    return 0;
  }
  char **per_rank = g->rank == 0 ? calloc((size_t)g->size, sizeof *per_rank) : NULL;
  size_t *counts = g->rank == 0 ? calloc((size_t)g->size, sizeof *counts) : NULL;
  int rc = 0;
  if (g->rank == 0 && (!per_rank || !counts))
    rc = errf(err, n, "out of memory gathering the routing statistics");
  /* every rank takes part even when the root has no room, so nobody waits */
  char why[256];
  if (comm_control_gather(g, mine, bytes, 0, per_rank, counts, "the routing statistics' gather", why,
                          sizeof why) && !rc)
    rc = errf(err, n, "gathering the routing statistics: %s", why);
  if (g->rank == 0 && !rc) {
    memset(m->step, 0, bytes);
    for (int r = 0; r < g->size; r++) {
      if (!per_rank[r] || counts[r] != bytes) {
        rc = errf(err, n, "gathering the routing statistics: rank %d sent %zu bytes, not %zu", r,
                  counts[r], bytes);
        break;
      }
      const double *v = (const double *)per_rank[r];
      for (size_t i = 0; i < count; i++) m->step[i] += v[i];
    }
  }
  for (int r = 0; per_rank && r < g->size; r++) free(per_rank[r]);
  free(per_rank);
  free(counts);
  free(mine);
  return rc;
}

void train_moe_totals(const struct train_moe *m, double *aux, double *z, double *dropped)
{
  const int W = TRAIN_MOE_FIELDS + m->E;
  double a = 0, zz = 0, d = 0, as = 0;
  for (int i = 0; i < m->n; i++) {
    const double *s = m->step + (size_t)i * W;
    a += s[2] > 0 ? s[0] / s[2] : 0;
    zz += s[3] > 0 ? s[1] / s[3] : 0;
    as += s[4];
    d += s[5];
  }
  *aux = a;
  *z = zz;
  *dropped = as > 0 ? d / as : 0;
}

int train_moe_json(const struct train_moe *m, char *buf, size_t n)
{
  if (!m->n || n == 0)
    return 0;
  const int W = TRAIN_MOE_FIELDS + m->E;
  double aux, z, dropped;
  train_moe_totals(m, &aux, &z, &dropped);
  size_t u = (size_t)snprintf(buf, n, ", \"moe\": {\"aux\": %.17g, \"z\": %.17g, \"dropped\": %.17g, \"layers\": [",
                              aux, z, dropped);
  for (int i = 0; i < m->n && u < n; i++) {
    const double *s = m->step + (size_t)i * W;
    u += (size_t)snprintf(buf + u, n - u, "%s{\"layer\": %d, \"aux\": %.17g, \"dropped\": %.17g, \"tokens\": [",
                          i ? ", " : "", m->layer[i], s[2] > 0 ? s[0] / s[2] : 0.0,
                          s[4] > 0 ? s[5] / s[4] : 0.0);
    for (int e = 0; e < m->E && u < n; e++)
      u += (size_t)snprintf(buf + u, n - u, "%s%.0f", e ? ", " : "", s[TRAIN_MOE_FIELDS + e]);
    if (u < n)
      u += (size_t)snprintf(buf + u, n - u, "]}");
  }
  if (u < n)
    u += (size_t)snprintf(buf + u, n - u, "]}");
  return (int)(u < n ? u : n - 1);
}

void train_moe_progress(const struct train_moe *m, char *buf, size_t n)
{
  buf[0] = '\0';
  if (!m->n)
    return;
  double aux, z, dropped;
  train_moe_totals(m, &aux, &z, &dropped);
  snprintf(buf, n, " | moe aux %.3f drop %.1f%%", aux, 100.0 * dropped);
}

double train_moe_imbalance(const double *routed, int E, int *expert)
{
  double sum = 0, best = -1;
  *expert = 0;
  for (int e = 0; e < E; e++) {
    sum += routed[e];
    if (routed[e] > best) {
      best = routed[e];
      *expert = e;
    }
  }
  return sum > 0 ? best * E / sum : 0.0;
}

int train_moe_window(struct train_moe *m, long long step, int last, char *buf, size_t n)
{
  if (!m->n)
    return 0;
  const int W = TRAIN_MOE_FIELDS + m->E;
  for (int i = 0; i < m->n; i++) {
    const double *s = m->step + (size_t)i * W;
    double *w = m->window + (size_t)i * (1 + m->E);
    w[0] += s[4];
    for (int e = 0; e < m->E; e++) w[1 + e] += s[TRAIN_MOE_FIELDS + e];
  }
  if (++m->window_steps < TRAIN_MOE_WINDOW && !last)
    return 0;
  int warned = 0;
  size_t u = 0;
  if (n)
    buf[0] = '\0';
  for (int i = 0; i < m->n; i++) {
    double *w = m->window + (size_t)i * (1 + m->E);
    int expert;
    const double ratio = train_moe_imbalance(w + 1, m->E, &expert);
    if (ratio > TRAIN_MOE_IMBALANCE && u < n) {
      u += (size_t)snprintf(buf + u, n - u, "warning: layer %d: expert %d took %.1f× its share of the "
                            "tokens (%.1f%% of %.0f assignments, 1/%d fair) over steps %lld-%lld; "
                            "model.moe.aux_loss pushes the router towards balance\n",
                            m->layer[i], expert, ratio, 100.0 * w[1 + expert] / w[0], w[0], m->E,
                            m->window_first + 1, step + 1);
      warned++;
    }
    memset(w, 0, (size_t)(1 + m->E) * sizeof *w);
  }
  m->window_first = step + 1;
  m->window_steps = 0;
  return warned;
}

void train_moe_trace(const struct train_moe *m)
{
  const int W = TRAIN_MOE_FIELDS + m->E;
  for (int i = 0; i < m->n; i++) {
    const double *s = m->step + (size_t)i * W;
    char name[32], series[24];
    snprintf(name, sizeof name, "moe layer %d", m->layer[i]);
    comm_trace_counter(name, "aux", s[2] > 0 ? s[0] / s[2] : 0.0);
    comm_trace_counter(name, "dropped", s[4] > 0 ? s[5] / s[4] : 0.0);
    snprintf(name, sizeof name, "moe layer %d tokens", m->layer[i]);
    for (int e = 0; e < m->E; e++) {
      snprintf(series, sizeof series, "expert %d", e);
      comm_trace_counter(name, series, s[TRAIN_MOE_FIELDS + e]);
    }
  }
}
