/* The optimizer step and the gradient utilities around it (global norm, clipping scale).
 * adamw_update follows torch.optim.AdamW's single-tensor code operation by operation (the
 * scalars computed in double, as Python does, then rounded to real for the tensor ops), so a
 * run here can be compared with a PyTorch run to rounding. The gradient is multiplied by
 * grad_scale as it is read (clipping, folded into this sweep): the one rounding a separate
 * scale_inplace sweep made before, so the bits are those of scaling first, and exactly the
 * unscaled step for grad_scale 1. In fp32 the vector layer (vec.h) runs these loops when the
 * CPU has one: adamw and scale_inplace give the scalar loops' bits, sumsq the same parts summed
 * in another order inside each (the same bits for any thread count either way). */
#include <math.h>

#include "kernels.h"
#include "vec.h"

void adamw_update(real *param, const real *grad, real *m, real *v, size_t n_elems,
                  double lr, double beta1, double beta2, double eps, double weight_decay, int t,
                  real grad_scale)
{
  const double bias_correction1 = 1.0 - pow(beta1, t);
  const double bias_correction2 = 1.0 - pow(beta2, t);
  const real decay = (real)(1.0 - lr * weight_decay);        /* param.mul_(1 - lr*wd)     */
  const real m_weight = (real)(1.0 - beta1);                  /* exp_avg.lerp_(g, 1-b1)    */
  const real v_decay = (real)beta2, v_weight = (real)(1.0 - beta2);
  const real step_size = (real)(lr / bias_correction1);
  const real bias_correction2_sqrt = (real)sqrt(bias_correction2);
  const real eps_f = (real)eps;
#if !REAL_IS_DOUBLE
  const struct vec_ops *vo = vec_active();
  if (vo) {
    const struct vec_adamw c = { grad_scale, decay, m_weight, v_decay, v_weight, step_size,
                                 bias_correction2_sqrt, eps_f };
    const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
    for (size_t b = 0; b < nb; b++) {
      const size_t lo = b * VEC_BLOCK;
      vo->adamw(param + lo, grad + lo, m + lo, v + lo, VEC_LEN(n_elems, lo), &c);
    }
    return;
  }
#endif
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) {
    real g = grad[i] * grad_scale;
    real p = param[i] * decay;
    real mi = m[i] + m_weight * (g - m[i]);
    real vi = v[i] * v_decay + v_weight * g * g;
    real denom = real_sqrt(vi) / bias_correction2_sqrt + eps_f;
    param[i] = p - step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

double sumsq(const real *x, size_t n_elems)
{
  /* A fixed split into SUMSQ_PARTS parts, summed in order: the same bits for any thread
   * count, so a gradient norm (and clipping) does not depend on how many threads ran. */
  enum { SUMSQ_PARTS = 256 };
  double part[SUMSQ_PARTS];
  const size_t chunk = (n_elems + SUMSQ_PARTS - 1) / SUMSQ_PARTS;
#if !REAL_IS_DOUBLE
  const struct vec_ops *vo = vec_active();
#endif
#pragma omp parallel for
  for (int j = 0; j < SUMSQ_PARTS; j++) {
    size_t lo = (size_t)j * chunk, hi = lo + chunk < n_elems ? lo + chunk : n_elems;
#if !REAL_IS_DOUBLE
    if (vo) {
      part[j] = lo < hi ? vo->sumsq(x + lo, hi - lo) : 0.0;
      continue;
    }
#endif
    double s = 0.0;
    for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
    part[j] = s;
  }
  double total = 0.0;
  for (int j = 0; j < SUMSQ_PARTS; j++) total += part[j];
  return total;
}

void scale_inplace(real *x, size_t n_elems, real s)
{
#if !REAL_IS_DOUBLE
  const struct vec_ops *vo = vec_active();
  if (vo) {
    const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
    for (size_t b = 0; b < nb; b++) {
      const size_t lo = b * VEC_BLOCK;
      vo->scale(x + lo, VEC_LEN(n_elems, lo), s);
    }
    return;
  }
#endif
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) x[i] *= s;
}
