/* AdamW, clipping and the learning-rate schedule over the parameter table (optimizer.h), on the
 * model's kernel table (m->k). */
#include "runtime/model/optimizer.h"

#include <math.h>
#include <string.h>

#include "ops.h"
#include "runtime/model/alloc.h"
#include "util/err.h"

int optimizer_create(struct optimizer *o, const struct plan *p, const struct model *m,
                     char *err, size_t err_size)
{
  return optimizer_create_sized(o, p, m->n_elems, err, err_size);
}

int optimizer_create_sized(struct optimizer *o, const struct plan *p, size_t n_elems,
                           char *err, size_t err_size)
{
  memset(o, 0, sizeof *o);
  o->lr = p->optimizer.lr;
  o->beta1 = p->optimizer.beta1;
  o->beta2 = p->optimizer.beta2;
  o->eps = p->optimizer.eps;
  o->weight_decay = p->optimizer.weight_decay;
  o->grad_clip = p->optimizer.grad_clip;
  o->n_elems = n_elems;
  o->m = alloc_reals(ALLOC_OPTIMIZER, n_elems);
  o->v = alloc_reals(ALLOC_OPTIMIZER, n_elems);
  if (!o->m || !o->v) {
    optimizer_free(o);
    return errf(err, err_size, "out of memory for the optimizer state (%zu elements)", n_elems);
  }
  return 0;
}

void optimizer_free(struct optimizer *o)
{
  alloc_free(o->m);
  alloc_free(o->v);
  memset(o, 0, sizeof *o);
}

double optimizer_lr(const struct plan *p, long long step)
{
  const double lr = p->optimizer.lr, min_lr = p->lr_schedule.min_lr;
  const long long warmup = p->lr_schedule.warmup, decay_steps = p->lr_schedule.decay_steps;
  if (step < warmup)
    return lr * (double)(step + 1) / (double)warmup;
  if (p->lr_schedule.decay == PLAN_DECAY_CONSTANT)
    return lr;
  if (step >= decay_steps)
    return min_lr;
  const double progress = (double)(step - warmup) / (double)(decay_steps - warmup);
  if (p->lr_schedule.decay == PLAN_DECAY_LINEAR)
    return min_lr + (lr - min_lr) * (1.0 - progress);
  return min_lr + 0.5 * (1.0 + cos(3.14159265358979323846 * progress)) * (lr - min_lr);
}

double optimizer_grad_norm(const struct model *m)
{
  return sqrt(m->k->sumsq(m->kctx, m->grad_memory, m->n_elems)); /* the alignment gaps hold zeros */
}

double optimizer_clip_coef(double norm, double max_norm)
{
  if (!(max_norm > 0.0))
    return 1.0;
  double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

void optimizer_update(struct optimizer *o, struct model *m, long long step, double lr)
{
  optimizer_update_range(o, m, 0, m->n_elems, m->param_memory, m->grad_memory, 0, step, lr, 1, NULL);
}

void optimizer_update_range(struct optimizer *o, const struct model *m, size_t flat,
                            size_t n_elems, real *params, const real *grads,
                            size_t state_offset, long long step, double lr, real grad_scale,
                            bf16 *copies)
{
  const size_t end = flat + n_elems;
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    size_t lo = p->offset > flat ? p->offset : flat;
    size_t hi = p->offset + p->n_elems < end ? p->offset + p->n_elems : end;
    if (lo >= hi)
      continue;
    size_t at = lo - flat;
    const double wd = p->weight_decay ? o->weight_decay : 0.0;
    /* bf16 models: AdamW writes the compute copy of what it updates in the model's memory */
    bf16 *copy = copies ? copies + at
                 : params == m->param_memory + flat ? model_param_bf16(m, p, lo - p->offset) : NULL;
    if (copy)
      m->k->adamw_update_bf16(m->kctx, params + at, copy, grads + at, o->m + state_offset + at,
                              o->v + state_offset + at, hi - lo, lr, o->beta1, o->beta2, o->eps, wd,
                              (int)(step + 1), grad_scale);
    else
      m->k->adamw_update(m->kctx, params + at, grads + at, o->m + state_offset + at,
                         o->v + state_offset + at, hi - lo, lr, o->beta1, o->beta2, o->eps, wd,
                         (int)(step + 1), grad_scale);
  }
}
