/* Training throughput on one GPU against PyTorch on the same GPU: bench/plans/gpu_1b.lua (a
 * 1.1B Llama at seq 2048, bf16 compute, fp32 master weights, AdamW) through the trainer
 * `tycho run` uses, tokens/s and MFU of a full step (forward and backward over every
 * micro-batch, clipping, AdamW); then bench/torch_gpu.py, the same model and step in PyTorch
 * (eager, then torch.compile), run from here; one table side by side, the ratios, and the goals
 * (MFU ≥ 45%, ≥ 1.2× PyTorch eager) reported either way. Where the CUDA path refuses bf16 the
 * plan runs in fp32 and the output says so.
 *
 * FLOPs of a step: 6·N per token for the matrix products (N: the parameters that multiply, so
 * all but the input embedding table), plus 12·L·T·d per token for attention's scores and
 * weighted sums (L layers, seq T, width d), the accounting of the PaLM paper's appendix B (which
 * counts the causal half in full). MFU: achieved FLOP/s over the device's dense bf16 peak,
 * 989.4 TFLOP/s for an H100 or H200 (SXM), or TYCHO_PEAK_TFLOPS.
 *
 * usage: bench_gpu [timed steps, default 5]; exits 0 with a line saying why when there is no
 * device (or no CUDA backend in this build). PYTHON (default python3) runs the PyTorch side;
 * TORCH_DEADLINE (default 80 s; killed 15 s after) bounds it. The last line is the summary
 * scripts/device-check.sh keeps. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "plan/compile.h"
#include "runtime/train/threads.h"
#include "runtime/train/train.h"
#include "util/devices.h"

#ifdef TYCHO_HAVE_CUDA_BACKEND
#include <cuda_runtime_api.h>
#endif

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double step_flops(const struct plan *p, long long n_params)
{
  const double tokens = (double)p->batch.global * p->batch.seq;
  const double n_mul =
      (double)n_params - (p->model.tie_embeddings ? 0.0 : (double)p->model.vocab * p->model.dim);
  return tokens * (6.0 * n_mul + 12.0 * p->model.n_layers * (double)p->batch.seq * p->model.dim);
}

static int compile(struct plan *p, const char *compute, char *err, size_t err_size)
{
  char prec[64];
  snprintf(prec, sizeof prec, "precision.compute=%s", compute);
  const char *sets[] = {"device=cuda", prec};
  struct plan_compile_options opt = {1, 0, 0, 0, 2, sets};
  plan_init(p);
  return plan_compile(TYCHO_BENCH_DIR "/plans/gpu_1b.lua", &opt, p, err, err_size);
}

struct result {
  int ok;
  double tokens_per_s, step_ms, flops_per_step;
  long long params;
  char compute[8];
  char note[512];
};

/* The compiled plan's shape: torch_gpu.py's arguments, and the FLOPs where tycho's side failed. */
static char torch_shape[256] = "";
static struct plan shape_plan;

/* Opens the trainer in bf16, else (a refusal) in fp32 with the refusal in note; times `steps`
 * steps after two of warm-up. */
