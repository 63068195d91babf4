/* Training throughput on the CPU: tokens per second of one full step (forward, backward over
 * every micro-batch, clipping, AdamW) through the same trainer `tycho run` uses, on the
 * addition corpus, for two shapes: plans/tiny.lua as shipped, and a 4-layer dim-256 model
 * (8 heads, ffn 688, vocab 512, batch 8 × 128). Prints the thread count; run it with the same
 * environment `tycho run` sets up (it re-executes itself the same way).
 * usage: bench_train [seconds per shape, default 5] */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "plan/compile.h"
#include "runtime/train/threads.h"
#include "runtime/train/train.h"

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* FLOPs of one training step: 6 per parameter per token for the matrix products, plus the
 * attention scores and weighted sums (2·2·T·T·C per sequence forward, ×3 with backward; the
 * causal half is computed in full by the CPU kernel). */
static double step_flops(const struct plan *p, long long n_params)
{
  const double tokens = (double)p->batch.global * p->batch.seq;
  const double attention = 12.0 * p->batch.global * (double)p->batch.seq * p->batch.seq *
                           p->model.dim * p->model.n_layers;
  return 6.0 * (double)n_params * tokens + attention;
}

static int bench(const char *label, const struct plan *p, double seconds)
{
  char err[1024];
  struct trainer t;
  if (trainer_open(&t, p, NULL, err, sizeof err) != TRAIN_OK) {
    fprintf(stderr, "bench_train: %s: %s\n", label, err);
    return 1;
  }
  struct train_step_stats st;
  for (int s = 0; s < 2; s++) /* warm-up: thread pools, page faults */
    if (trainer_step(&t, &st, err, sizeof err)) {
      fprintf(stderr, "bench_train: %s\n", err);
      trainer_close(&t);
      return 1;
    }
  int steps = 0;
  double start = now_seconds(), elapsed = 0.0;
  while (steps < 5 || elapsed < seconds) {
    if (trainer_step(&t, &st, err, sizeof err)) {
      fprintf(stderr, "bench_train: %s\n", err);
      trainer_close(&t);
      return 1;
    }
    steps++;
    elapsed = now_seconds() - start;
  }
  const double tokens = (double)steps * p->batch.global * p->batch.seq;
  const long long n_params = model_n_params(&t.model);
  printf("%-34s %9lld params  B %3d × T %4d  %7.1f ms/step  %9.0f tok/s  %6.1f GFLOP/s\n", label,
         n_params, p->batch.global, p->batch.seq, 1e3 * elapsed / steps, tokens / elapsed,
         step_flops(p, n_params) * steps / elapsed * 1e-9);
  fflush(stdout);
  trainer_close(&t);
  return 0;
}

static int compile(struct plan *p, const char *path, int n_sets, const char *const *sets)
{
  char err[2048];
  struct plan_compile_options opt = { 1, 0, 0, 0, n_sets, sets };
  plan_init(p);
  if (plan_compile(path, &opt, p, err, sizeof err) != 0) {
    fprintf(stderr, "bench_train: %s\n", err);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv)
{
  threads_exec_with_settings(argv);
  kernels_init_cpu(threads_count());
  double seconds = argc > 1 ? atof(argv[1]) : 5.0;
  if (!(seconds > 0.0))
    seconds = 5.0;
  printf("bench_train: %d thread%s (%s; OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s, OPENBLAS_CORETYPE=%s)\n",
         omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s", threads_reason(),
         getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "unset",
         getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT") : "unset",
         getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "auto");
  char cpu[160];
  printf("kernels: %s\n", kernels_cpu_description(cpu, sizeof cpu));
  const char *tiny = TYCHO_PLANS_DIR "/tiny.lua";
  static const char *const dim256[] = {
    "model.n_layers=4", "model.dim=256", "model.n_heads=8", "model.n_kv_heads=8",
    "model.ffn_dim=688", "model.vocab=512", "model.max_seq=128",
    "batch.global=8", "batch.micro=8", "batch.seq=128",
  };
  struct plan p;
  int rc = 0;
  if (compile(&p, tiny, 0, NULL) == 0) {
    rc |= bench("plans/tiny.lua", &p, seconds);
    plan_free(&p);
  } else {
    rc = 1;
  }
  if (compile(&p, tiny, 10, dim256) == 0) {
    rc |= bench("dim 256, 4 layers, 8 heads, ffn 688", &p, seconds);
    plan_free(&p);
  } else {
    rc = 1;
  }
  return rc;
}
