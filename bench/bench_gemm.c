/* The fp32 matrix products of a training step, one by one: OpenBLAS's sgemm (what the kernels
 * call) against oneDNN's fp32 sgemm at each product shape of plans/tiny.lua and of bench_train's
 * dim-256 model (bench/plans/vs_torch.lua's shape), the engines alternating call by call. Prints
 * each shape's best time and GFLOP/s on both, and the step's GEMM time summed over its products
 * at OpenBLAS's rate and at the better engine's, to set beside bench_train's step time (the step
 * as a fraction of its GEMM time at the best measured rate). Runs with the environment
 * `tycho run` sets up (it re-executes itself the same way) and its thread count. Also counts the
 * forward products' elements whose bits differ between the engines.
 * usage: bench_gemm [repetitions per shape and engine, default 30] */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "runtime/train/threads.h"

#if defined(TYCHO_HAVE_DNNL)
#include <oneapi/dnnl/dnnl.h>
#endif

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One linear of the model: BT rows of IC inputs to OC outputs, run `count` times a step (layers
 * × micro-batches); each run is three products: forward (out = inp · Wᵀ), the input's gradient
 * (dinp = dout · W) and the weight's (dW += doutᵀ · inp), as kernels/cpu/dense.c calls them. */
struct linear { const char *name; int BT, IC, OC, count; };

enum { FWD, DINP, DW };
static const char *const product_names[] = { "forward", "input grad", "weight grad" };

/* Row-major C = op(A) · op(B) (+ C) of one product, on either engine. */
struct product { char ta, tb; int M, N, K, lda, ldb, ldc; float beta; };

static struct product product_of(const struct linear *l, int which)
{
  switch (which) {
  case FWD: return (struct product){ 'N', 'T', l->BT, l->OC, l->IC, l->IC, l->IC, l->OC, 0.0f };
  case DINP: return (struct product){ 'N', 'N', l->BT, l->IC, l->OC, l->OC, l->IC, l->IC, 0.0f };
  default: return (struct product){ 'T', 'N', l->OC, l->IC, l->BT, l->OC, l->IC, l->IC, 1.0f };
  }
}

static void run_blas(const struct product *p, const float *A, const float *B, float *C)
{
  cblas_sgemm(CblasRowMajor, p->ta == 'T' ? CblasTrans : CblasNoTrans, p->tb == 'T' ? CblasTrans : CblasNoTrans,
              p->M, p->N, p->K, 1.0f, A, p->lda, B, p->ldb, p->beta, C, p->ldc);
}

#if defined(TYCHO_HAVE_DNNL)
static int run_dnnl(const struct product *p, const float *A, const float *B, float *C)
{
  return dnnl_sgemm(p->ta, p->tb, p->M, p->N, p->K, 1.0f, A, p->lda, B, p->ldb, p->beta, C, p->ldc) != dnnl_success;
}
#endif

