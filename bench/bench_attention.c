/* Causal attention alone on the CPU: milliseconds of one attention_forward and one
 * attention_backward over a whole batch, with and without dropout (p 0.1, drawn inside both
 * kernels, as in training), for the attention
 * shapes of bench_train (the dim-256 model: B 8 × T 128, 8 heads of 32; plans/tiny.lua: B 8 ×
 * T 32 per micro-batch, 8 query heads of 16 over 4 KV heads), a longer sequence (B 2 × T 512,
 * 8 heads of 32) and heads of 128 (B 1 × T 512, 4 heads). Each figure is the best of 5 timed
 * loops (the worst is printed beside it), so a busy machine shows as a wider spread more than
 * as a worse best. Runs with the same thread settings as bench_train; the header names the
 * vector layer's path (TYCHO_SIMD chooses another), which draws the dropout in the fp32 build.
 * Each shape is also run without dropout through the bf16 mode's entries (attention_*_bf16: the
 * products on bf16 operands; the header names their path, gemm_bf16.h), except in the float64
 * build.
 * usage: bench_attention [seconds per shape, default 1] */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/gemm_bf16.h"
#include "cpu/vec.h"
#include "kernels.h"
#include "runtime/train/threads.h"

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static real *rand_buf(size_t n, uint32_t *state)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) {
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    x[i] = (real)(*state >> 8) / 8388608.0f - 1.0f;
  }
  return x;
}

struct shape { const char *label; int B, T, NH, NKV, HS; };

static void bench(const struct shape *s, int use_mask, int lowp, double seconds)
{
  const int B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, HS = s->HS;
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
  uint32_t st = 7;
  real *q = rand_buf(nq, &st), *k = rand_buf(nkv, &st), *v = rand_buf(nkv, &st);
  real *dout = rand_buf(nq, &st);
  real *out = malloc(nq * sizeof(real)), *lse = malloc((size_t)B * NH * T * sizeof(real));
  real *dq = malloc(nq * sizeof(real)), *dk = malloc(nkv * sizeof(real));
  real *dv = malloc(nkv * sizeof(real));
  real *scratch = malloc((lowp ? attention_scratch_n_elems_bf16 : attention_scratch_n_elems)(B, T, NH, NKV, HS) *
                         sizeof(real));
  uint32_t *samples = malloc((size_t)B * sizeof *samples);
  for (int b = 0; b < B; b++) samples[b] = 2 + (uint32_t)b;
  const struct attention_dropout drop = { 0.1f, 1, 2, 4, 0, samples };
  const struct attention_dropout *mask = use_mask ? &drop : NULL;
  double best_f = 1e30, best_b = 1e30, worst_f = 0.0, worst_b = 0.0;
  for (int rep = 0; rep < 5; rep++) {
    double tf = 0.0, tb = 0.0;
    int n = 0;
    while (n < 3 || tf + tb < seconds / 5) {
      double t0 = now_seconds();
      (lowp ? attention_forward_bf16 : attention_forward)(out, lse, scratch, q, k, v, mask, B, T, NH, NKV, HS);
      double t1 = now_seconds();
      (lowp ? attention_backward_bf16 : attention_backward)(dq, dk, dv, scratch, dout, q, k, v, out, lse, mask,
                                                            B, T, NH, NKV, HS);
      tb += now_seconds() - t1;
      tf += t1 - t0;
      n++;
    }
    tf *= 1e3 / n;
    tb *= 1e3 / n;
    best_f = tf < best_f ? tf : best_f;
    best_b = tb < best_b ? tb : best_b;
    worst_f = tf > worst_f ? tf : worst_f;
    worst_b = tb > worst_b ? tb : worst_b;
  }
  printf("%-28s %-4s %-8s forward %7.3f ms (worst %7.3f)  backward %7.3f ms (worst %7.3f)  "
         "sum %7.3f ms\n", s->label, lowp ? "bf16" : REAL_NAME, use_mask ? "dropout" : "-", best_f, worst_f, best_b,
         worst_b, best_f + best_b);
  fflush(stdout);
  free(q); free(k); free(v); free(dout); free(samples); free(out); free(lse);
  free(dq); free(dk); free(dv); free(scratch);
}

int main(int argc, char **argv)
{
  threads_exec_with_settings(argv);
  kernels_init_cpu(threads_count());
  double seconds = argc > 1 ? atof(argv[1]) : 1.0;
  if (!(seconds > 0.0))
    seconds = 1.0;
  printf("bench_attention: %d thread%s, %s, vector path %s, bf16 products %s\n", omp_get_max_threads(),
         omp_get_max_threads() == 1 ? "" : "s", REAL_NAME, vec_isa_name(vec_current()),
         REAL_IS_DOUBLE ? "none (float64 build)" : gemm_bf16_path());
  static const struct shape shapes[] = {
    { "dim 256: B 8 T 128 8/8x32", 8, 128, 8, 8, 32 },
    { "tiny: B 8 T 32 8/4x16", 8, 32, 8, 4, 16 },
    { "long: B 2 T 512 8/8x32", 2, 512, 8, 8, 32 },
    { "wide: B 1 T 512 4/4x128", 1, 512, 4, 4, 128 },
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int run = 0; run < (REAL_IS_DOUBLE ? 2 : 3); run++) bench(&shapes[i], run == 1, run == 2, seconds);
  return 0;
}
