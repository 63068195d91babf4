/* The CUDA kernels one at a time at real sizes (seq 4096, dim 4096 and 8192, a 11008-wide
 * feed-forward, vocabulary 32000, 32 heads of 128 over 8 KV heads), through the CUDA kernel
 * table as the trainer calls it: per call the bytes the kernel reads and writes as written (or
 * the FLOPs, for attention), the time by CUDA events over repetitions on the context's stream,
 * and the achieved GB/s (or TFLOP/s), as one table. A measurement, never a test: no bound is
 * asserted; a failed CUDA call ends it with exit 1.
 * usage: bench_kernels_gpu [repetitions, default 20]; exits 0 with "no CUDA device visible"
 * where the driver sees none. Run by scripts/device-check.sh (step f). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"

static struct cuda_ctx *ctx;
static const struct kernel_ops *K = &kernel_ops_cuda;

static void *dev(size_t n_bytes)
{
  void *p = K->mem_alloc(ctx, n_bytes);
  if (!p) {
    fprintf(stderr, "bench_kernels_gpu: device allocation of %zu bytes failed: %s\n", n_bytes,
            cuda_ctx_error(ctx));
    exit(1);
  }
  return p;
}

/* n uniform values in [-scale, scale) from a fixed LCG, on the device. */
static real *dev_uniform(size_t n, unsigned long long seed, double scale)
{
  real *h = (real *)malloc(n * sizeof(real));
  if (!h) {
    fprintf(stderr, "bench_kernels_gpu: out of host memory\n");
    exit(1);
  }
  unsigned long long s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = (real)(scale * ((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0));
  }
  real *d = (real *)dev(n * sizeof(real));
  K->from_host(ctx, d, h, n * sizeof(real));
  free(h);
  return d;
}

static void check(const char *what)
{
  if (cuda_ctx_sync(ctx) || cuda_ctx_error(ctx)[0]) {
    fprintf(stderr, "bench_kernels_gpu: %s: %s\n", what, cuda_ctx_error(ctx));
    exit(1);
  }
}

static int reps = 20;

/* Seconds per call of `call` (2 warm-up calls, then `n` timed between two events). */
template <typename F> static double time_call(const char *what, int n, F call)
{
  call();
  call();
  check(what);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, ctx->stream);
  for (int i = 0; i < n; i++)
    call();
  cudaEventRecord(b, ctx->stream);
  check(what);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1e-3 * ms / n;
}

static void row_bytes(const char *name, const char *shape, double bytes, double sec)
{
  printf("%-26s %-30s %10.1f MB %10.1f us %9.0f GB/s\n", name, shape, bytes * 1e-6, sec * 1e6,
         bytes / sec * 1e-9);
  fflush(stdout);
}

static void row_flops(const char *name, const char *shape, double flops, double sec)
{
  printf("%-26s %-30s %9.1f GFLOP %10.1f us %9.1f TFLOP/s\n", name, shape, flops * 1e-9, sec * 1e6,
         flops / sec * 1e-12);
  fflush(stdout);
}

static void bench_rmsnorm(int BT, int C)
{
  const size_t n = (size_t)BT * C;
  real *x = dev_uniform(n, 1, 2.0), *w = dev_uniform(C, 2, 1.5), *dy = dev_uniform(n, 3, 1.0);
  real *out = (real *)dev(n * sizeof(real)), *rstd = (real *)dev(BT * sizeof(real));
  real *dw = dev_uniform(C, 4, 0.1), *dx = (real *)dev(n * sizeof(real));
  char shape[64];
  snprintf(shape, sizeof shape, "BT %d, C %d", BT, C);
  /* forward: x read, out written, w and rstd */
  double s = time_call("rmsnorm_forward", reps,
                       [&] { K->rmsnorm_forward(ctx, out, rstd, x, w, BT, C, 1e-5f); });
  row_bytes("rmsnorm_forward", shape, 4.0 * (2.0 * n + C + BT), s);
  /* backward: dweight's pass reads dy and x (partials 8 B per 128 rows and column), dinp's
   * reads dy and x again and writes dx */
  s = time_call("rmsnorm_backward", reps,
                [&] { K->rmsnorm_backward(ctx, dx, dw, dy, x, w, rstd, BT, C); });
  row_bytes("rmsnorm_backward", shape,
            4.0 * (5.0 * n + 3.0 * C + 2.0 * BT) + 16.0 * ((BT + 127) / 128) * C, s);
  K->mem_free(ctx, x), K->mem_free(ctx, w), K->mem_free(ctx, dy), K->mem_free(ctx, out);
  K->mem_free(ctx, rstd), K->mem_free(ctx, dw), K->mem_free(ctx, dx);
}

