/* AdamW, clipping and the learning-rate schedule over the parameter table (optimizer.h). */
#include "runtime/optimizer.h"

#include <math.h>
#include <string.h>

#include "kernels.h"
#include "runtime/alloc.h"
#include "util/err.h"

int optimizer_create(struct optimizer *o, const struct plan *p, const struct model *m,
                     char *err, size_t err_size)
{
  memset(o, 0, sizeof *o);
  o->lr = p->optimizer.lr;
  o->beta1 = p->optimizer.beta1;
  o->beta2 = p->optimizer.beta2;
  o->eps = p->optimizer.eps;
  o->weight_decay = p->optimizer.weight_decay;
  o->grad_clip = p->optimizer.grad_clip;
  o->n_elems = m->n_elems;
  o->m = alloc_floats(ALLOC_OPTIMIZER, m->n_elems);
  o->v = alloc_floats(ALLOC_OPTIMIZER, m->n_elems);
  if (!o->m || !o->v) {
    optimizer_free(o);
    return errf(err, err_size, "out of memory for the optimizer state (%zu floats)", m->n_elems);
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
  return sqrt(sumsq(m->grad_memory, m->n_elems)); /* the alignment gaps hold zeros */
}

double optimizer_clip(struct model *m, double max_norm)
{
  double norm = optimizer_grad_norm(m);
  if (max_norm > 0.0) {
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
      scale_inplace(m->grad_memory, m->n_elems, (float)coef);
  }
  return norm;
}

void optimizer_update(struct optimizer *o, struct model *m, long long step, double lr)
{
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    adamw_update(p->data, p->grad, o->m + p->offset, o->v + p->offset, p->n_elems, lr, o->beta1,
                 o->beta2, o->eps, p->weight_decay ? o->weight_decay : 0.0, (int)(step + 1));
  }
}
