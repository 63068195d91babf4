/* bf16 conversions (bf16.h). Without oneDNN the products are refused by name. */
#include "bf16.h"

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
static int no_dnnl(char *err, size_t err_size)
{
  snprintf(err, err_size, "bf16 products need oneDNN, and this build of tycho has none "
           "(install libdnnl-dev, scripts/install-deps.sh, and build again)");
  return 1;
}

int bf16_matmul_available(const char **impl, char *err, size_t err_size)
{
  if (impl)
    *impl = "none";
  return no_dnnl(err, err_size);
}

int linear_bf16_forward(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                        char *err, size_t err_size)
{
  (void)out, (void)inp, (void)weight, (void)BT, (void)IC, (void)OC;
  return no_dnnl(err, err_size);
}

int linear_bf16_forward_acc(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                            char *err, size_t err_size)
{
  (void)out, (void)inp, (void)weight, (void)BT, (void)IC, (void)OC;
  return no_dnnl(err, err_size);
}

int linear_bf16_backward_input(float *dinp, const bf16 *dout, const bf16 *weight, int BT, int IC,
                               int OC, char *err, size_t err_size)
{
  (void)dinp, (void)dout, (void)weight, (void)BT, (void)IC, (void)OC;
  return no_dnnl(err, err_size);
}

int linear_bf16_backward_weight(float *dweight, const bf16 *dout, const bf16 *inp, int BT, int IC,
                                int OC, char *err, size_t err_size)
{
  (void)dweight, (void)dout, (void)inp, (void)BT, (void)IC, (void)OC;
  return no_dnnl(err, err_size);
}
#endif