static void bench_swiglu(int rows, int F)
{
  const size_t n = (size_t)rows * F;
  real *gu = dev_uniform(2 * n, 5, 6.0), *dout = dev_uniform(n, 6, 1.0);
  real *out = (real *)dev(n * sizeof(real)), *dgu = (real *)dev(2 * n * sizeof(real));
  char shape[64];
  snprintf(shape, sizeof shape, "rows %d, F %d", rows, F);
  double s =
      time_call("swiglu_forward_rows", reps, [&] { K->swiglu_forward_rows(ctx, out, gu, rows, F); });
  row_bytes("swiglu_forward_rows", shape, 4.0 * 3.0 * n, s);
  s = time_call("swiglu_backward_rows", reps,
                [&] { K->swiglu_backward_rows(ctx, dgu, dout, gu, rows, F); });
  row_bytes("swiglu_backward_rows", shape, 4.0 * 5.0 * n, s);
  K->mem_free(ctx, gu), K->mem_free(ctx, dout), K->mem_free(ctx, out), K->mem_free(ctx, dgu);
}

static void bench_crossentropy(int BT, int V)
{
  const size_t n = (size_t)BT * V;
  real *logits = dev_uniform(n, 7, 4.0), *probs = (real *)dev(n * sizeof(real));
  real *losses = (real *)dev(BT * sizeof(real)), *dl = (real *)dev(n * sizeof(real));
  int *ht = (int *)malloc(BT * sizeof(int));
  for (int i = 0; i < BT; i++)
    ht[i] = (int)((i * 2654435761u) % (unsigned)V);
  int *t = (int *)dev(BT * sizeof(int));
  K->from_host(ctx, t, ht, BT * sizeof(int));
  free(ht);
  char shape[64];
  snprintf(shape, sizeof shape, "BT %d, V %d", BT, V);
  /* forward: the row read twice (online max and Σ, then the probabilities), probs written */
  double s = time_call("crossentropy_forward", reps,
                       [&] { K->crossentropy_forward(ctx, losses, probs, logits, t, BT, V, V); });
  row_bytes("crossentropy_forward", shape, 4.0 * 3.0 * n, s);
  s = time_call("crossentropy_backward", reps,
                [&] { K->crossentropy_backward(ctx, dl, probs, t, 1.0f / BT, BT, V, V); });
  row_bytes("crossentropy_backward", shape, 4.0 * 2.0 * n, s);
  K->mem_free(ctx, logits), K->mem_free(ctx, probs), K->mem_free(ctx, losses), K->mem_free(ctx, dl);
  K->mem_free(ctx, t);
}

static void bench_adamw(size_t n)
{
  real *p = dev_uniform(n, 8, 1.0), *g = dev_uniform(n, 9, 0.1), *m = dev_uniform(n, 10, 0.01);
  real *v = dev_uniform(n, 11, 0.001);
  char shape[64];
  snprintf(shape, sizeof shape, "%zu elements", n);
  /* after the first step v may hold negatives from the fill: squares keep it positive */
  int step = 1;
  double s = time_call("adamw_update", reps, [&] {
    K->adamw_update(ctx, p, g, m, v, n, 3e-4, 0.9, 0.95, 1e-8, 0.1, step, 1.0f);
    step++;
  });
  row_bytes("adamw_update", shape, 4.0 * 7.0 * (double)n, s);
  K->mem_free(ctx, p), K->mem_free(ctx, g), K->mem_free(ctx, m), K->mem_free(ctx, v);
}