static int run_tycho(int steps, struct result *r)
{
  char err[2048];
  struct plan p;
  struct trainer t;
  snprintf(r->compute, sizeof r->compute, "bf16");
  if (compile(&p, "bf16", err, sizeof err) != 0) {
    snprintf(r->note, sizeof r->note, "%.480s", err);
    return 1;
  }
  shape_plan.model = p.model;
  shape_plan.batch = p.batch;
  snprintf(torch_shape, sizeof torch_shape,
           "--layers %d --dim %d --heads %d --kv-heads %d --ffn %d --vocab %d --seq %d "
           "--global-batch %d --micro %d",
           p.model.n_layers, p.model.dim, p.model.n_heads, p.model.n_kv_heads, p.model.ffn_dim,
           p.model.vocab, p.batch.seq, p.batch.global, p.batch.micro);
  if (trainer_open(&t, &p, NULL, err, sizeof err) != TRAIN_OK) {
    char first[1024];
    snprintf(first, sizeof first, "%.1000s", err);
    plan_free(&p);
    printf("bench_gpu: bf16 refused (%s); fp32 instead\n", first);
    snprintf(r->note, sizeof r->note, "bf16 refused, ran fp32");
    snprintf(r->compute, sizeof r->compute, "fp32");
    if (compile(&p, "fp32", err, sizeof err) != 0 ||
        trainer_open(&t, &p, NULL, err, sizeof err) != TRAIN_OK) {
      snprintf(r->note, sizeof r->note, "%.480s", err);
      plan_free(&p);
      return 1;
    }
  }
  struct train_step_stats st;
  for (int s = 0; s < 2; s++)
    if (trainer_step(&t, &st, err, sizeof err)) {
      snprintf(r->note, sizeof r->note, "%.480s", err);
      trainer_close(&t);
      plan_free(&p);
      return 1;
    }
  const double t0 = now_seconds();
  for (int s = 0; s < steps; s++)
    if (trainer_step(&t, &st, err, sizeof err)) {
      snprintf(r->note, sizeof r->note, "%.480s", err);
      trainer_close(&t);
      plan_free(&p);
      return 1;
    }
  const double dt = (now_seconds() - t0) / steps;
  r->params = model_n_params(&t.model);
  r->flops_per_step = step_flops(&p, r->params);
  r->tokens_per_s = (double)p.batch.global * p.batch.seq / dt;
  r->step_ms = 1e3 * dt;
  r->ok = 1;
  printf("bench_gpu: tycho %s, %lld parameters, batch %d × seq %d (micro %d), last loss %.4f\n",
         r->compute, r->params, p.batch.global, p.batch.seq, p.batch.micro, st.loss);
  trainer_close(&t);
  plan_free(&p);
  return 0;
}

/* A number after "key": in a JSON line of torch_gpu.py's; 0 when absent. */
static double torch_number(const char *line, const char *key)
{
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *s = strstr(line, pat);
  return s ? atof(s + strlen(pat)) : 0.0;
}

/* torch_gpu.py's two modes into r[0] (eager) and r[1] (compile). */
static void run_torch(int steps, struct result r[2])
{
  const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
  const double dl = getenv("TORCH_DEADLINE") && atof(getenv("TORCH_DEADLINE")) > 0
                        ? atof(getenv("TORCH_DEADLINE"))
                        : 80;
  char cmd[1024];
  /* a mode begun before the deadline may run past it (compilation): killed 15 s after it */
  snprintf(cmd, sizeof cmd, "timeout -k 5 %.0f %s %s/torch_gpu.py %s --steps %d --deadline %.0f 2>&1",
           dl + 15, py, TYCHO_BENCH_DIR, torch_shape, steps, dl);
  for (int m = 0; m < 2; m++)
    snprintf(r[m].note, sizeof r[m].note, "no result from %.400s", cmd);
  FILE *f = popen(cmd, "r");
  if (!f)
    return;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    int m = strstr(line, "\"mode\": \"eager\"") ? 0 : strstr(line, "\"mode\": \"compile\"") ? 1 : -1;
    if (m < 0) {
      fputs(line, stdout); /* PyTorch's own messages, as they come */
      continue;
    }
    const char *e = strstr(line, "\"error\": \"");
    if (e) {
      snprintf(r[m].note, sizeof r[m].note, "%.480s", e + 10);
      char *end = strrchr(r[m].note, '"');
      if (end)
        *end = '\0';
      continue;
    }
    r[m].ok = 1;
    r[m].tokens_per_s = torch_number(line, "tokens_per_s");
    r[m].step_ms = torch_number(line, "step_ms");
    r[m].params = (long long)torch_number(line, "params");
    r[m].note[0] = '\0';
  }
  pclose(f);
}

