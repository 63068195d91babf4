/* The bf16 compute entries of the CPU table (ops.h, "bf16 compute"): each producer writes the
 * bf16 operand of the products that read it while the values are in cache, with the same fp32
 * values its fp32 twin writes, then rounded to nearest even (bf16.h). The products themselves are
 * kernels/cpu/dnnl/linear_bf16.c (oneDNN), or refused by name without it (bf16.c); RMSNorm's is
 * beside its twin in dense.c. The widenings read a norm's gain and the embedding's rows from their
 * bf16 copies (exact). The float64 build has none of this: bf16 plans are refused there. */
#include "kernels.h"

#if !REAL_IS_DOUBLE
#include "bf16.h"
#include "vec.h"

void round_bf16(bf16 *dst, const real *src, size_t n_elems)
{
  bf16_round(dst, src, n_elems);
}

void widen_bf16(real *dst, const bf16 *src, size_t n_elems)
{
  for (size_t i = 0; i < n_elems; i++) dst[i] = bf16_to_float(src[i]);
}

/* acc ← bf16(acc + x): the fp32 sum of two bf16 values, rounded once (bf16.h's rounding). */
void accumulate_bf16(bf16 *acc, const bf16 *x, size_t n_elems)
{
#pragma omp parallel for if (n_elems > VEC_BLOCK)
  for (size_t i = 0; i < n_elems; i++) acc[i] = bf16_from_float(bf16_to_float(acc[i]) + bf16_to_float(x[i]));
}

/* encoder_forward_shard's rows, read from the bf16 copy (a bf16 is exact in fp32). */
void encoder_forward_bf16(real *out, const int *tokens, const bf16 *wte, int v0, int Vl, int BT, int C)
{
#pragma omp parallel for if ((size_t)BT * C > VEC_BLOCK)
  for (int bt = 0; bt < BT; bt++) {
    const int row = tokens[bt] - v0;
    real *o = out + (size_t)bt * C;
    if (row < 0 || row >= Vl) {
      for (int c = 0; c < C; c++) o[c] = 0.0f;
      continue;
    }
    const bf16 *w = wte + (size_t)row * C;
    for (int c = 0; c < C; c++) o[c] = bf16_to_float(w[c]);
  }
}

int linear_forward_bf16(real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                        char *err, size_t err_size)
{
  return linear_bf16_forward(out, inp, weight, BT, IC, OC, err, err_size);
}

int linear_forward_acc_bf16(real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                            char *err, size_t err_size)
{
  return linear_bf16_forward_acc(out, inp, weight, BT, IC, OC, err, err_size);
}

int linear_backward_bf16(real *dinp, real *dweight, const bf16 *dout, const bf16 *inp,
                         const bf16 *weight, int BT, int IC, int OC, char *err, size_t err_size)
{
  if (dinp && linear_bf16_backward_input(dinp, dout, weight, BT, IC, OC, err, err_size))
    return 1;
  /* dweight NULL: the input gradient alone (a split backward's B) */
  return dweight ? linear_bf16_backward_weight(dweight, dout, inp, BT, IC, OC, err, err_size) : 0;
}

/* Both below run their fp32 twin on one block of at most VEC_BLOCK elements (one thread: an
 * OpenMP region inside this one is not nested out), then round the block while it is in cache;
 * element-wise, so the fp32 values are the whole call's bits. */
void swiglu_forward_bf16(bf16 *out, const real *gate, const real *up, size_t n_elems)
{
  const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
  for (size_t b = 0; b < nb; b++) {
    real tmp[VEC_BLOCK];
    const size_t lo = b * VEC_BLOCK, n = VEC_LEN(n_elems, lo);
    swiglu_forward(tmp, gate + lo, up + lo, n);
    for (size_t i = 0; i < n; i++) out[lo + i] = bf16_from_float(tmp[i]);
  }
}

void swiglu_forward_rows_bf16(bf16 *out, const real *gu, int rows, int F)
{
#pragma omp parallel for if ((size_t)rows * F > VEC_BLOCK)
  for (int r = 0; r < rows; r++) {
    real tmp[VEC_BLOCK];
    const real *g = gu + (size_t)r * 2 * F;
    for (size_t lo = 0; lo < (size_t)F; lo += VEC_BLOCK) {
      const size_t n = VEC_LEN((size_t)F, lo);
      swiglu_forward(tmp, g + lo, g + F + lo, n);
      for (size_t i = 0; i < n; i++) out[(size_t)r * F + lo + i] = bf16_from_float(tmp[i]);
    }
  }
}

void adamw_update_bf16(real *param, bf16 *param_bf16, const real *grad, real *m, real *v,
                       size_t n_elems, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int t, real grad_scale)
{
  const size_t nb = VEC_BLOCKS(n_elems);
#pragma omp parallel for if (nb > 1)
  for (size_t b = 0; b < nb; b++) {
    const size_t lo = b * VEC_BLOCK, n = VEC_LEN(n_elems, lo);
    adamw_update(param + lo, grad + lo, m + lo, v + lo, n, lr, beta1, beta2, eps,
                       weight_decay, t, grad_scale);
    for (size_t i = 0; i < n; i++) param_bf16[lo + i] = bf16_from_float(param[lo + i]);
  }
}
#endif
