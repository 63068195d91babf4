/* The CPU kernels' vector layer: the element-wise parts of SwiGLU, AdamW, the gradient norm and
 * scale, and the softmax of cross-entropy and its backward, on fp32, and the attention's dropout
 * draw (Philox4x32-10 on 8 or 16 counters at once: integer work, the scalar draw's numbers on
 * every path), in AVX2 (with FMA) or AVX-512 (F, DQ, BW, VL), chosen once at run time from what
 * the CPU supports.
 *
 * - The kernels (pointwise.c, optim.c, loss.c) call vec_active(): NULL means the scalar path, their
 *   own C loops, which stay the reference. The float64 build (kernels/real.h) always takes the
 *   scalar path: the vector paths are fp32 only.
 * - The choice: the widest path the CPU has (__builtin_cpu_supports), unless the environment
 *   variable TYCHO_SIMD = scalar | avx2 | avx512 names one. A name the CPU lacks, or an unknown
 *   one, is refused with a line on stderr and the widest path is used instead. Made lazily at the
 *   first call (thread-safe); vec_select changes it (the tests run every path).
 * - Each element's result depends only on its inputs, never on its position or on n: the tails
 *   go through the same vector code under a mask, so a tensor split differently over threads or
 *   ranks gives the same bits element by element.
 * - AVX2 and AVX-512 give the same bits as each other in every function (the same operations in
 *   the same order; sums in 16 double lanes, element i in lane i mod 16, the lanes added in
 *   order 0..15 at the end), max up to the sign of a zero maximum.
 * - exp (inside the vector paths): within 1 ulp of exp over the whole float range (worst
 *   0.844 ulp, measured by tests/unit/test_kernels_vec.c), exactly 1 at 0, +inf above
 *   ln(FLT_MAX), 0 at −inf and where the result is below the smallest denormal, a denormal (or 0
 *   under flush-to-zero, as the process runs: kernels/cpu/init.c) between, NaN for NaN.
 * - adamw, scale and ce_backward give the bits of the scalar loops (explicit multiplies, adds
 *   and subtracts, no FMA: these files are compiled with -ffp-contract=off; sqrt and division
 *   are correctly rounded).
 *   sumsq and the Σ exp of cross-entropy add in another order than the scalar loops (in double,
 *   so they differ by rounding of double only); SwiGLU and the softmax differ from the scalar
 *   path through exp alone (libm's expf there).
 *
 * Compiled per file: vec_avx2.c with -mavx2 -mfma, vec_avx512.c with -mavx512{f,dq,bw,vl} -mfma
 * (CMakeLists.txt); nothing else in the program is built for those ISAs. */
#ifndef TYCHO_KERNELS_CPU_VEC_H
#define TYCHO_KERNELS_CPU_VEC_H
#include <stddef.h>
#include <stdint.h>

#include "real.h"

enum vec_isa { VEC_SCALAR, VEC_AVX2, VEC_AVX512, VEC_N_ISAS };

/* AdamW's per-tensor constants, each the scalar loop's real value (optim.c). */
struct vec_adamw {
  float grad_scale, decay, m_weight, v_decay, v_weight, step_size, bias_correction2_sqrt, eps;
};

/* One stream of Philox draws for a dropout (kernels/philox.h): the counter's words c1..c3, an
 * element dropped where its uniform is below p and the others scaled by keep, and the key
 * schedule (k0[r], k1[r]: the key's words in round r), as vec_dropout_stream fills it. */
struct vec_dropout {
  uint32_t c1, c2, c3;
  float p, keep;
  uint32_t k0[10], k1[10];
};
/* *d for key (seed low 32 bits, seed high 32 bits) and the rest as named. */
void vec_dropout_stream(struct vec_dropout *d, uint64_t seed, uint32_t c1, uint32_t c2,
                        uint32_t c3, float p, float keep);

