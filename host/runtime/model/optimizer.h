/* The optimizer step over the model's parameter table: torch.optim.AdamW with weight decay on
 * 2-D tensors only (embedding, linear, head; none on norm gains), gradient clipping by the
 * global L2 norm as torch.nn.utils.clip_grad_norm_, and the learning-rate schedule. State (m, v)
 * is one contiguous block each, fp32: on one rank it mirrors the gradient memory (same offsets);
 * under ZeRO it holds only the ranges of the flat layout this rank owns, packed in order
 * (optimizer_update_range). The kernels (sumsq, adamw_update) are the model's
 * table (m->k, model.h): the state lives beside the model's memory, on its backend, so the
 * optimizer takes the table from the model it updates rather than holding one. */
#ifndef TYCHO_RUNTIME_OPTIMIZER_H
#define TYCHO_RUNTIME_OPTIMIZER_H
#include <stddef.h>

#include "plan/plan.h"
#include "runtime/model/model.h"

struct optimizer {
  double lr, beta1, beta2, eps, weight_decay, grad_clip; /* from plan->optimizer */
  size_t n_elems;
  real *m, *v; /* (n_elems) first and second moments, billed to "optimizer" */
};

/* State for every element of the model's flat layout. */
int optimizer_create(struct optimizer *o, const struct plan *p, const struct model *m,
                     char *err, size_t err_size);
/* State for n_elems elements (the ranges a ZeRO rank owns). */
int optimizer_create_sized(struct optimizer *o, const struct plan *p, size_t n_elems,
                           char *err, size_t err_size);
void optimizer_free(struct optimizer *o);

/* The learning rate at 0-based step s (plan->lr_schedule, peak plan->optimizer.lr):
 *   s < warmup:            lr · (s + 1) / warmup
 *   "constant":            lr
 *   s ≥ decay_steps:       min_lr
 *   "cosine":              min_lr + ½(1 + cos(π·(s − warmup)/(decay_steps − warmup)))·(lr − min_lr)
 *   "linear":              min_lr + (1 − (s − warmup)/(decay_steps − warmup))·(lr − min_lr) */
double optimizer_lr(const struct plan *p, long long step);

/* The global L2 norm of all gradients (summed in double, the same bits for any thread count). */
double optimizer_grad_norm(const struct model *m);
/* The factor clipping scales gradients by: max_norm / (norm + 1e-6) when that is < 1, else 1
 * (max_norm 0: always 1), as torch.nn.utils.clip_grad_norm_. */
double optimizer_clip_coef(double norm, double max_norm);
/* One AdamW update of every parameter at 0-based step (bias corrections use step + 1). */
void optimizer_update(struct optimizer *o, struct model *m, long long step, double lr);
/* The same update on the flat-layout range [flat, flat + n_elems): params and grads point at
 * that range's first element, the state at o->m + state_offset. Each parameter overlapping the
 * range is updated over the overlap with its own weight decay; gaps between parameters are
 * left alone. The gradients are read times grad_scale (clipping's coefficient rounded to real,
 * 1 when not clipping; adamw_update, ops.h), the memory left as it is. A bf16 model's copies of
 * what it updates are written too (adamw_update_bf16): at `copies`, parallel to params, when given;
 * else, where params is the model's own memory, at each parameter's copy. */
void optimizer_update_range(struct optimizer *o, const struct model *m, size_t flat,
                            size_t n_elems, real *params, const real *grads,
                            size_t state_offset, long long step, double lr, real grad_scale,
                            bf16 *copies);

#endif
