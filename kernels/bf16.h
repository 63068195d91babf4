/* bfloat16 on the CPU: the element type of precision.compute = "bf16" (docs/design.md, "Kernels and
 * backends"). A bf16 is the upper 16 bits of an IEEE binary32 (8 exponent bits, 7 mantissa bits):
 * converting from float rounds to nearest, ties to even, keeps infinities and turns every NaN into
 * a quiet NaN (never into an infinity), and converting back is exact. Matrix products take bf16
 * operands and accumulate and write in fp32: oneDNN's matmul where the build has it and the CPU
 * has bf16 products (kernels/cpu/dnnl/), else the fp32 product over the operands widened
 * (kernels/cpu/bf16_widen.c: the same arithmetic, since a product of two bf16 is exact in fp32).
 *
 * Every function that can fail returns 0, or nonzero with a one-line message in err. */
#ifndef TYCHO_KERNELS_BF16_H
#define TYCHO_KERNELS_BF16_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;

static inline bf16 bf16_from_float(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, sign kept (rounding could carry into inf) */
    return (bf16)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (bf16)(u >> 16);
}

static inline float bf16_to_float(bf16 b)
{
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* dst[i] = bf16 of src[i], and back; OpenMP-parallel over i. */
void bf16_round(bf16 *dst, const float *src, size_t n);
void bf16_widen(float *dst, const bf16 *src, size_t n);

/* Whether this build and CPU run bf16 products at speed: oneDNN is linked and its bf16 matmul
 * is not the reference implementation (which a CPU without AVX-512 BF16 or AMX gets). With 0,
 * *impl (may be NULL) names oneDNN's implementation, e.g. "brg:avx512_core_bf16". With nonzero,
 * err says why not; the products below still run, widened (linear_bf16_widened). */
int bf16_matmul_available(const char **impl, char *err, size_t err_size);

/* What computes the linears' bf16 products, for the run's header: "oneDNN brg:avx512_core_bf16",
 * or "fp32 products over bf16 operands widened (...why...)"; into buf (n bytes). */
const char *bf16_linear_path(char *buf, size_t n);

/* 1 where TYCHO_BF16=widen asks for the widened products even where oneDNN has bf16 ones. */
int bf16_widened_asked(void);

/* The four products below computed as fp32 products over the operands widened, K in slices
 * (kernels/cpu/bf16_widen.c); kind one of BF16_LINEAR_*, src and wei as the function of that
 * kind takes them. Not in the float64 build. */
enum { BF16_LINEAR_FORWARD, BF16_LINEAR_BACKWARD_INPUT, BF16_LINEAR_BACKWARD_WEIGHT, BF16_LINEAR_FORWARD_ACC };
int linear_bf16_widened(int kind, float *dst, const bf16 *src, const bf16 *wei, int BT, int IC, int OC,
                        char *err, size_t err_size);

/* The linear layer with bf16 operands, fp32 results (kernels.h linear_forward's shapes):
 *   forward:        out (BT, OC) = inp (BT, IC) · weightᵀ, weight (OC, IC)
 *   backward input: dinp (BT, IC) = dout (BT, OC) · weight   (overwritten)
 *   backward weight: dweight (OC, IC) += doutᵀ · inp         (accumulated in fp32)
 * Products accumulate in fp32; the primitives are made once per shape and kept. */
int linear_bf16_forward(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                        char *err, size_t err_size);
/* out (BT, OC) += inp · weightᵀ (the forward with the destination added, fp32). */
int linear_bf16_forward_acc(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                            char *err, size_t err_size);
int linear_bf16_backward_input(float *dinp, const bf16 *dout, const bf16 *weight, int BT, int IC,
                               int OC, char *err, size_t err_size);
int linear_bf16_backward_weight(float *dweight, const bf16 *dout, const bf16 *inp, int BT, int IC,
                                int OC, char *err, size_t err_size);

#endif
