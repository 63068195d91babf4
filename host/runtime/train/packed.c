/* Parameters packed in the serial model's order, gathered from any layout (packed.h). */
#include "runtime/train/packed.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/model/alloc.h"
#include "runtime/model/model.h"
#include "runtime/parallel/dp.h"
#include "runtime/train/train.h"
#include "util/err.h"
#include "util/fault.h"

/* Elements of a parameter as Hugging Face has it (no padding rows: they are the last ones). */
static size_t logical_elems(const struct model_param *p)
{
  return p->n_dims == 2 ? (size_t)p->shape[0] * (size_t)p->shape[1] : (size_t)p->shape[0];
}

real *model_packed(const struct model *m, size_t *n)
{
  size_t total = 0, at = 0;
  for (int i = 0; i < m->n_params; i++) total += logical_elems(&m->params[i]);
  real *out = malloc((total ? total : 1) * sizeof *out);
  if (!out)
    return NULL;
  for (int i = 0; i < m->n_params; i++) {
    memcpy(out + at, m->params[i].data, logical_elems(&m->params[i]) * sizeof(real));
    at += logical_elems(&m->params[i]);
  }
  *n = total;
  return out;
}

int trainer_gather_packed(struct trainer *t, real **out, size_t *n, char *err, size_t err_size)
{
  *out = NULL;
  *n = 0;
  if (t->model.tp.size > 1 || t->plan->mesh.pp > 1 || t->model.ep.size > 1) {
    struct model whole;
    int have;
    if (dp_gather_whole(&t->dp, &whole, &have, err, err_size))
      return -1;
    if (!have)
      return 0;
    *out = model_packed(&whole, n);
    model_free(&whole);
    return *out ? 0 : errf(err, err_size, "out of memory packing the parameters");
  }
  real *full;
  if (dp_gather_params(&t->dp, &full))
    return errf(err, err_size, "%s", FAULT_OF(&t->dp)->msg);
  if (!full)
    return 0;
  size_t total = 0, at = 0;
  for (int i = 0; i < t->model.n_params; i++) total += logical_elems(&t->model.params[i]);
  *out = malloc((total ? total : 1) * sizeof **out);
  for (int i = 0; *out && i < t->model.n_params; i++) {
    const struct model_param *p = &t->model.params[i];
    memcpy(*out + at, full + p->offset, logical_elems(p) * sizeof(real));
    at += logical_elems(p);
  }
  dp_gather_params_free(&t->dp, full);
  *n = total;
  return *out ? 0 : errf(err, err_size, "out of memory packing the parameters");
}

int model_from_packed(struct model *m, const struct plan_model *cfg, const real *packed, size_t n, char *err,
                      size_t err_size)
{
  return model_from_packed_sparse(m, cfg, NULL, packed, n, err, err_size);
}

int model_from_packed_sparse(struct model *m, const struct plan_model *cfg, const uint8_t *sparse,
                             const real *packed, size_t n, char *err, size_t err_size)
{
  struct plan_model c = *cfg;
  c.vocab_padded = 0; /* one rank: no tensor-parallel padding (the sampler reads vocab logits) */
  memset(m, 0, sizeof *m);
  if (model_create_table_sparse(m, &c, sparse, err, err_size)) /* the trainer's sparse layers */
    return -1;
  m->param_memory = alloc_reals_on(m->device, ALLOC_PARAMS, m->n_elems);
  m->grad_memory = alloc_reals_on(m->device, ALLOC_GRADS, m->n_elems);
  if (!m->param_memory || !m->grad_memory) {
    model_free(m);
    memset(m, 0, sizeof *m);
    return errf(err, err_size, "out of memory for the parameters of a %d-layer model of dim %d", c.n_layers, c.dim);
  }
  model_bind_memory(m, m->param_memory, m->grad_memory);
  size_t total = 0;
  for (int i = 0; i < m->n_params; i++) total += logical_elems(&m->params[i]);
  if (total != n) {
    model_free(m);
    memset(m, 0, sizeof *m);
    return errf(err, err_size, "%zu packed parameters for a model of %zu", n, total);
  }
  size_t at = 0;
  for (int i = 0; i < m->n_params; i++) { /* padding rows stay model_create's zeros */
    memcpy(m->params[i].data, packed + at, logical_elems(&m->params[i]) * sizeof(real));
    at += logical_elems(&m->params[i]);
  }
  return 0;
}