static float *filled(size_t n, unsigned seed)
{
  float *x = malloc(n * sizeof *x);
  if (!x) {
    fprintf(stderr, "bench_gemm: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
  }
  return x;
}

/* Best time of each engine on each product of each linear, and the model's step sums. */
static void model(const char *label, const struct linear *ls, int n, int reps)
{
  printf("\n%s\n%-12s %-12s %5s %5s %5s %6s %12s %12s %9s\n", label, "linear", "product", "M", "N", "K", "× step",
         "OpenBLAS", "oneDNN", "faster");
  double sum_blas = 0, sum_best = 0, flops = 0;
  size_t differ = 0, compared = 0;
  for (int i = 0; i < n; i++) {
    const struct linear *l = &ls[i];
    size_t na = (size_t)l->BT * (size_t)(l->IC > l->OC ? l->IC : l->OC);
    size_t nb = (size_t)l->OC * (size_t)l->IC;
    float *A = filled(na, 1u + (unsigned)i), *B = filled(nb, 7u + (unsigned)i);
    float *C = filled(na > nb ? na : nb, 13u + (unsigned)i);
    for (int w = 0; w < 3; w++) {
      struct product p = product_of(l, w);
      /* forward reads inp (BT×IC) and W; input grad dout (BT×OC) and W; weight grad dout and inp */
      const float *a = A, *b = w == DW ? A : B;
      double best[2] = { 1e30, 1e30 };
      for (int r = 0; r < reps + 2; r++) { /* the first two warm each engine (caches, its pool) */
        double t0 = now_seconds();
        run_blas(&p, a, b, C);
        double t1 = now_seconds();
        if (r >= 2 && t1 - t0 < best[0]) best[0] = t1 - t0;
#if defined(TYCHO_HAVE_DNNL)
        t0 = now_seconds();
        if (run_dnnl(&p, a, b, C)) {
          fprintf(stderr, "bench_gemm: oneDNN's sgemm failed on %s %s\n", l->name, product_names[w]);
          exit(1);
        }
        t1 = now_seconds();
        if (r >= 2 && t1 - t0 < best[1]) best[1] = t1 - t0;
#endif
      }
      const double f = 2.0 * p.M * p.N * p.K;
#if defined(TYCHO_HAVE_DNNL)
      const int dn_faster = best[1] < best[0];
      if (w == FWD) { /* the same product's bits on both engines (beta 0: nothing accumulated) */
        size_t nc = (size_t)p.M * (size_t)p.N;
        float *C2 = malloc(nc * sizeof *C2);
        if (C2) {
          run_blas(&p, a, b, C);
          if (!run_dnnl(&p, a, b, C2))
            for (size_t k = 0; k < nc; k++)
              differ += memcmp(&C[k], &C2[k], sizeof *C) != 0;
          compared += nc;
          free(C2);
        }
      }
      printf("%-12s %-12s %5d %5d %5d %6d %6.1f µs %3.0f %6.1f µs %3.0f %8.2fx\n", l->name, product_names[w], p.M, p.N,
             p.K, l->count, 1e6 * best[0], f / best[0] * 1e-9, 1e6 * best[1], f / best[1] * 1e-9,
             dn_faster ? best[0] / best[1] : -best[1] / best[0]);
      sum_best += l->count * (dn_faster ? best[1] : best[0]);
#else
      printf("%-12s %-12s %5d %5d %5d %6d %6.1f µs %3.0f %12s\n", l->name, product_names[w], p.M, p.N, p.K, l->count,
             1e6 * best[0], f / best[0] * 1e-9, "n/a");
      sum_best += l->count * best[0];
#endif
      sum_blas += l->count * best[0];
      flops += l->count * f;
    }
    free(A);
    free(B);
    free(C);
  }
  printf("(µs: best of the repetitions; then GFLOP/s; faster: OpenBLAS time / oneDNN's, negative where\n"
         " OpenBLAS is the faster, as -oneDNN / OpenBLAS)\n");
  if (compared)
    printf("forward products' bits: %zu of %zu elements differ between the engines\n", differ, compared);
  printf("the step's linear products: %.2f GFLOP, %.2f ms at OpenBLAS's best times, %.2f ms at the faster engine's\n",
         flops * 1e-9, 1e3 * sum_blas, 1e3 * sum_best);
}

int main(int argc, char **argv)
{
  threads_exec_with_settings(argv);
  kernels_init_cpu(threads_count());
  int reps = argc > 1 ? atoi(argv[1]) : 30;
  if (reps < 1)
    reps = 30;
  char cpu[160];
  printf("bench_gemm: %d thread%s (%s), %s, OPENBLAS_CORETYPE=%s\n", omp_get_max_threads(),
         omp_get_max_threads() == 1 ? "" : "s", threads_reason(), kernels_cpu_description(cpu, sizeof cpu),
         getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "auto");
#if !defined(TYCHO_HAVE_DNNL)
  printf("oneDNN: not in this build (OpenBLAS alone)\n");
#endif
  /* plans/tiny.lua: dim 128, 8 heads of 16 / 4 kv, ffn 384, vocab 64; micro-batches of 8 × 32
   * tokens, 4 a step; q|k|v and gate|up fused (one rank, ZeRO 0) */
  static const struct linear tiny[] = {
    { "q|k|v", 256, 128, 256, 16 }, { "o", 256, 128, 128, 16 }, { "gate|up", 256, 128, 768, 16 },
    { "down", 256, 384, 128, 16 },  { "head", 256, 128, 64, 4 },
  };
  /* bench_train's dim-256 model and bench/plans/vs_torch.lua: dim 256, 8 heads (8 kv), ffn 688,
   * vocab 512, one micro-batch of 8 × 128 tokens */
  static const struct linear dim256[] = {
    { "q|k|v", 1024, 256, 768, 4 }, { "o", 1024, 256, 256, 4 }, { "gate|up", 1024, 256, 1376, 4 },
    { "down", 1024, 688, 256, 4 },  { "head", 1024, 256, 512, 1 },
  };
  model("plans/tiny.lua (256 rows a micro-batch, 4 micro-batches a step)", tiny, 5, reps);
  model("dim 256, 4 layers, 8 heads, ffn 688, vocab 512 (1024 rows a step)", dim256, 5, reps);
  return 0;
}
