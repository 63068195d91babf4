/* Element-wise ops: SwiGLU and dropout. The dropout mask is drawn from Philox by the element's
 * index in the full logical tensor (philox.h), so it does not depend on how the tensor is split
 * across ranks, and a recompute in backward redraws the very same mask. SwiGLU runs on the
 * vector layer (vec.h) in fp32 when the CPU has one; the loops here are the scalar path and its
 * reference. */
#include <math.h>

#include "kernels.h"
#include "philox.h"
#include "vec.h"

void swiglu_forward(real *out, const real *gate, const real *up, size_t n_elems)
{
#if !REAL_IS_DOUBLE
  const struct vec_ops *v = vec_active();
  if (v) {
    const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
    for (size_t b = 0; b < nb; b++) {
      const size_t lo = b * VEC_BLOCK;
      v->swiglu_forward(out + lo, gate + lo, up + lo, VEC_LEN(n_elems, lo));
    }
    return;
  }
#endif
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) {
    real g = gate[i];
    out[i] = g / (1.0f + real_exp(-g)) * up[i];
  }
}

void swiglu_backward(real *dgate, real *dup, const real *dout, const real *gate,
                     const real *up, size_t n_elems)
{
  /* silu'(g) = s (1 + g (1 − s)), s = sigmoid(g). */
#if !REAL_IS_DOUBLE
  const struct vec_ops *v = vec_active();
  if (v) {
    const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
    for (size_t b = 0; b < nb; b++) {
      const size_t lo = b * VEC_BLOCK;
      v->swiglu_backward(dgate + lo, dup + lo, dout + lo, gate + lo, up + lo, VEC_LEN(n_elems, lo));
    }
    return;
  }
#endif
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) {
    real g = gate[i], d = dout[i];
    real s = 1.0f / (1.0f + real_exp(-g));
    real dg = d * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
    dgate[i] = dg;
  }
}

void dropout_mask(real *mask, size_t n_elems, float p, uint64_t seed, uint32_t c1,
                  uint32_t c2, uint32_t c3, uint64_t first_elem)
{
  const real keep_scale = p < 1.0f ? (real)1 / (1 - (real)p) : 0;
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++)
    mask[i] = philox_uniform(seed, c1, c2, c3, first_elem + i) < p ? 0.0f : keep_scale;
}

void dropout_forward(real *out, const real *inp, const real *mask, size_t n_elems)
{
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) out[i] = inp[i] * mask[i];
}

void dropout_backward(real *dinp, const real *dout, const real *mask, size_t n_elems)
{
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) dinp[i] = dout[i] * mask[i];
}