/* One path's functions. Every n may be 0; pointers need no alignment. */
struct vec_ops {
  const char *name;
  /* out[i] = exp(x[i]); out may equal x. */
  void (*exp)(float *out, const float *x, size_t n);
  /* out = gate · sigmoid(gate) · up, as swiglu_forward. */
  void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t n);
  /* swiglu_backward's dgate and dup. */
  void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, size_t n);
  /* One AdamW step, the scalar loop of optim.c operation by operation. */
  void (*adamw)(float *param, const float *grad, float *m, float *v, size_t n,
                const struct vec_adamw *c);
  /* Σ x² in double. */
  double (*sumsq)(const float *x, size_t n);
  /* x ← x · s. */
  void (*scale)(float *x, size_t n, float s);
  /* max over x, NaNs passed over (as `x > max ? x : max`); −inf when n is 0. */
  float (*max)(const float *x, size_t n);
  /* out[i] = exp(x[i] − shift) when out is not NULL (out may equal x); returns Σ of those
   * (the floats, added in double). */
  double (*exp_sum)(float *out, const float *x, float shift, size_t n);
  /* out[i] = exp(x[i] − shift) · s; out may equal x. */
  void (*exp_scale)(float *out, const float *x, float shift, float s, size_t n);
  /* Cross-entropy's backward on a row: out[i] = (p[i] − (i == target ? 1 : 0)) · s, a subtract
   * and a multiply each, the scalar loop's bits (loss.c); a target outside [0, n) puts the 1
   * nowhere; out may equal p. */
  void (*ce_backward)(float *out, const float *p, ptrdiff_t target, float s, size_t n);
  /* Dropout values of elements e0 .. e0 + n − 1 of the Philox stream d: out[j] = 0 where
   * philox_uniform(seed, c1, c2, c3, e0 + j) < p, else keep (kernels/philox.h) — the scalar
   * draw's numbers bit for bit, the counter's first word (e0 + j) / 4 wrapping at 2^32 as there.
   * 16 Philox blocks (64 elements) a step in AVX-512, 8 in AVX2. */
  void (*dropout_keep)(float *out, const struct vec_dropout *d, uint64_t e0, size_t n);
  /* x[i] ← x[i] · m[i]. */
  void (*mul)(float *x, const float *m, size_t n);
  /* RoPE on one head's row (attention.c rope_rotate): with si = sign · s[i],
   * y[i] = x[i] · c[i] − x[i + half] · si and y[i + half] = x[i + half] · c[i] + x[i] · si, each
   * product and sum rounded (no FMA), i < half; y may equal x. */
  void (*rope)(float *y, const float *x, const float *c, const float *s, float sign, size_t half);
  /* RMSNorm backward's weight-gradient terms of one row (dense.c): acc[i] += ((double)d[i] ·
   * x[i]) · r, in double. */
  void (*norm_wgrad)(double *acc, const float *d, const float *x, double r, size_t n);
  /* RMSNorm backward's input gradient of one row: dx[i] = (r · w[i]) · d[i] − k · x[i], each
   * operation rounded; dx may equal d. */
  void (*norm_dx)(float *dx, const float *w, const float *d, const float *x, float r, float k, size_t n);
};

/* The chosen path's table, NULL for the scalar path. */
const struct vec_ops *vec_active(void);

/* For the kernels, on `real` data (kernels/real.h): VEC_FOR_REAL is vec_active() in fp32 and NULL
 * (the scalar loops) in the float64 build, where the (float *) casts at its call sites never
 * run. Element-wise calls go over blocks of VEC_BLOCK elements spread over the threads (an
 * element's result does not depend on its block): VEC_BLOCKS(n) of them, the one starting at lo
 * VEC_LEN(n, lo) long. */
#if REAL_IS_DOUBLE
#define VEC_FOR_REAL NULL
#else
#define VEC_FOR_REAL vec_active()
#endif
enum { VEC_BLOCK = 8192 };
#define VEC_BLOCKS(n) (((n) + VEC_BLOCK - 1) / VEC_BLOCK)
#define VEC_LEN(n, lo) ((n) - (lo) < VEC_BLOCK ? (n) - (lo) : (size_t)VEC_BLOCK)
/* The chosen path (making the choice if not made yet). */
enum vec_isa vec_current(void);
/* Whether this CPU (and this build) can run isa. */
int vec_supported(enum vec_isa isa);
/* Chooses isa for every later call: 0, or -1 (nothing changed) when not supported. */
int vec_select(enum vec_isa isa);
/* "scalar", "avx2", "avx512". */
const char *vec_isa_name(enum vec_isa isa);
/* A path's table whatever is chosen (NULL for scalar or unsupported): for the tests. */
const struct vec_ops *vec_ops_of(enum vec_isa isa);

/* The vector paths (vec_avx2.c, vec_avx512.c); call only where vec_supported says so. */
extern const struct vec_ops vec_ops_avx2;
extern const struct vec_ops vec_ops_avx512;

#endif
