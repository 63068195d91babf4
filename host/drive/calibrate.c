/* `tycho calibrate` (calibrate.h). */
#define _GNU_SOURCE
#include "drive/calibrate.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check/cost.h"
#include "comm/comm.h"
#include "kernels.h"
#include "ops.h"
#include "plan/cluster.h"
#include "plan/compile.h"
#include "runtime/train/train.h"
#include "util/err.h"
#include "util/path.h"

#define N_SIZES 4
static const size_t comm_sizes[N_SIZES] = { 8, 64 << 10, 1 << 20, 8 << 20 }; /* bytes, the whole buffer */
static const char *const op_names[3] = { "all-reduce", "all-gather", "reduce-scatter" };

struct figures {
  double peak;                 /* FLOP/s: the 1024³ product's, or the linears' where faster */
  double square;               /* FLOP/s of the 1024³ product */
  double linears;              /* FLOP/s at the plan's linears */
  double attention;            /* FLOP/s of the attention core as the plan counts it */
  double fb;                   /* seconds: the serial forward and backward of one step */
  double fb_model;             /* of which the matmuls and attention at the rates above */
  double pointwise;            /* seconds per element (cost_pointwise_elems) */
  double optimizer;            /* seconds per parameter element */
  double comm[3][N_SIZES];     /* seconds per call */
  double bandwidth, latency, fit_rms;      /* over every op */
  double op_bw[3], op_lat[3], op_rms[3];   /* each op's own */
  int cores, online, affinity, ranks;
  double memory;               /* bytes */
  long long n_params;
};

/* A usage or plan error: the message, status 2. */
static int usage(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int usage(char *err, size_t n, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return 2;
}

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The calling thread's CPU time: the compute figures are timed with it (a device is one thread,
 * and the kernels run on the calling thread with one), so time the core spent on other work
 * does not count; the collectives, which involve the comm thread and the other ranks, are timed
 * on the wall clock. */
static double cpu_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The shortest of n times: on a machine that other work shares, a burst of it lengthens some
 * repetitions and never shortens one, so the best is the undisturbed figure. */
static double best(const double *v, int n)
{
  double b = HUGE_VAL;
  for (int i = 0; i < n; i++) b = v[i] < b ? v[i] : b;
  return b;
}

/* Every rank's value → the largest (the slowest rank's time), on every rank. */
static int slowest(struct comm_group *w, double *v, size_t n)
{
  return comm_all_reduce(w, v, v, n, COMM_FP64, COMM_MAX, NULL);
}

static int barrier(struct comm_group *w)
{
  int x = 0;
  return comm_all_reduce(w, &x, &x, 1, COMM_INT32, COMM_SUM, NULL);
}

static void fill(real *x, size_t n, double scale)
{
  for (size_t i = 0; i < n; i++) x[i] = (real)(scale * ((double)(i % 17) - 8.0) / 8.0);
}

/* One linear's forward and backward at (BT, IC) → OC: seconds of each, the best of reps. */
static int time_linear(const struct kernel_ops *k, int BT, int IC, int OC, int reps, int backward,
                       double *seconds, double *flops)
{
  real *x = malloc(sizeof(real) * (size_t)BT * IC), *w = malloc(sizeof(real) * (size_t)OC * IC);
  real *y = malloc(sizeof(real) * (size_t)BT * OC), *dx = malloc(sizeof(real) * (size_t)BT * IC);
  real *dw = malloc(sizeof(real) * (size_t)OC * IC);
  double *t = calloc((size_t)reps + 1, sizeof(double));
  if (!x || !w || !y || !dx || !dw || !t) {
    free(x); free(w); free(y); free(dx); free(dw); free(t);
    return -1;
  }
  fill(x, (size_t)BT * IC, 1.0);
  fill(w, (size_t)OC * IC, 0.02);
  fill(y, (size_t)BT * OC, 0.1);
  memset(dw, 0, sizeof(real) * (size_t)OC * IC);
  for (int r = 0; r <= reps; r++) { /* the first is a warm-up */
    double t0 = cpu_now();
    if (backward)
      k->linear_backward(NULL, dx, dw, y, x, w, BT, IC, OC);
    else
      k->linear_forward(NULL, y, x, w, BT, IC, OC);
    if (r)
      t[r - 1] = cpu_now() - t0;
  }
  *seconds = best(t, reps);
  *flops = (backward ? 4.0 : 2.0) * BT * (double)IC * OC;
  free(x); free(w); free(y); free(dx); free(dw); free(t);
  return 0;
}

