/* Softmax cross-entropy over the vocabulary. Logit rows are Vp wide (the vocabulary padded for
 * alignment and for even sharding); only the first V columns are real tokens, the rest get
 * probability 0 and gradient 0. Target −1 marks a position without a loss (padding, prompt).
 * In fp32 a row's max, exp(l − max), Σ and scaling run on the vector layer (vec.h) when the CPU
 * has one: the same operations with its exp (≤ 1 ulp) and Σ in double in another order; the
 * backward's row (p − onehot) · scale runs there too, with the scalar loop's bits. The loops
 * here are the scalar path and its reference. */
#include <math.h>

#include "kernels.h"
#include "vec.h"

void crossentropy_forward(real *losses, real *probs, const real *logits, const int *targets,
                          int BT, int V, int Vp)
{
  const struct vec_ops *v = VEC_FOR_REAL;
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *l = logits + (size_t)bt * Vp;
    real *p = probs + (size_t)bt * Vp;
    int target = targets[bt];
    real target_logit = target >= 0 ? l[target] : 0.0f; /* read before p overwrites l */
    real max = -INFINITY;
    double sum = 0.0;
    if (v) {
      max = v->max((const float *)l, (size_t)V);
      sum = v->exp_sum((float *)p, (const float *)l, max, (size_t)V);
      v->scale((float *)p, (size_t)V, (float)(1.0 / sum));
    } else {
      for (int i = 0; i < V; i++) max = l[i] > max ? l[i] : max;
      for (int i = 0; i < V; i++) {
        p[i] = real_exp(l[i] - max);
        sum += p[i];
      }
      real inv_sum = (real)(1.0 / sum);
      for (int i = 0; i < V; i++) p[i] *= inv_sum;
    }
    for (int i = V; i < Vp; i++) p[i] = 0.0f;
    /* −log p_target = log Σ exp(l − max) − (l_target − max), finite even where p underflows. */
    losses[bt] = target >= 0 ? (real)(log(sum) - ((double)target_logit - max)) : 0.0f;
  }
}

void crossentropy_backward(real *dlogits, const real *probs, const int *targets,
                           real dloss_scale, int BT, int V, int Vp)
{
  const struct vec_ops *v = VEC_FOR_REAL;
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *p = probs + (size_t)bt * Vp;
    real *d = dlogits + (size_t)bt * Vp;
    int target = targets[bt];
    if (target < 0) {
      for (int i = 0; i < Vp; i++) d[i] = 0.0f;
      continue;
    }
    if (v)
      v->ce_backward((float *)d, (const float *)p, target, (float)dloss_scale, (size_t)V);
    else
      for (int i = 0; i < V; i++) d[i] = (p[i] - (i == target ? 1.0f : 0.0f)) * dloss_scale;
    for (int i = V; i < Vp; i++) d[i] = 0.0f;
  }
}

/* ---- the vocabulary split over ranks: the same arithmetic, with the reductions between ---- */

void crossentropy_shard_max(real *stats, const real *logits, int BT, int Vvalid, int Vl)
{
  const struct vec_ops *v = VEC_FOR_REAL;
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *l = logits + (size_t)bt * Vl;
    real max = -INFINITY;
    if (v)
      max = v->max((const float *)l, (size_t)Vvalid);
    else
      for (int i = 0; i < Vvalid; i++) max = l[i] > max ? l[i] : max;
    stats[bt] = max;
  }
}

void crossentropy_shard_sums(real *stats, const real *logits, const int *targets, int v0,
                             int BT, int Vvalid, int Vl)
{
  const struct vec_ops *v = VEC_FOR_REAL;
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *l = logits + (size_t)bt * Vl;
    const real max = stats[bt];
    double sum = 0.0;
    if (v)
      sum = v->exp_sum(NULL, (const float *)l, max, (size_t)Vvalid);
    else
      for (int i = 0; i < Vvalid; i++) sum += real_exp(l[i] - max);
    stats[BT + bt] = (real)sum;
    int t = targets[bt] - v0;
    stats[2 * BT + bt] = targets[bt] >= 0 && t >= 0 && t < Vvalid ? l[t] : 0.0f;
  }
}

void crossentropy_shard_finish(real *losses, real *probs, const real *logits,
                               const real *stats, const int *targets, int BT, int Vvalid, int Vl)
{
  const struct vec_ops *v = VEC_FOR_REAL;
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *l = logits + (size_t)bt * Vl;
    real *p = probs + (size_t)bt * Vl;
    const real max = stats[bt];
    const double sum = stats[BT + bt];
    const real inv_sum = (real)(1.0 / sum);
    if (v)
      v->exp_scale((float *)p, (const float *)l, max, inv_sum, (size_t)Vvalid);
    else
      for (int i = 0; i < Vvalid; i++) p[i] = real_exp(l[i] - max) * inv_sum;
    for (int i = Vvalid; i < Vl; i++) p[i] = 0.0f;
    losses[bt] = targets[bt] >= 0 ? (real)(log(sum) - ((double)stats[2 * BT + bt] - max)) : 0.0f;
  }
}

void crossentropy_shard_backward(real *dlogits, const real *probs, const int *targets, int v0,
                                 real dloss_scale, int BT, int Vvalid, int Vl)
{
  const struct vec_ops *v = VEC_FOR_REAL;
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *p = probs + (size_t)bt * Vl;
    real *d = dlogits + (size_t)bt * Vl;
    if (targets[bt] < 0) {
      for (int i = 0; i < Vl; i++) d[i] = 0.0f;
      continue;
    }
    const int t = targets[bt] - v0;
    if (v)
      v->ce_backward((float *)d, (const float *)p, t, (float)dloss_scale, (size_t)Vvalid);
    else
      for (int i = 0; i < Vvalid; i++) d[i] = (p[i] - (i == t ? 1.0f : 0.0f)) * dloss_scale;
    for (int i = Vvalid; i < Vl; i++) d[i] = 0.0f;
  }
}