/* Causal attention through the table: the FLOPs of its products, causal half only
 * (forward QKᵀ and PV: 2 · 2·T·T/2·HS per head; backward recomputes QKᵀ and adds dV, dP, dQ,
 * dK: 5 · T·T/2 · 2·HS), whatever the implementation spends. */
static void bench_attention(int B, int T, int NH, int NKV, int HS)
{
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
  real *q = dev_uniform(nq, 12, 1.0), *k = dev_uniform(nkv, 13, 1.0), *v = dev_uniform(nkv, 14, 1.0);
  real *dout = dev_uniform(nq, 15, 1.0), *out = (real *)dev(nq * sizeof(real));
  real *lse = (real *)dev((size_t)B * NH * T * sizeof(real));
  real *dq = (real *)dev(nq * sizeof(real)), *dk = (real *)dev(nkv * sizeof(real)),
       *dv = (real *)dev(nkv * sizeof(real));
  const size_t ns = K->attention_scratch_n_elems(ctx, B, T, NH, NKV, HS);
  real *scratch = (real *)dev((ns ? ns : 1) * sizeof(real));
  char shape[64];
  snprintf(shape, sizeof shape, "B %d T %d NH %d NKV %d HS %d", B, T, NH, NKV, HS);
  const double half = (double)B * NH * (double)T * T / 2.0 * 2.0 * HS;
  const int n = reps < 5 ? reps : 5;
  double s = time_call("attention_forward", n, [&] {
    K->attention_forward(ctx, out, lse, scratch, q, k, v, NULL, B, T, NH, NKV, HS);
  });
  row_flops("attention_forward", shape, 2.0 * half, s);
  s = time_call("attention_backward", n, [&] {
    K->attention_backward(ctx, dq, dk, dv, scratch, dout, q, k, v, out, lse, NULL, B, T, NH, NKV, HS);
  });
  row_flops("attention_backward", shape, 5.0 * half, s);
  K->mem_free(ctx, q), K->mem_free(ctx, k), K->mem_free(ctx, v), K->mem_free(ctx, dout);
  K->mem_free(ctx, out), K->mem_free(ctx, lse), K->mem_free(ctx, dq), K->mem_free(ctx, dk);
  K->mem_free(ctx, dv), K->mem_free(ctx, scratch);
}

int main(int argc, char **argv)
{
  if (argc > 1 && atoi(argv[1]) > 0)
    reps = atoi(argv[1]);
  if (cuda_device_count() == 0) {
    printf("bench_kernels_gpu: no CUDA device visible; nothing measured\n");
    return 0;
  }
  char err[512];
  ctx = (struct cuda_ctx *)cuda_ctx_create(0, err, sizeof err);
  if (!ctx) {
    fprintf(stderr, "bench_kernels_gpu: %s\n", err);
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("bench_kernels_gpu: %s, %d SMs, %.0f GiB; fp32, %d repetitions a kernel (attention %d)\n",
         prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, reps,
         reps < 5 ? reps : 5);
  printf("%-26s %-30s %13s %13s %14s\n", "kernel", "shape", "per call", "time", "rate");
  bench_rmsnorm(4096, 4096);
  bench_rmsnorm(4096, 8192);
  bench_swiglu(4096, 11008);
  bench_swiglu(4096, 28672);
  bench_crossentropy(4096, 32000);
  bench_adamw((size_t)1 << 26);
  bench_attention(1, 4096, 32, 8, 128);
  cuda_ctx_destroy(ctx);
  return 0;
}