/* The attention core forward + backward at the plan's shapes, seconds (the best of reps). */
static int time_attention(const struct kernel_ops *k, const struct plan *p, int reps, double *seconds)
{
  const int B = p->batch.micro, T = p->batch.seq, NH = p->model.n_heads, NKV = p->model.n_kv_heads;
  const int HS = p->model.head_dim;
  const size_t n_qkv = (size_t)B * T * (NH + 2 * NKV) * HS, n_out = (size_t)B * T * NH * HS;
  const size_t n_lse = (size_t)B * NH * T, n_scratch = k->attention_scratch_n_elems(NULL, B, T, NH, NKV, HS);
  real *qkv = malloc(sizeof(real) * n_qkv), *dqkv = malloc(sizeof(real) * n_qkv);
  real *out = malloc(sizeof(real) * n_out), *dout = malloc(sizeof(real) * n_out);
  real *lse = malloc(sizeof(real) * (n_lse ? n_lse : 1)), *scratch = malloc(sizeof(real) * (n_scratch ? n_scratch : 1));
  double *t = calloc((size_t)reps + 1, sizeof(double));
  int rc = -1;
  if (qkv && dqkv && out && dout && lse && scratch && t) {
    fill(qkv, n_qkv, 0.5);
    fill(dout, n_out, 0.1);
    for (int r = 0; r <= reps; r++) {
      double t0 = cpu_now();
      k->attention_forward_qkv(NULL, out, lse, scratch, qkv, NULL, B, T, NH, NKV, HS);
      k->attention_backward_qkv(NULL, dqkv, scratch, dout, qkv, out, lse, NULL, B, T, NH, NKV, HS);
      if (r)
        t[r - 1] = cpu_now() - t0;
    }
    *seconds = best(t, reps);
    rc = 0;
  }
  free(qkv); free(dqkv); free(out); free(dout); free(lse); free(scratch); free(t);
  return rc;
}

/* sumsq + adamw_update over n elements, seconds (the best of reps). */
static int time_optimizer(const struct kernel_ops *k, size_t n, int reps, double *seconds)
{
  real *param = malloc(sizeof(real) * n), *grad = malloc(sizeof(real) * n);
  real *m = calloc(n, sizeof(real)), *v = calloc(n, sizeof(real));
  double *t = calloc((size_t)reps + 1, sizeof(double));
  int rc = -1;
  if (param && grad && m && v && t) {
    fill(param, n, 0.02);
    fill(grad, n, 0.001);
    volatile double sink = 0;
    for (int r = 0; r <= reps; r++) {
      double t0 = cpu_now();
      sink += k->sumsq(NULL, grad, n);
      k->adamw_update(NULL, param, grad, m, v, n, 1e-4, 0.9, 0.95, 1e-8, 0.1, r + 1, (real)1);
      if (r)
        t[r - 1] = cpu_now() - t0;
    }
    (void)sink;
    *seconds = best(t, reps);
    rc = 0;
  }
  free(param); free(grad); free(m); free(v); free(t);
  return rc;
}

/* One collective of `bytes` (the whole buffer, as the cost model counts it) over the world. */
static int time_collective(struct comm_group *w, int op, size_t bytes, int reps, float *a, float *b,
                           double *seconds)
{
  const int n = w->size;
  size_t count = bytes / sizeof(float);
  if (op != 0)
    count = count / (size_t)n; /* per rank: the gathered or scattered buffer is count × n */
  if (count == 0)
    count = 1;
  if (barrier(w))
    return -1;
  double *t = calloc((size_t)reps, sizeof(double));
  if (!t)
    return -1;
  for (int r = 0; r <= reps; r++) { /* the first is a warm-up */
    double t0 = now();
    int rc = op == 0 ? comm_all_reduce(w, a, b, count, COMM_FP32, COMM_SUM, NULL)
           : op == 1 ? comm_all_gather(w, a, b, count, COMM_FP32, NULL)
                     : comm_reduce_scatter(w, a, b, count, COMM_FP32, COMM_SUM, NULL);
    if (rc) {
      free(t);
      return -1;
    }
    if (r)
      t[r - 1] = now() - t0;
  }
  *seconds = best(t, reps);
  free(t);
  return 0;
}

