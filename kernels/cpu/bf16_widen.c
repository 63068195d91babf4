/* bf16 linear products without bf16 instructions (bf16.h, linear_bf16_widened): the operands
 * widened to fp32 a slice of K at a time and multiplied by the fp32 kernels' product (blas.h,
 * gemm_rows). A product of two bf16 values is exact in fp32 (8 + 8 significant bits), so this is
 * the arithmetic of a bf16 matmul — operands in bf16, exact products, sums in fp32 — at fp32's
 * speed; only the order of the sums is sgemm's, as oneDNN's order is its own. It is what a CPU
 * without AVX-512 BF16 or AMX computes (oneDNN has only its reference bf16 matmul there), and
 * what TYCHO_BF16=widen asks for anywhere.
 *
 * The bits: each slice of KB terms is one gemm_rows call adding into C, so an element is the
 * slices' sums in order; gemm_rows fixes its tiles by the shape, so nothing depends on the
 * thread count. The widened slices live in one buffer kept between calls (grown, never shrunk,
 * under a lock): (rows of op(A) + columns of op(B)) × KB floats, outside the memory bill as
 * oneDNN's own scratch is. */
#include "bf16.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "real.h"

#if !REAL_IS_DOUBLE

enum { KB = 256 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static float *buffer;
static size_t buffer_elems;

/* The K-slice [k0, k0 + kb) of a bf16 matrix X (row-major, leading dimension ld) widened:
 * across (X is R × K, the slice its columns): dst is R × kb; down (X is K × R, the slice its
 * rows): dst is kb × R. */
static void widen_slice(float *dst, const bf16 *x, int down, int R, int ld, int k0, int kb)
{
  if (!down) {
#pragma omp parallel for if ((size_t)R * kb > 65536 && !omp_in_parallel())
    for (int r = 0; r < R; r++)
      for (int k = 0; k < kb; k++) dst[(size_t)r * kb + k] = bf16_to_float(x[(size_t)r * ld + k0 + k]);
  } else {
#pragma omp parallel for if ((size_t)R * kb > 65536 && !omp_in_parallel())
    for (int k = 0; k < kb; k++)
      for (int r = 0; r < R; r++) dst[(size_t)k * R + r] = bf16_to_float(x[(size_t)(k0 + k) * ld + r]);
  }
}

/* Row-major C (M × N) = op(A) · op(B) + beta · C over bf16 operands, op(A) M × K, op(B) K × N. */
static int gemm_widened(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                        const bf16 *A, int lda, const bf16 *B, int ldb, float beta, float *C, int ldc,
                        char *err, size_t err_size)
{
  const size_t need = ((size_t)M + (size_t)N) * KB;
  pthread_mutex_lock(&lock);
  if (buffer_elems < need) {
    float *grown = realloc(buffer, need * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&lock);
      snprintf(err, err_size, "bf16 product: out of memory widening a %d × %d × %d product's operands "
               "(%zu bytes)", M, N, K, need * sizeof *grown);
      return 1;
    }
    buffer = grown, buffer_elems = need;
  }
  float *a = buffer, *b = buffer + (size_t)M * KB;
  for (int k0 = 0; k0 < K; k0 += KB) {
    const int kb = K - k0 < KB ? K - k0 : KB;
    /* op(A) = A (M × K): its columns; op(A) = Aᵀ (A is K × M): its rows. op(B) = B (K × N): its
     * rows; op(B) = Bᵀ (B is N × K): its columns. */
    widen_slice(a, A, ta != CblasNoTrans, M, lda, k0, kb);
    widen_slice(b, B, tb == CblasNoTrans, N, ldb, k0, kb);
    gemm_rows(ta, tb, M, N, kb, 1.0f, a, ta == CblasNoTrans ? kb : M, b, tb == CblasNoTrans ? N : kb,
              k0 == 0 ? beta : 1.0f, C, ldc);
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

int linear_bf16_widened(int kind, float *dst, const bf16 *src, const bf16 *wei, int BT, int IC, int OC,
                        char *err, size_t err_size)
{
  if (BT == 0 || IC == 0 || OC == 0)
    return 0;
  switch (kind) {
  case BF16_LINEAR_FORWARD: /* out (BT, OC) = inp (BT, IC) · weightᵀ */
  case BF16_LINEAR_FORWARD_ACC:
    return gemm_widened(CblasNoTrans, CblasTrans, BT, OC, IC, src, IC, wei, IC,
                        kind == BF16_LINEAR_FORWARD ? 0.0f : 1.0f, dst, OC, err, err_size);
  case BF16_LINEAR_BACKWARD_INPUT: /* dinp (BT, IC) = dout (BT, OC) · weight (OC, IC) */
    return gemm_widened(CblasNoTrans, CblasNoTrans, BT, IC, OC, src, OC, wei, IC, 0.0f, dst, IC, err,
                        err_size);
  default: /* dweight (OC, IC) += doutᵀ · inp */
    return gemm_widened(CblasTrans, CblasNoTrans, OC, IC, BT, src, OC, wei, IC, 1.0f, dst, IC, err,
                        err_size);
  }
}

#endif

int bf16_widened_asked(void)
{
  const char *e = getenv("TYCHO_BF16");
  return e && e[0] && !strcmp(e, "widen");
}
