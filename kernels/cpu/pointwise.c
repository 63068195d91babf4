/* Element-wise ops: SwiGLU and dropout. The dropout mask is drawn from Philox by the element's
 * index in the full logical tensor (philox.h), so it does not depend on how the tensor is split
 * across ranks, and a recompute in backward redraws the very same mask. SwiGLU runs on the
 * vector layer (vec.h) in fp32 when the CPU has one; the loops here are the scalar path and its
 * reference. */
#include <math.h>

#include "kernels.h"
#include "philox.h"
#include "vec.h"

/* SwiGLU over one span of n elements on the calling thread: the vector layer's or the scalar
 * loop (the same function either way, element by element, so a span's bits do not depend on
 * where it starts). */
static void swiglu_forward_span(real *out, const real *gate, const real *up, size_t n)
{
#if !REAL_IS_DOUBLE
  const struct vec_ops *v = vec_active();
  if (v) {
    v->swiglu_forward(out, gate, up, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) {
    real g = gate[i];
    out[i] = g / (1.0f + real_exp(-g)) * up[i];
  }
}

/* silu'(g) = s (1 + g (1 − s)), s = sigmoid(g). */
static void swiglu_backward_span(real *dgate, real *dup, const real *dout, const real *gate,
                                 const real *up, size_t n)
{
#if !REAL_IS_DOUBLE
  const struct vec_ops *v = vec_active();
  if (v) {
    v->swiglu_backward(dgate, dup, dout, gate, up, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) {
    real g = gate[i], d = dout[i];
    real s = 1.0f / (1.0f + real_exp(-g));
    real dg = d * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
    dgate[i] = dg;
  }
}

void swiglu_forward(real *out, const real *gate, const real *up, size_t n_elems)
{
  const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
  for (size_t b = 0; b < nb; b++) {
    const size_t lo = b * VEC_BLOCK;
    swiglu_forward_span(out + lo, gate + lo, up + lo, VEC_LEN(n_elems, lo));
  }
}

void swiglu_backward(real *dgate, real *dup, const real *dout, const real *gate,
                     const real *up, size_t n_elems)
{
  const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
  for (size_t b = 0; b < nb; b++) {
    const size_t lo = b * VEC_BLOCK;
    swiglu_backward_span(dgate + lo, dup + lo, dout + lo, gate + lo, up + lo, VEC_LEN(n_elems, lo));
  }
}

/* The fused gate|up product's rows: gu (rows, 2F) holds [gate | up] per row. */
void swiglu_forward_rows(real *out, const real *gu, int rows, int F)
{
#pragma omp parallel for if ((size_t)rows * F > VEC_BLOCK)
  for (int r = 0; r < rows; r++) {
    const real *g = gu + (size_t)r * 2 * F;
    swiglu_forward_span(out + (size_t)r * F, g, g + F, (size_t)F);
  }
}

void swiglu_backward_rows(real *dgu, const real *dout, const real *gu, int rows, int F)
{
#pragma omp parallel for if ((size_t)rows * F > VEC_BLOCK)
  for (int r = 0; r < rows; r++) {
    const real *g = gu + (size_t)r * 2 * F;
    real *d = dgu + (size_t)r * 2 * F;
    swiglu_backward_span(d, d + F, dout + (size_t)r * F, g, g + F, (size_t)F);
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