/* The ring costs of cost.c for n ranks: t = a · bytes / bw + s · latency; (a, s) per op. */
static void ring_terms(int op, int n, double *a, double *s)
{
  *a = (op == 0 ? 2.0 : 1.0) * (n - 1) / n;
  *s = (op == 0 ? 2.0 : 1.0) * (n - 1);
}

/* Least squares in relative error for (1/bw, latency) over the ops first..last and every size. */
static void fit_ops(struct figures *f, int n, int first, int last, double *bw_out, double *lat_out, double *rms_out)
{
  double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
  for (int op = first; op <= last; op++)
    for (int i = 0; i < N_SIZES; i++) {
      double a, s, t = f->comm[op][i];
      ring_terms(op, n, &a, &s);
      double u = a * (double)comm_sizes[i] / t, v = s / t;
      suu += u * u; suv += u * v; svv += v * v; su += u; sv += v;
    }
  double det = suu * svv - suv * suv, inv_bw = 0, lat = 0;
  if (det > 0) {
    inv_bw = (su * svv - sv * suv) / det;
    lat = (suu * sv - suv * su) / det;
  }
  if (!(inv_bw > 0) || !(lat > 0)) { /* a degenerate fit: the smallest call for the latency, the largest for bw */
    double a, s;
    ring_terms(first, n, &a, &s);
    lat = f->comm[first][0] / s;
    inv_bw = fmax(1e-15, (f->comm[first][N_SIZES - 1] - s * lat) / (a * (double)comm_sizes[N_SIZES - 1]));
  }
  *bw_out = 1.0 / inv_bw;
  *lat_out = lat;
  double e2 = 0;
  for (int op = first; op <= last; op++)
    for (int i = 0; i < N_SIZES; i++) {
      double a, s;
      ring_terms(op, n, &a, &s);
      double pred = a * (double)comm_sizes[i] * inv_bw + s * lat, e = pred / f->comm[op][i] - 1;
      e2 += e * e;
    }
  *rms_out = sqrt(e2 / ((last - first + 1) * N_SIZES));
}

/* The link over every op (the pipeline's sends use it), and each op's own. */
static void fit_link(struct figures *f, int n)
{
  fit_ops(f, n, 0, 2, &f->bandwidth, &f->latency, &f->fit_rms);
  for (int op = 0; op < 3; op++) fit_ops(f, n, op, op, &f->op_bw[op], &f->op_lat[op], &f->op_rms[op]);
}

/* The plan compiled for one rank on the CPU: mesh 1 × 1 × 1, zero 0, the user's settings first. */
static int compile_serial(const struct calibrate_options *o, struct plan *p, char *err, size_t n)
{
  const char **sets = calloc((size_t)o->n_sets + 6, sizeof *sets);
  if (!sets)
    return errf(err, n, "out of memory");
  for (int i = 0; i < o->n_sets; i++) sets[i] = o->sets[i];
  int k = o->n_sets;
  sets[k++] = "mesh.tp=1";
  sets[k++] = "mesh.pp=1";
  sets[k++] = "mesh.dp=1";
  sets[k++] = "zero=0";
  sets[k++] = "sequence_parallel=false";
  sets[k++] = "device=cpu"; /* the CPU is measured, even where "auto" would take a GPU */
  struct plan_compile_options opt = { 1, o->unsafe, o->memory_limit, o->instruction_limit, k, sets };
  plan_init(p);
  int rc = plan_compile(o->plan, &opt, p, err, n);
  free(sets);
  return rc;
}

