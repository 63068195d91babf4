/* Small matrix products with bf16 operands, for the attention's blocks in the bf16 mode
 * (precision.compute = "bf16"). The operands are given in fp32 and rounded to bf16 as they are
 * packed; the products accumulate in fp32. oneDNN has no bf16 call of this form (its bf16
 * products are matmul primitives made per shape), and the attention's blocks are small and
 * many, called from its parallel tasks; so tycho has its own: an AVX-512 BF16 kernel
 * (vdpbf16ps) where the CPU has one, else an AVX2 one or a scalar loop of the same arithmetic.
 *
 * The arithmetic, whichever path computes it: with a = bf16(op(A)) and b = bf16(op(B)) (round
 * to nearest even; the process runs with denormals as zero), each C element is
 *   acc = 0; for each pair p = 0, 1, ...: acc = (acc + a[2p+1]·b[2p+1]) + a[2p]·b[2p]
 * over K (a K of odd length padded with one zero term), each addition one fp32 rounding (a
 * product of two bf16 is exact in fp32), then C = alpha·acc (beta 0) or alpha·acc + beta·C,
 * each operation rounded. That is the documented arithmetic of vdpbf16ps (Intel's SDM); where a
 * CPU's instruction rounds otherwise the two paths differ in the last bits, never by more than
 * the bound the tests hold both to. A C element's sum does not depend on M, N or the thread
 * count. */
#ifndef TYCHO_KERNELS_CPU_GEMM_BF16_H
#define TYCHO_KERNELS_CPU_GEMM_BF16_H
#include <cblas.h>
#include <stddef.h>

#include "bf16.h"

/* bf16 elements of the pack buffer gemm_bf16 needs for an M × N × K product. */
size_t gemm_bf16_pack_elems(int M, int N, int K);

/* Row-major C = alpha · op(A) · op(B) + beta · C (cblas's arguments; beta 0 does not read C),
 * operands rounded to bf16. pack: gemm_bf16_pack_elems(M, N, K) elements, 64-byte aligned for
 * speed (any alignment works). On the calling thread; inside no parallel region, the rows are
 * shared among the OpenMP threads (the same bits). */
void gemm_bf16(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
               bf16 *pack);

/* The arithmetic above as a plain loop with fmaf, rounding each operand where it is read: the
 * reference the tests hold both of gemm_bf16's paths to (callable whatever path is chosen). */
void gemm_bf16_scalar(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc);

/* "avx512_bf16" where gemm_bf16 runs the AVX-512 BF16 kernel; else "avx2" where the CPU has AVX2
 * and FMA and the vector layer is at avx2 or above (the scalar path's bits, eight lanes at a
 * time); else "scalar" (TYCHO_SIMD=scalar, vec_select, or not x86-64): asked at each call. */
const char *gemm_bf16_path(void);

/* The vector kernel (gemm_bf16_avx512.c, built for AVX-512 BF16); gemm_bf16 calls it only where
 * the CPU has the instructions. */
void gemm_bf16_avx512(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc, bf16 *pack);

/* The AVX2 path (gemm_bf16_avx2.c): rows [i0, i1) of C from op(A) packed rounded as M rows of K
 * bf16 and op(B) rounded and widened as K rows of N16 floats (64-byte aligned). */
void gemm_bf16_avx2_rows(int i0, int i1, int N, int N16, int K, float alpha, const bf16 *a,
                         const float *bw, float beta, float *C, int ldc);

#endif
