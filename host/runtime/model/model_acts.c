/* The activation buffers (model.h, model_acts_*), bound to memory where the layout puts them
 * (layout/acts.h): one allocation per area, so a category is one block on the memory bill; with
 * recompute, the buffers of discarded parts live in one area the size of one layer's, shared by
 * every layer and slot. */
#include "runtime/model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/acts.h"
#include "runtime/model/alloc.h"

/* ---- activations ------------------------------------------------------------------------- */

void model_layer_dims(const struct model *m, int layer, struct model_layer_dims *d)
{
  layout_layer_dims(&m->rank, layer, d);
}

int model_gate_up_fused(const struct model *m, int layer)
{
  return layout_params_adjacent(&m->rank, &m->table, layer, MODEL_GATE, MODEL_UP);
}

int model_qkv_fused(const struct model *m, int layer)
{
  return layout_params_adjacent(&m->rank, &m->table, layer, MODEL_Q, MODEL_V);
}

int model_home_T(const struct model *m, int T)
{
  return layout_home_T(&m->rank, T);
}

/* Points a's buffers into the areas' memory (base, by enum acts_area) where layout y puts them:
 * a layer in y's scope from scratch, the buffers outside the layers that y lays out (those it
 * leaves unset keep what a holds). */
static void bind_acts(struct model_acts *a, const struct model *m, const struct acts_layout *y,
                      real *const base[ACTS_N_AREAS])
{
  const int L = m->config.n_layers;
#define AT(x) ((x).area >= ACTS_SAVED && base[(x).area] ? (void *)(base[(x).area] + (x).off) : NULL)
  for (int i = 0; i <= L; i++) a->residual[i] = AT(y->residual[i]);
  for (int l = 0; l < L; l++) {
    struct model_layer_acts *la = &a->layers[l];
    const struct acts_layer_layout *yl = &y->layers[l];
    if (!yl->in_scope)
      continue;
    memset(la, 0, sizeof *la);
#define BIND_LAYER(f) la->f = AT(yl->f);
    ACTS_LAYER_BUFFERS(BIND_LAYER)
#undef BIND_LAYER
    if (m->moe && m->moe[l])
      la->moe_rows = a->moe_rows_memory ? a->moe_rows_memory + (size_t)l * m->config.moe.experts : NULL;
  }
#define BIND(f)                                                                                    \
  if (y->f.area != ACTS_UNSET)                                                                     \
    a->f = AT(y->f);
  ACTS_BUFFERS(BIND)
#undef BIND
#undef AT
}

static int acts_create(struct model_acts *a, const struct model *m, int B_max, int T_max,
                       const struct model_acts *first, const struct model_acts_scope *scope, char *err,
                       size_t err_size)
{
  memset(a, 0, sizeof *a);
  a->B_max = B_max;
  a->T_max = T_max;
  a->shares = first != NULL;
  const int L = m->config.n_layers;
  struct acts_layout y;
  a->layers = calloc((size_t)L, sizeof *a->layers);
  a->residual = calloc((size_t)L + 1, sizeof *a->residual);
  /* the samples' indices, then their low 32 bits (drop.c2) in the same block */
  uint64_t *samples = calloc((size_t)B_max, sizeof *samples + sizeof(uint32_t));
  int *moe_rows = m->moe_stat ? calloc((size_t)L * (size_t)m->config.moe.experts, sizeof *moe_rows) : NULL;
  if (!a->layers || !a->residual || !samples || (m->moe_stat && !moe_rows) ||
      layout_acts_build(&y, &m->rank, &m->table, m->k, m->kctx, B_max, T_max, scope, first != NULL, 0)) {
    free(samples);
    free(moe_rows);
    goto out_of_memory;
  }
  real *base[ACTS_N_AREAS] = { NULL };
  base[ACTS_SAVED] = alloc_reals_on(m->device, ALLOC_ACTIVATIONS, y.n[ACTS_SAVED]);
  if (first) {
    base[ACTS_RECOMPUTE] = first->recompute_memory;
    base[ACTS_WORK] = first->workspace_memory;
  } else {
    base[ACTS_RECOMPUTE] =
      y.n[ACTS_RECOMPUTE] ? alloc_reals_on(m->device, ALLOC_ACTIVATIONS, y.n[ACTS_RECOMPUTE]) : NULL;
    base[ACTS_WORK] = alloc_reals_on(m->device, ALLOC_WORKSPACE, y.n[ACTS_WORK]);
  }
  if (!base[ACTS_SAVED] || (!first && ((y.n[ACTS_RECOMPUTE] && !base[ACTS_RECOMPUTE]) || !base[ACTS_WORK]))) {
    alloc_free(base[ACTS_SAVED]);
    if (!first) {
      alloc_free(base[ACTS_RECOMPUTE]);
      alloc_free(base[ACTS_WORK]);
    }
    free(samples);
    free(moe_rows);
    layout_acts_free(&y);
    goto out_of_memory;
  }
  a->activation_memory = base[ACTS_SAVED];
  a->recompute_memory = base[ACTS_RECOMPUTE];
  a->workspace_memory = base[ACTS_WORK];
  if (first) { /* the workspace pointers are first's */
    struct model_acts mine = *a;
    *a = *first;
    a->layers = mine.layers;
    a->residual = mine.residual;
    a->activation_memory = mine.activation_memory;
    a->shares = 1;
  }
  a->drop.samples = samples;
  a->drop.c2 = (uint32_t *)(samples + B_max);
  a->moe_rows_memory = moe_rows;
  bind_acts(a, m, &y, base);
  layout_acts_free(&y);
  m->k->rope_table(m->kctx, a->rope_cos, a->rope_sin, T_max, m->config.head_dim,
                   m->config.rope_theta, 0);
  a->cp_rope_T = 0; /* positions 0 … T_max − 1, whatever a slot's first held (model_cp_begin) */
  return 0;

out_of_memory:
  snprintf(err, err_size, "out of memory for the activations of %d × %d tokens", B_max, T_max);
  free(a->layers);
  free(a->residual);
  memset(a, 0, sizeof *a);
  return -1;
}

int model_acts_create(struct model_acts *a, const struct model *m, int B_max, int T_max,
                      char *err, size_t err_size)
{
  return acts_create(a, m, B_max, T_max, NULL, NULL, err, err_size);
}

int model_acts_create_slot(struct model_acts *a, const struct model *m, const struct model_acts *first,
                           const struct model_acts_scope *scope, char *err, size_t err_size)
{
  return acts_create(a, m, first->B_max, first->T_max, first, scope, err, err_size);
}

void model_acts_free(struct model_acts *a)
{
  alloc_free(a->activation_memory);
  if (!a->shares) {
    alloc_free(a->recompute_memory);
    alloc_free(a->workspace_memory);
  }
  free(a->layers);
  free(a->residual);
  free(a->drop.samples);
  free(a->moe_rows_memory);
  memset(a, 0, sizeof *a);
}