/* The measurements of the compute on this rank (every rank at once); times are this rank's. */
static int measure_compute(const struct plan *p, int reps, struct figures *f, char *err, size_t n)
{
  const struct kernel_ops *k = &kernel_ops_cpu;
  double s, fl;
  if (time_linear(k, 1024, 1024, 1024, reps, 0, &s, &fl))
    return errf(err, n, "out of memory for the 1024^3 product");
  f->peak = fl / s;
  const int BT = p->batch.micro * p->batch.seq, C = p->model.dim, HS = p->model.head_dim;
  const int NH = p->model.n_heads, NKV = p->model.n_kv_heads, F = p->model.ffn_dim;
  const int V = p->model.vocab_padded > 0 ? p->model.vocab_padded : p->model.vocab;
  /* the runtime's products: q|k|v fused, o, gate|up fused, down (per layer), the head (once) */
  const int shapes[5][2] = { { C, (NH + 2 * NKV) * HS }, { NH * HS, C }, { C, 2 * F }, { F, C }, { C, V } };
  const double weight[5] = { p->model.n_layers, p->model.n_layers, p->model.n_layers, p->model.n_layers, 1 };
  double total_t = 0, total_f = 0;
  for (int i = 0; i < 5; i++)
    for (int b = 0; b < 2; b++) {
      if (time_linear(k, BT, shapes[i][0], shapes[i][1], reps, b, &s, &fl))
        return errf(err, n, "out of memory for a %d x %d linear", shapes[i][0], shapes[i][1]);
      total_t += weight[i] * s;
      total_f += weight[i] * fl;
    }
  f->linears = total_f / total_t;
  if (time_attention(k, p, reps, &s))
    return errf(err, n, "out of memory for the attention core");
  f->attention = 3.0 * plan_layer_flops(p).attn_core * BT / s;
  if (time_optimizer(k, (size_t)f->n_params, reps, &s))
    return errf(err, n, "out of memory for %lld parameters' optimizer state", f->n_params);
  f->optimizer = s / (double)f->n_params;
  /* the serial forward and backward through the trainer */
  struct trainer t;
  if (trainer_open(&t, p, NULL, err, n) != TRAIN_OK)
    return -1;
  double *ts = calloc((size_t)reps + 1, sizeof(double));
  if (!ts) {
    trainer_close(&t);
    return errf(err, n, "out of memory");
  }
  int rc = 0;
  for (int r = 0; r <= reps && !rc; r++) {
    double t0 = cpu_now();
    trainer_forward_backward(&t);
    if (trainer_failed(&t))
      rc = errf(err, n, "the serial forward and backward failed: %s", trainer_failed(&t));
    else if (r)
      ts[r - 1] = cpu_now() - t0;
  }
  if (!rc)
    f->fb = best(ts, reps);
  free(ts);
  trainer_close(&t);
  return rc;
}

static void describe_cpu(char *out, size_t n)
{
  out[0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "model name", 10) == 0) {
      char *c = strchr(line, ':');
      if (c) {
        c++;
        while (*c == ' ') c++;
        c[strcspn(c, "\n")] = 0;
        snprintf(out, n, "%s", c);
      }
      break;
    }
  if (f)
    fclose(f);
  if (!out[0])
    snprintf(out, n, "unknown CPU");
}

