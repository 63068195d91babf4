/* bf16 conversions (bf16.h), and without oneDNN the products: widened (bf16_widen.c). */
#include "bf16.h"
#include "real.h"

#include <stdio.h>
#include <string.h>

/* bf16_from_float without a branch, so the compiler vectorises the loop, and built for AVX-512
 * and AVX2 besides the baseline, chosen when the program loads (the same bits on every path:
 * integer operations only). The AVX-512 clone is chosen by the feature, not by a CPU model
 * ("arch=skylake-avx512" was never taken on other AVX-512 CPUs, AMD's among them). */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void round_span(bf16 *dst, const float *src, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x0040u;
    dst[i] = (bf16)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

void bf16_round(bf16 *dst, const float *src, size_t n)
{
  enum { SPAN = 16384 };
  const size_t n_spans = (n + SPAN - 1) / SPAN;
#pragma omp parallel for if (n_spans > 1)
  for (size_t s = 0; s < n_spans; s++) {
    const size_t lo = s * SPAN;
    round_span(dst + lo, src + lo, n - lo < SPAN ? n - lo : SPAN);
  }
}

void bf16_widen(float *dst, const bf16 *src, size_t n)
{
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
}

#ifndef TYCHO_HAVE_DNNL
/* Without oneDNN the products are the widened ones (fp32 builds), or refused (the float64
 * build, which has no bf16 compute). */
int bf16_matmul_available(const char **impl, char *err, size_t err_size)
{
  if (impl)
    *impl = "none";
  snprintf(err, err_size, "this build of tycho has no oneDNN for bf16 products (install libdnnl-dev, "
           "scripts/install-deps.sh, and build again)");
  return 1;
}

const char *bf16_linear_path(char *buf, size_t n)
{
  snprintf(buf, n, "fp32 products over bf16 operands widened (this build has no oneDNN)");
  return buf;
}

static int product(int kind, float *dst, const bf16 *src, const bf16 *wei, int BT, int IC, int OC,
                   char *err, size_t err_size)
{
#if REAL_IS_DOUBLE
  (void)kind, (void)dst, (void)src, (void)wei, (void)BT, (void)IC, (void)OC;
  snprintf(err, err_size, "the float64 build has no bf16 products");
  return 1;
#else
  return linear_bf16_widened(kind, dst, src, wei, BT, IC, OC, err, err_size);
#endif
}

int linear_bf16_forward(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                        char *err, size_t err_size)
{
  return product(BF16_LINEAR_FORWARD, out, inp, weight, BT, IC, OC, err, err_size);
}

int linear_bf16_forward_acc(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                            char *err, size_t err_size)
{
  return product(BF16_LINEAR_FORWARD_ACC, out, inp, weight, BT, IC, OC, err, err_size);
}

int linear_bf16_backward_input(float *dinp, const bf16 *dout, const bf16 *weight, int BT, int IC,
                               int OC, char *err, size_t err_size)
{
  return product(BF16_LINEAR_BACKWARD_INPUT, dinp, dout, weight, BT, IC, OC, err, err_size);
}

int linear_bf16_backward_weight(float *dweight, const bf16 *dout, const bf16 *inp, int BT, int IC,
                                int OC, char *err, size_t err_size)
{
  return product(BF16_LINEAR_BACKWARD_WEIGHT, dweight, dout, inp, BT, IC, OC, err, err_size);
}
#endif