int main(int argc, char **argv)
{
  int steps = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : 5;
  if (!devices_cuda_built()) {
    printf("bench_gpu: this build has no CUDA backend; nothing measured\n");
    return 0;
  }
  if (devices_cuda_count() == 0) {
    printf("bench_gpu: no CUDA device visible; nothing measured\n");
    return 0;
  }
  threads_exec_with_settings(argv);
  kernels_init_cpu(threads_count());
  char name[256] = "CUDA device 0";
  double peak = 0;
#ifdef TYCHO_HAVE_CUDA_BACKEND
  {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      snprintf(name, sizeof name, "%s", prop.name);
  }
#endif
  if (strstr(name, "H100") || strstr(name, "H200"))
    peak = 989.4e12;
  if (getenv("TYCHO_PEAK_TFLOPS"))
    peak = atof(getenv("TYCHO_PEAK_TFLOPS")) * 1e12;
  printf("bench_gpu: %s; dense bf16 peak %s; %d timed steps a side\n", name,
         peak > 0 ? "" : "unknown (set TYCHO_PEAK_TFLOPS)", steps);
  if (peak > 0)
    printf("bench_gpu: peak %.1f TFLOP/s\n", peak * 1e-12);
  fflush(stdout);

  struct result ty = {0}, th[2];
  memset(th, 0, sizeof th);
  const int failed = run_tycho(steps, &ty);
  if (failed)
    printf("bench_gpu: tycho failed: %s\n", ty.note);
  fflush(stdout);
  run_torch(steps, th);
  /* the same model: the same FLOPs a step (from PyTorch's parameter count where tycho failed) */
  const double flops = ty.ok ? ty.flops_per_step
                       : th[0].ok && torch_shape[0] ? step_flops(&shape_plan, th[0].params)
                                                    : 0;
  printf("\nFLOPs a step: 6·N·tokens + 12·L·T·d·tokens (PaLM, appendix B) = %.3g\n", flops);
  printf("%-22s %8s %12s %10s %7s  %s\n", "side", "compute", "tokens/s", "ms/step", "MFU", "note");
  const char *labels[3] = {"tycho", "pytorch eager", "pytorch compile"};
  const struct result *rs[3] = {&ty, &th[0], &th[1]};
  for (int i = 0; i < 3; i++) {
    const struct result *r = rs[i];
    char mfu[16] = "n/a";
    if (r->ok && peak > 0 && flops > 0)
      snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * flops / (r->step_ms * 1e-3) / peak);
    if (r->ok)
      printf("%-22s %8s %12.0f %10.1f %7s  %s\n", labels[i], i ? "bf16" : r->compute, r->tokens_per_s,
             r->step_ms, mfu, r->note);
    else
      printf("%-22s %8s %12s %10s %7s  %s\n", labels[i], i ? "bf16" : r->compute, "-", "-", "-",
             r->note);
  }
  char summary[512];
  int n = snprintf(summary, sizeof summary, "bench_gpu: tycho %s ", ty.compute);
  if (ty.ok) {
    const double mfu = peak > 0 ? 100.0 * flops / (ty.step_ms * 1e-3) / peak : -1;
    n += snprintf(summary + n, sizeof summary - n, "%.0f tok/s, MFU %s", ty.tokens_per_s,
                  mfu >= 0 ? "" : "n/a");
    if (mfu >= 0)
      n += snprintf(summary + n, sizeof summary - n, "%.1f%% (goal 45%%: %s)", mfu,
                    mfu >= 45 ? "met" : "not met");
    for (int m = 0; m < 2; m++)
      if (th[m].ok)
        n += snprintf(summary + n, sizeof summary - n, "; %.2fx torch %s%s",
                      ty.tokens_per_s / th[m].tokens_per_s, m ? "compile" : "eager",
                      m ? ""
                        : (ty.tokens_per_s >= 1.2 * th[m].tokens_per_s ? " (goal 1.2x: met)"
                                                                       : " (goal 1.2x: not met)"));
      else
        n += snprintf(summary + n, sizeof summary - n, "; torch %s: none", m ? "compile" : "eager");
  } else {
    n += snprintf(summary + n, sizeof summary - n, "failed: %.200s", ty.note);
  }
  printf("%s\n", summary);
  return failed;
}