static int write_file(const struct calibrate_options *o, const struct plan *p, const struct figures *f,
                      const double load[3], char *err, size_t n)
{
  char tmp[1200], host[256] = "", when[64], cpu[256], kern[256], name[512];
  snprintf(tmp, sizeof tmp, "%s.tmp", o->out);
  gethostname(host, sizeof host - 1);
  time_t tt = time(NULL);
  struct tm tm;
  gmtime_r(&tt, &tm);
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  describe_cpu(cpu, sizeof cpu);
  kernels_cpu_description(kern, sizeof kern);
  if (o->name)
    snprintf(name, sizeof name, "%s", o->name);
  else
    snprintf(name, sizeof name, "%s: %d cores of %s, one rank of one thread per core", host, f->cores, cpu);
  FILE *out;
  int rc = path_fopen_output("--out", tmp, 0, &out, err, n);
  if (rc)
    return rc;
  const double eff = f->linears / f->peak; /* ≤ 1: the peak is raised to the linears' rate when below it */
  const struct plan_layer_flops lf = plan_layer_flops(p);
  fprintf(out, "-- Measured by `tycho calibrate` on %s (%s), %s.\n", host, cpu, when);
  fprintf(out, "-- Command: %s\n", o->command ? o->command : "tycho calibrate");
  fprintf(out, "-- %d ranks of one thread under MPI (%s), all measuring at once; each figure is the slowest\n"
          "-- rank's best (shortest) of %d repetitions, the compute timed in the thread's CPU time (time the\n"
          "-- core spent on other work left out), the collectives on the wall clock. Load average at the start: %.2f %.2f %.2f.\n",
          f->ranks, comm_backend_name(), o->reps, load[0], load[1], load[2]);
  fprintf(out, "-- Kernels: %s. A device (\"GPU\" below) is one core running one rank of one thread.\n", kern);
  fprintf(out, "-- Plan measured: %s (%d layers, dim %d, ffn %d, %d heads / %d kv, vocab %d;\n"
          "--   batch.micro %d x batch.seq %d = %d tokens per micro-batch, %lld parameters).\n",
          o->plan, p->model.n_layers, p->model.dim, p->model.ffn_dim, p->model.n_heads, p->model.n_kv_heads,
          p->model.vocab, p->batch.micro, p->batch.seq, p->batch.micro * p->batch.seq, f->n_params);
  fprintf(out, "-- Figures:\n");
  fprintf(out, "--   sgemm 1024 x 1024 x 1024 (linear_forward): %.2f GFLOP/s -> peak_tflops%s\n", f->square / 1e9,
          f->peak > f->square ? " (below the plan's linears: their rate is the peak)" : "");
  fprintf(out, "--   the plan's linears, forward and backward: %.2f GFLOP/s -> efficiency.compute = %.4f\n",
          f->linears / 1e9, eff);
  fprintf(out, "--   attention core forward + backward (3 x %.0f FLOPs per token, the plan's count): %.2f GFLOP/s\n",
          lf.attn_core, f->attention / 1e9);
  fprintf(out, "--   serial forward + backward of one step (%d micro-batches): %.4f ms, of which the model's\n"
          "--     matmuls and attention at the rates above %.4f ms; the rest over %d layers x %d tokens x\n"
          "--     %.0f elements (dim + ffn_dim): %.6g ns each -> overheads.pointwise_ns%s\n",
          p->batch.microbatches, 1e3 * f->fb, 1e3 * f->fb_model, p->model.n_layers,
          p->batch.global * p->batch.seq, cost_pointwise_elems(p), f->pointwise * 1e9,
          f->fb > f->fb_model ? "" : "\n--     (CLAMPED: the rest was not positive, a disturbed measurement; calibrate again)");
  fprintf(out, "--   sumsq + adamw_update over %lld elements: %.6g ns each -> overheads.optimizer_ns\n",
          f->n_params, f->optimizer * 1e9);
  for (int op = 0; op < 3; op++) {
    fprintf(out, "--   %-14s", op_names[op]);
    for (int i = 0; i < N_SIZES; i++) {
      double b = (double)comm_sizes[i];
      fprintf(out, " %s%.0f %s: %.1f us", i ? "," : "", b >= 1 << 20 ? b / (1 << 20) : b >= 1024 ? b / 1024 : b,
              b >= 1 << 20 ? "MiB" : b >= 1024 ? "KiB" : "B", 1e6 * f->comm[op][i]);
    }
    fprintf(out, "\n");
  }
  fprintf(out, "--   ring fit over the %d calls (cost.h's formulas): latency %.2f us, bandwidth %.3f GB/s,\n"
          "--     rms relative error %.1f%%: the link's figures (the pipeline's sends use them); each op's own fit\n"
          "--     over its %d sizes:", 3 * N_SIZES, 1e6 * f->latency, f->bandwidth / 1e9, 100.0 * f->fit_rms, N_SIZES);
  for (int op = 0; op < 3; op++)
    fprintf(out, "%s %s %.2f us + %.3f GB/s (rms %.1f%%)", op ? "," : "", op_names[op], 1e6 * f->op_lat[op],
            f->op_bw[op] / 1e9, 100.0 * f->op_rms[op]);
  fprintf(out, ";\n--     one node, so inter_node = intra_node\n");
  fprintf(out, "--   cores: %d online (sysconf) -> gpus_per_node; rank 0 may run on %d of them (sched_getaffinity,\n"
          "--     as the launcher bound it); memory %.2f GB -> device_memory_gb = memory / cores\n",
          f->online, f->affinity, f->memory / 1e9);
  fprintf(out, "return {\n");
  fprintf(out, "  name = \"");
  for (const char *c = name; *c; c++) fprintf(out, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
  fprintf(out, "\",\n");
  fprintf(out, "  gpus_per_node = %d,\n  nodes = 1,\n", f->cores);
  fprintf(out, "  overlap = false,  -- a rank's comm thread progresses MPI on the rank's own core\n");
  fprintf(out, "  device_memory_gb = %.6g,\n", f->memory / f->cores / 1e9);
  fprintf(out, "  peak_tflops = %.6g,\n", f->peak / 1e12);
  for (int l = 0; l < 2; l++) {
    fprintf(out, "  %s = { bandwidth_gbs = %.6g, latency_us = %.6g,\n", l ? "inter_node" : "intra_node",
            f->bandwidth / 1e9, 1e6 * f->latency);
    for (int op = 0; op < 3; op++)
      fprintf(out, "    %s = { bandwidth_gbs = %.6g, latency_us = %.6g },\n", op == 0 ? "all_reduce" : op == 1 ?
              "all_gather" : "reduce_scatter", f->op_bw[op] / 1e9, 1e6 * f->op_lat[op]);
    fprintf(out, "  },\n");
  }
  fprintf(out, "  efficiency = { compute = %.6g, comm = 1 },\n", eff);
  fprintf(out, "  overheads = { attention_tflops = %.6g, pointwise_ns = %.6g, optimizer_ns = %.6g },\n",
          f->attention / 1e12, f->pointwise * 1e9, f->optimizer * 1e9);
  fprintf(out, "}\n");
  int bad = ferror(out);
  if (fclose(out) || bad)
    return errf(err, n, "cannot write %s", tmp);
  if ((rc = path_check_output("--out", o->out, err, n)) != 0) { /* it may have changed since the start */
    unlink(tmp);
    return rc;
  }
  if (rename(tmp, o->out))
    return errf(err, n, "cannot rename %s to %s", tmp, o->out);
  return 0;
}

int calibrate_run(const struct calibrate_options *o, FILE *log, char *err, size_t err_size)
{
  struct comm_group *w = comm_world();
  struct figures f;
  memset(&f, 0, sizeof f);
  f.ranks = w->size;
  cpu_set_t set;
  CPU_ZERO(&set);
  /* the node's cores: the online CPUs (mpirun binds each rank to its own core, so a rank's
   * affinity, shown beside, is its share, not the node) */
  f.affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  f.online = (int)sysconf(_SC_NPROCESSORS_ONLN);
  f.cores = f.online > 0 ? f.online : 1;
  f.memory = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  double load[3] = { 0, 0, 0 };
  if (getloadavg(load, 3) < 0)
    load[0] = load[1] = load[2] = -1;
  /* every check below sees the same values on every rank (the world, the node, the plan) */
  if (w->size < 2)
    return usage(err, err_size, "calibrate measures the collectives between ranks: start it with 2 or more "
                "ranks on this node, one per core (mpirun -np %d tycho calibrate ...)", f.cores > 1 ? f.cores : 2);
  if (comm_local_size() != w->size)
    return usage(err, err_size, "calibrate measures one node: the %d ranks must all run on it (%d here)", w->size,
                comm_local_size());
  if (w->size > f.cores)
    return usage(err, err_size, "calibrate measures one rank per core: %d ranks on %d cores would share them; "
                "start at most %d (mpirun -np %d)", w->size, f.cores, f.cores, f.cores);
  if (o->reps < 1)
    return usage(err, err_size, "--reps must be at least 1");
  kernels_init_cpu(1); /* a device is one core running one thread (cpu_now times that thread) */
  struct plan p;
  if (compile_serial(o, &p, err, err_size)) {
    char msg[2048];
    snprintf(msg, sizeof msg, "plan error: %s", err);
    snprintf(err, err_size, "%s", msg);
    plan_free(&p);
    return 2;
  }
  if (p.precision.compute != PLAN_FP32) {
    plan_free(&p);
    return usage(err, err_size, "%s: precision.compute: calibrate measures the fp32 kernels; measure with "
                "--set precision.compute=fp32", o->plan);
  }
  f.n_params = plan_param_count(&p);
  char msg[COMM_AGREE_MSG_MAX];
  int failed_rank, bad = barrier(w) ? -1 : 0;
  if (!bad) {
    bad = measure_compute(&p, o->reps, &f, msg, sizeof msg) ? 1 : 0;
  } else {
    snprintf(msg, sizeof msg, "%s", comm_error());
  }
  int agreed = comm_agree(w, bad, msg, sizeof msg, &failed_rank);
  if (agreed) {
    plan_free(&p);
    if (failed_rank > 0) {
      char m2[COMM_AGREE_MSG_MAX + 32];
      snprintf(m2, sizeof m2, "rank %d: %s", failed_rank, msg);
      snprintf(err, err_size, "%s", m2);
    } else {
      snprintf(err, err_size, "%s", msg);
    }
    return 1;
  }
  /* the slowest rank's: rates as times (1/rate), so the max is the slowest */
  double worst[5] = { 1.0 / f.peak, 1.0 / f.linears, 1.0 / f.attention, f.fb, f.optimizer };
  if (slowest(w, worst, 5)) {
    plan_free(&p);
    return errf(err, err_size, "gathering the figures: %s", comm_error());
  }
  f.peak = 1.0 / worst[0];
  f.linears = 1.0 / worst[1];
  f.square = f.peak;
  if (f.linears > f.peak) /* the plan's products ran faster than the large one: they are the peak */
    f.peak = f.linears;
  f.attention = 1.0 / worst[2];
  f.fb = worst[3];
  f.optimizer = worst[4];
  /* the collectives */
  const size_t max_bytes = comm_sizes[N_SIZES - 1];
  float *a = malloc(max_bytes * (size_t)w->size), *b = malloc(max_bytes * (size_t)w->size);
  bad = !a || !b;
  if (!bad) {
    memset(a, 0, max_bytes * (size_t)w->size);
    memset(b, 0, max_bytes * (size_t)w->size);
  }
  agreed = comm_agree(w, bad, (snprintf(msg, sizeof msg, "out of memory for the collectives' buffers"), msg),
                      sizeof msg, &failed_rank);
  for (int op = 0; op < 3 && !agreed; op++)
    for (int i = 0; i < N_SIZES; i++) {
      int reps = comm_sizes[i] <= (64 << 10) ? 20 * o->reps : o->reps;
      if (time_collective(w, op, comm_sizes[i], reps, a, b, &f.comm[op][i])) {
        free(a); free(b); plan_free(&p);
        return errf(err, err_size, "%s of %zu bytes: %s", op_names[op], comm_sizes[i], comm_error());
      }
    }
  free(a);
  free(b);
  if (agreed) {
    plan_free(&p);
    snprintf(err, err_size, "%s", msg);
    return 1;
  }
  if (slowest(w, &f.comm[0][0], 3 * N_SIZES)) {
    plan_free(&p);
    return errf(err, err_size, "gathering the figures: %s", comm_error());
  }
  fit_link(&f, w->size);
  /* what the model gives the serial step's matmuls and attention: the rest is pointwise */
  struct cluster c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "calibration");
  c.gpus_per_node = f.cores;
  c.nodes = 1;
  c.device_memory = f.memory / f.cores;
  c.peak_flops = f.peak;
  c.compute_efficiency = f.linears / f.peak;
  c.comm_efficiency = 1.0;
  c.intra.bandwidth = c.inter.bandwidth = f.bandwidth;
  c.intra.latency = c.inter.latency = f.latency;
  for (int op = 0; op < 3; op++) {
    c.intra.op_bandwidth[op] = c.inter.op_bandwidth[op] = f.op_bw[op];
    c.intra.op_latency[op] = c.inter.op_latency[op] = f.op_lat[op];
  }
  c.attention_flops = f.attention;
  struct cost k;
  if (cost_predict(&p, &c, &k, err, err_size)) {
    plan_free(&p);
    return 1;
  }
  f.fb_model = k.step;
  const double elems = (double)p.model.n_layers * p.batch.global * p.batch.seq * cost_pointwise_elems(&p);
  f.pointwise = (f.fb - f.fb_model) / elems;
  if (!(f.pointwise > 0))
    f.pointwise = 1e-18; /* the matmuls took all of it: a disturbed machine; the header says CLAMPED */
  int rc = 0;
  if (w->rank == 0) {
    rc = write_file(o, &p, &f, load, err, err_size);
    if (!rc && log) {
      fprintf(log, "calibrated %d cores (%d ranks): peak %.1f GFLOP/s, the plan's linears %.1f GFLOP/s, attention "
              "%.1f GFLOP/s, pointwise %.3f ns, optimizer %.3f ns per parameter, link %.2f GB/s + %.1f us\n",
              f.cores, f.ranks, f.peak / 1e9, f.linears / 1e9, f.attention / 1e9, f.pointwise * 1e9,
              f.optimizer * 1e9, f.bandwidth / 1e9, f.latency * 1e6);
      fprintf(log, "wrote %s (tycho check %s --cluster %s)\n", o->out, o->plan, o->out);
    }
  }
  plan_free(&p);
  snprintf(msg, sizeof msg, "%s", rc ? err : "");
  if (comm_agree(w, rc, msg, sizeof msg, &failed_rank)) {
    snprintf(err, err_size, "%s", msg);
    return 1;
  }
  return 0;
}
