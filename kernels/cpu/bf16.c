/* bf16 conversions (bf16.h). Without oneDNN the products are refused by name. */
#include "bf16.h"

#include <stdio.h>

void bf16_round(bf16 *dst, const float *src, size_t n)
{
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) dst[i] = bf16_from_float(src[i]);
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
