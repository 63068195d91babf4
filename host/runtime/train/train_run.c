/* `tycho run`: the loop around the trainer, with what a user watches — a progress line every
 * log.every steps, evaluation lines, JSON-lines metrics (log.metrics), exports (export.path)
 * and, at the end, every rank's memory bill. Rank 0 of the job writes all of it. Work that
 * can fail on one rank alone (set-up, writing) is followed by an agreement over the group, so
 * every rank stops at the same point with the same message. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bf16.h"
#include "comm/comm.h"
#include "data/text_cache.h"
#include "io/hf.h"
#include "kernels.h"
#include "runtime/model/alloc.h"
#include "runtime/state/ckpt.h"
#include "runtime/state/manifest.h"
#include "runtime/train/run_guard.h"
#include "runtime/train/tensorboard.h"
#include "runtime/train/threads.h"
#include "runtime/train/threads_adapt.h"
#include "runtime/train/train.h"
#include "runtime/model/model_cp.h"
#include "runtime/train/train_moe.h"
#include "runtime/train/train_progress.h"
#include "runtime/train/train_sample.h"
#include "runtime/model/weights.h"
#include "text/tokenizer.h"
#include "util/err.h"
#include "util/file.h"
#include "util/path.h"

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *train_format_duration(char *buf, size_t n, double seconds)
{
  long s = (long)(seconds + 0.5);
  if (seconds < 60.0)
    snprintf(buf, n, "%.1fs", seconds);
  else if (s < 3600)
    snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
  else
    snprintf(buf, n, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  return buf;
}

struct run_log {
  FILE *out;                 /* progress lines; may be NULL */
  FILE *metrics;             /* JSON lines; NULL when log.metrics is unset */
  const char *metrics_path;
  /* log.tensorboard: the same lines as scalars (tensorboard.h), on rank 0 or, with
   * tensorboard_ranks "all", on every rank: its step lines and its own memory record; the
   * evaluation and the sparse layers' job-wide figures are rank 0's */
  struct tb_log tb;
  int rank, tb_all;
};

/* Rank 0, before anything else (trainer_open, any step): every path the run will write is tried
 * (run_guard.h: folders made, a probe file created and removed, naming the field and the path;
 * a path that exists as anything but a regular file is a plan error, never replaced),
 * checkpoint.dir, log.metrics and export.path are locked for the run (DIR/.lock, METRICS.lock,
 * EXPORT.lock: a second run on any is refused naming the holder's pid and host), and the
 * metrics file is opened. Then every file the run will read (data.train, data.val, init.from
 * or the manifest it resumes from) is opened without waiting and refused unless it is a
 * regular file, so a FIFO or a device is a plan error before the trainer opens. */
struct run_locks {
  struct run_lock ckpt, metrics, export_;
};

static int open_metrics(struct run_log *log, const char *path, char *err, size_t n)
{
  log->metrics_path = path;
  if (!path[0])
    return 0;
  int rc = path_check_own("log.metrics", path, -1, err, n); /* a link or a second name: refused */
  if (!rc)
    rc = path_fopen_output("log.metrics", path, 1, &log->metrics, err, n);
  if (!rc && (rc = path_check_own("log.metrics", path, fileno(log->metrics), err, n)) != 0) {
    fclose(log->metrics); /* made a link as it was opened: nothing written */
    log->metrics = NULL;
  }
  return rc;
}

/* An agreed plan error reads the same on every rank: the agreement leaves it without "rank R: ". */
_Static_assert(TRAIN_PLAN_ERROR == COMM_AGREE_PLAN_ERROR, "the trainer's plan error is the agreement's");

/* TRAIN_RUNTIME_ERROR made TRAIN_INPUT_ERROR when the fault was recorded as an input error on
 * this thread (util/err.h): the class is decided where the fault was found, and the status
 * carries it through the ranks' agreement to the exit code. */
static int classed(int rc)
{
  return rc == TRAIN_RUNTIME_ERROR && err_class_is_input() ? TRAIN_INPUT_ERROR : rc;
}

/* 0 ok; TRAIN_PLAN_ERROR for a path that is not a regular file; TRAIN_RUNTIME_ERROR otherwise. */
static int status_of(int rc)
{
  return rc == 2 ? TRAIN_PLAN_ERROR : rc ? TRAIN_RUNTIME_ERROR : TRAIN_OK;
}

static int check_input(const char *field, const char *path, char *err, size_t n)
{
  int fd, rc = path[0] ? path_open_input(field, path, 0, &fd, NULL, err, n) : 0;
  if (path[0] && rc == 0)
    close(fd);
  return rc == 2 ? TRAIN_PLAN_ERROR : TRAIN_OK; /* a missing file: its reader says so */
}

static int prepare_inputs(const struct plan *p, char *err, size_t n)
{
  int rc = TRAIN_OK;
  if (!p->data.synthetic[0])
    rc = check_input("data.train", p->data.train, err, n);
  if (!rc && !p->data.synthetic[0])
    rc = check_input("data.val", p->data.val, err, n);
  char latest[4096], why[512];
  long long step;
  const int found = p->checkpoint.dir[0] ? ckpt_find_latest(p->checkpoint.dir, latest, sizeof latest, &step, why,
                                                            sizeof why) : 1;
  if (!rc && found == 0) {
    char what[4300];
    if (manifest_special_file(latest, what, sizeof what)) { /* the manifest or a shard file */
      errf(err, n, "checkpoint.dir %s: %s", p->checkpoint.dir, what);
      rc = TRAIN_PLAN_ERROR;
    }
  } else if (!rc && found > 0) { /* init.from is not read when resuming */
    rc = status_of(weights_check_from(&p->model, p->init.from, err, n)); /* a folder: its config checked too */
  }
  return rc;
}

/* export.path as the export writes it: normalised (path_normalize: "X/.", "X/" and "X//" are
 * X), so that its lock (X.lock), X.tmp and X.old sit beside X. 0 ok; 2 a path that names no
 * file of its own ("." or "/", or one ending in ".."). */
static int export_path(const char *given, char *out, size_t size, char *err, size_t n)
{
  const char *last = out;
  if (path_normalize(given, out, size))
    return errf(err, n, "export.path %s: path too long", given);
  if (strrchr(out, '/'))
    last = strrchr(out, '/') + 1;
  if (strcmp(last, ".") == 0 || strcmp(last, "..") == 0 || !last[0]) {
    errf(err, n, "export.path %s: names no file of its own (it is '.', '/' or ends in '..'); give the export's own "
         "name", given);
    return 2;
  }
  return 0;
}

/* data.text: rank 0 tokenizes the texts into their cache unless it is there (text_cache.h); the
 * other ranks map it once the run's start is agreed. One line says which. */
static int make_text_cache(const struct plan *p, FILE *out, char *err, size_t n)
{
  return text_cache_prepare(p, out, err, n) ? TRAIN_RUNTIME_ERROR : TRAIN_OK; /* an input error is classed */
}

static int prepare_outputs(const struct plan *p, struct run_log *log, struct run_locks *locks, char *err, size_t n)
{
  char lock[4200];
  int rc;
  const char *dir = p->checkpoint.dir, *metrics = p->log.metrics, *export_ = p->export_.path;
  if (dir[0]) {
    snprintf(lock, sizeof lock, "%s/.lock", dir);
    if (run_probe_dir("checkpoint.dir", dir, err, n))
      return TRAIN_RUNTIME_ERROR;
    if ((rc = run_lock_take(&locks->ckpt, "checkpoint.dir", dir, lock, err, n)) != 0)
      return status_of(rc); /* 2: a link where the lock belongs */
  }
  if (metrics[0]) {
    snprintf(lock, sizeof lock, "%s.lock", metrics);
    if ((rc = run_probe_file("log.metrics", metrics, err, n)) != 0 ||
        (rc = path_check_own("log.metrics", metrics, -1, err, n)) != 0 ||
        (rc = run_lock_take(&locks->metrics, "log.metrics", metrics, lock, err, n)) != 0)
      return status_of(rc);
    if ((rc = open_metrics(log, metrics, err, n)) != 0)
      return status_of(rc);
  }
  if (export_[0]) {
    const int hf = strcmp(p->export_.format, "hf") == 0;
    char path[4096];
    if ((rc = export_path(export_, path, sizeof path, err, n)) != 0)
      return status_of(rc);
    snprintf(lock, sizeof lock, "%s.lock", path); /* a folder's lock beside it, not in it */
    if ((rc = hf ? weights_probe_hf(&p->model, path, err, n) : run_probe_replaced("export.path", path, err, n)) != 0)
      return status_of(rc);
    if ((rc = run_lock_take(&locks->export_, "export.path", path, lock, err, n)) != 0)
      return status_of(rc);
  }
  if ((rc = run_probe_replaced("log.trace", p->log.trace, err, n)) != 0)
    return status_of(rc);
  if ((rc = prepare_inputs(p, err, n)) != 0 || !p->data.n_text)
    return rc;
  return make_text_cache(p, log->out, err, n);
}

/* One line appended whole or not at all: written with write() past short writes (no stdio
 * buffer), and when the disk fills or a limit is reached part way, the file is cut back to its
 * length before the line, so a reader never sees half a record; the message gives the cause. */
static int write_metrics_line(struct run_log *log, const char *line, char *err, size_t n)
{
  if (!log->metrics)
    return 0;
  const int fd = fileno(log->metrics);
  struct stat st;
  if (fstat(fd, &st))
    return errf(err, n, "log.metrics: cannot write to %s: %s", log->metrics_path, strerror(errno));
  char why[64];
  if (file_write_all(fd, log->metrics_path, line, strlen(line), why, sizeof why)) {
    const int e = errno;
    (void)!ftruncate(fd, st.st_size); /* O_APPEND: the next line goes at the new end */
    return errf(err, n, "log.metrics: cannot write to %s: %s", log->metrics_path, strerror(e));
  }
  return 0;
}

/* SIGINT and SIGTERM during the steps: the first is noted, and the run stops at the next step
 * boundary that every rank agrees on (run_loop), or during an evaluation at its next batch
 * (trainer_eval_until) and then after that step; a second one ends the process at once. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
  if (stop_signal) {
    static const char again_int[] = "tycho: a second signal (SIGINT): exiting at once\n";
    static const char again_term[] = "tycho: a second signal (SIGTERM): exiting at once\n";
    if (sig == SIGINT)
      (void)!write(2, again_int, sizeof again_int - 1);
    else
      (void)!write(2, again_term, sizeof again_term - 1);
    _exit(128 + sig);
  }
  stop_signal = sig;
}

struct stop_handlers {
  struct sigaction old_int, old_term;
};

static void catch_stop_signals(struct stop_handlers *h)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  stop_signal = 0;
  sigaction(SIGINT, &sa, &h->old_int);
  sigaction(SIGTERM, &sa, &h->old_term);
}

static void release_stop_signals(const struct stop_handlers *h)
{
  sigaction(SIGINT, &h->old_int, NULL);
  sigaction(SIGTERM, &h->old_term, NULL);
}

static int log_step(struct run_log *log, const struct plan *p, const struct train_step_stats *s,
                    const struct train_moe *moe, long long tokens, double step_seconds, double elapsed,
                    char *err, size_t n)
{
  if (!log->metrics && log->tb.fd < 0)
    return 0;
  /* the sparse layers' object: per layer its figures and one count per expert */
  const size_t moe_size = moe->n ? (size_t)moe->n * (128 + 24 * (size_t)moe->E) + 256 : 1;
  const size_t size = 512 + moe_size;
  char *line = malloc(size), *part = malloc(moe_size);
  if (!line || !part) {
    free(line);
    free(part);
    return errf(err, n, "log.metrics: out of memory for a line");
  }
  part[0] = '\0';
  if (log->rank == 0) /* gathered at rank 0 only */
    train_moe_json(moe, part, moe_size);
  const double tokens_per_sec = (double)p->batch.global * p->batch.seq / step_seconds;
  /* %.17g: every digit of the double, so runs can be compared to 1e-10 (the float64 build) */
  /* the model's FLOPs per second over the job, as check's MFU counts them (3 × the forward's per
   * token, recompute not counted); MFU is this over world × the device's peak, which a run does
   * not know (check --cluster prices it) */
  const double model_tflops = 3.0 * plan_model_flops(p) * p->batch.global * p->batch.seq / step_seconds / 1e12;
  snprintf(line, size, "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
           "\"tokens\": %lld, \"tokens_per_sec\": %.1f, \"model_tflops\": %.6g, \"elapsed_s\": %.3f, "
           "\"threads\": %d%s%s}\n", s->step, s->loss, s->lr, s->grad_norm, tokens, tokens_per_sec, model_tflops,
           elapsed, s->threads, s->skipped ? ", \"skipped\": true" : "", part);
  int rc = write_metrics_line(log, line, err, n);
  if (!rc) /* at s + 1: the optimizer steps done, as evaluation counts them */
    rc = tb_line(&log->tb, TB_TRAIN, s->step + 1, line, err, n);
  free(line);
  free(part);
  return rc;
}

void train_format_progress(char *buf, size_t n, const struct train_step_stats *s, long long total,
                           double tokens_per_sec, double elapsed, double eta)
{
  char took[32], left[32];
  snprintf(buf, n, "step %*lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %s | ETA %s",
           (int)snprintf(NULL, 0, "%lld", total), s->step + 1, total, s->loss, s->lr, s->grad_norm,
           tokens_per_sec, train_format_duration(took, sizeof took, elapsed),
           train_format_duration(left, sizeof left, eta));
}

static void print_progress(FILE *out, const struct plan *p, const struct train_step_stats *s,
                           const struct train_moe *moe, double tokens_per_sec, double elapsed)
{
  if (!out)
    return;
  const long long done = s->step + 1, total = p->train.steps;
  char line[512], part[96];
  train_format_progress(line, sizeof line, s, total, tokens_per_sec, elapsed,
                        elapsed / (double)done * (double)(total - done));
  train_moe_progress(moe, part, sizeof part);
  fprintf(out, "%s%s\n", line, part);
  fflush(out);
}

int train_format_eval(char *buf, size_t n, const struct train_eval_stats *e)
{
  buf[0] = '\0';
  if (!e->has_val_loss && !e->has_accuracy)
    return 0;
  int shown = snprintf(buf, n, "eval at step %lld:", e->step);
  if (e->has_val_loss)
    shown += snprintf(buf + shown, n - (size_t)shown, " val loss %.4f", e->val_loss);
  if (e->has_accuracy)
    snprintf(buf + shown, n - (size_t)shown, "%s accuracy %.1f%% (%d held-out problems)",
             e->has_val_loss ? "," : "", 100.0 * e->accuracy, e->n_problems);
  return 1;
}

static int log_eval(struct run_log *log, const struct train_eval_stats *e, char *err, size_t n)
{
  char line[256], text[256];
  if (!train_format_eval(text, sizeof text, e))
    return 0;
  int used = snprintf(line, sizeof line, "{\"step\": %lld", e->step);
  if (e->has_val_loss)
    used += snprintf(line + used, sizeof line - (size_t)used, ", \"val_loss\": %.17g", e->val_loss);
  if (e->has_accuracy)
    used += snprintf(line + used, sizeof line - (size_t)used, ", \"accuracy\": %.6g", e->accuracy);
  snprintf(line + used, sizeof line - (size_t)used, "}\n");
  if (log->out) {
    fprintf(log->out, "%s\n", text);
    fflush(log->out);
  }
  if (write_metrics_line(log, line, err, n))
    return -1;
  return log->rank == 0 ? tb_line(&log->tb, TB_EVAL, e->step, line, err, n) : 0;
}

static void print_header(FILE *out, const struct plan *p, const struct trainer *t)
{
  if (!out)
    return;
  const struct plan_model *m = &p->model;
  long long n_params = model_n_params(&t->model);
  fprintf(out, "run %s: %lld parameters (%d layers, dim %d, %d heads / %d kv, ffn %d, vocab %d), "
          "%lld steps of %d × %d tokens (%d micro-batch%s of %d), %d thread%s%s%s%s\n",
          p->name[0] ? p->name : p->file, n_params, m->n_layers, m->dim, m->n_heads, m->n_kv_heads,
          m->ffn_dim, m->vocab, p->train.steps, p->batch.global, p->batch.seq, p->batch.microbatches,
          p->batch.microbatches == 1 ? "" : "es", p->batch.micro, omp_get_max_threads(),
          omp_get_max_threads() == 1 ? "" : "s", threads_reason()[0] ? " (" : "", threads_reason(),
          threads_reason()[0] ? ")" : "");
  char cpu[160];
  if (t->device.cuda)
    fprintf(out, "kernels: the CUDA backend's (cuBLAS)\n");
  else
    fprintf(out, "kernels: %s\n", kernels_cpu_description(cpu, sizeof cpu));
  if (!t->device.cuda && threads_adapt_on())
    fprintf(out, "threads: fewer while other programs use this rank's %d CPUs, all again when they are "
            "free (the results do not depend on the count)\n", threads_adapt_cpus());
  if (p->device != PLAN_DEVICE_CPU) /* where "auto" or "cuda" runs, and why */
    fprintf(out, "device: %s\n", t->device.text);
  if (t->model.bf16) {
    char lin[320];
    if (!strcmp(t->model.k->name, "cpu"))
      bf16_linear_path(lin, sizeof lin);
    else
      snprintf(lin, sizeof lin, "the %s table's", t->model.k->name);
    char attn[96];
    if (t->model.k->attention_forward_bf16)
      snprintf(attn, sizeof attn, "the attention's on tycho's %s kernel", attention_bf16_path());
    else
      snprintf(attn, sizeof attn, "the attention's in fp32 on this backend");
    fprintf(out, "precision: bf16 products (the linears' on %s, %s) on bf16 copies of the weights "
            "and the linears' inputs; fp32 master weights, gradients, norms, softmax and residual stream\n",
            lin, attn);
  }
  fprintf(out, "data: %s; init: %s\n", t->data.description,
          p->init.from[0] ? p->init.from : "random (seeds.model)");
  if (p->checkpoint.dir[0]) {
    fprintf(out, "checkpoints: %s, ", p->checkpoint.dir);
    if (p->checkpoint.every > 0)
      fprintf(out, "every %d steps and ", p->checkpoint.every);
    fprintf(out, "after the last, keeping %d%s\n", p->checkpoint.keep,
            p->checkpoint.async ? ", async (a snapshot in host memory, written while training goes on)" : "");
  }
  const struct plan_mesh *me = &p->mesh;
  if (me->tp > 1 || me->pp > 1) {
    fprintf(out, "mesh: tp %d × pp %d × dp %d", me->tp, me->pp, me->dp);
    if (me->cp > 1)
      fprintf(out, " × cp %d", me->cp);
    if (me->tp > 1)
      fprintf(out, "; tensor parallel%s", p->sequence_parallel ? " with sequence parallelism" : "");
    if (me->pp > 1)
      fprintf(out, "; %d stages, %s schedule, %d activation slots on this rank", p->n_stages,
              plan_schedule_name(p->schedule), t->exec.n_slots);
    fputc('\n', out);
  }
  const struct dp_layout *l = &t->dp.layout;
  if (t->model.cp.size > 1) /* the dp layer's group is dp × cp: the gradients are summed over both */
    fprintf(out, "context parallel: cp %d, each rank up to %d of a window's %d tokens (ring attention); "
            "gradients summed over dp %d × cp %d\n", t->model.cp.size, model_cp_max_rows(p->batch.seq, t->model.cp.size),
            p->batch.seq, p->mesh.dp, t->model.cp.size);
  if (t->dp.size > 1 || t->dp.zero > 0)
    fprintf(out, "data parallel%s: %d rank%s, zero %d, %d bucket%s (bucket_mb %g), %.2f MiB of "
            "parameters, shard %.2f MiB per rank\n", t->model.cp.size > 1 ? " (dp × cp)" : "", t->dp.size,
            t->dp.size == 1 ? "" : "s",
            t->dp.zero, l->n_buckets, l->n_buckets == 1 ? "" : "s", p->bucket_mb,
            (double)l->n_elems * sizeof(real) / 1048576.0,
            (double)l->n_shard * sizeof(real) / 1048576.0);
  fflush(out);
}

/* Rank 0 prints every rank's peaks: one line alone, one per rank in a group. Collective. */
/* One metrics record per rank: {"event": "memory", "rank": r, "peak": {category: bytes, ...,
 * "total": Σ of the categories' peaks}, "held": {category: bytes, ...}} — the peaks `tycho check`
 * predicts, and the bytes in use after the last step (what a rank keeps between steps: check's
 * model states and, with the peaks, its transient buffers). */
static int memory_record(struct run_log *log, int rank, const int64_t *peaks, const int64_t *held,
                         char *err, size_t n)
{
  char line[1024];
  int used = snprintf(line, sizeof line, "{\"event\": \"memory\", \"rank\": %d, \"peak\": {", rank);
  int64_t total = 0;
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++) {
    if (c == ALLOC_CHECKPOINT && !peaks[c])
      continue; /* as `tycho check` shows it: only with checkpoint.async */
    used += snprintf(line + used, sizeof line - (size_t)used, "%s\"%s\": %lld", c ? ", " : "",
                     alloc_category_name((enum alloc_category)c), (long long)peaks[c]);
    total += peaks[c];
  }
  used += snprintf(line + used, sizeof line - (size_t)used, ", \"total\": %lld}, \"held\": {", (long long)total);
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++)
    used += snprintf(line + used, sizeof line - (size_t)used, "%s\"%s\": %lld", c ? ", " : "",
                     alloc_category_name((enum alloc_category)c), (long long)held[c]);
  snprintf(line + used, sizeof line - (size_t)used, "}}\n");
  if (write_metrics_line(log, line, err, n))
    return -1;
  return !log->tb_all || rank == log->rank ? tb_line(&log->tb, TB_MEMORY, -1, line, err, n) : 0;
}

/* Every rank's peaks on rank 0's output and metrics. */
static int print_peaks(struct comm_group *g, struct run_log *log, char *err, size_t n)
{
  const struct alloc_bill *mine = alloc_bill();
  FILE *out = log->out;
  enum { K = 2 * ALLOC_N_CATEGORIES + 1 }; /* the peaks, the total's peak, the bytes in use */
  const int size = g ? g->size : 1;
  int64_t send[K], *all = malloc((size_t)size * K * sizeof *all);
  if (!all)
    return errf(err, n, "out of memory gathering the memory bills");
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++)
    send[c] = (int64_t)mine->peak_bytes[c];
  send[ALLOC_N_CATEGORIES] = (int64_t)mine->total_peak_bytes;
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++)
    send[ALLOC_N_CATEGORIES + 1 + c] = (int64_t)mine->n_bytes[c];
  int rc = 0;
  if (size == 1)
    memcpy(all, send, sizeof send);
  else if (comm_all_gather(g, send, all, K, COMM_INT64, NULL))
    rc = errf(err, n, "gathering the memory bills: %s", comm_error());
  for (int r = 0; (out || log->tb.fd >= 0) && !rc && r < size; r++) { /* tb: a rank's own, tb_all */
    struct alloc_bill b = { 0 };
    for (int c = 0; c < ALLOC_N_CATEGORIES; c++)
      b.peak_bytes[c] = (size_t)all[(size_t)r * K + (size_t)c];
    b.total_peak_bytes = (size_t)all[(size_t)r * K + ALLOC_N_CATEGORIES];
    if (out && size == 1) {
      alloc_print_peaks(out);
    } else if (out) {
      char label[64];
      snprintf(label, sizeof label, "memory peak, rank %d", r);
      alloc_print_bill_peaks(out, label, &b);
    }
    if (memory_record(log, r, all + (size_t)r * K, all + (size_t)r * K + ALLOC_N_CATEGORIES + 1, err, n))
      rc = -1;
  }
  free(all);
  return rc ? -1 : 0;
}

/* The tokenizer a Hugging Face export carries, so that the folder loads whole: data.tokenizer (the
 * one the run's text was tokenized with; a tokenizer.json by any name, or its folder), else
 * init.from's when it is a folder holding tokenizer.json; with its bos, eos and pad ids (from the
 * config.json beside it, then the tokenizer's own, as tokenizer_load finds them) for
 * generation_config.json. A tokenizer tycho cannot read is still copied, its ids left out rather
 * than guessed. `path` holds the tokenizer.json's path while x is used. */
static void export_extras(const struct plan *p, struct hf_extras *x, char *path, size_t size)
{
  char why[512];
  struct stat st;
  struct tokenizer *tok;
  *x = (struct hf_extras){ .tokenizer = "", .bos = -1, .eos = -1, .pad = -1 };
  const char *from = p->data.tokenizer[0] ? p->data.tokenizer : hf_is_folder(p->init.from) ? p->init.from : NULL;
  if (!from)
    return;
  if (hf_is_folder(from))
    snprintf(path, size, "%s/%s", from, HF_TOKENIZER);
  else
    snprintf(path, size, "%s", from);
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return;
  x->tokenizer = path;
  if (tokenizer_load(&tok, path, why, sizeof why) == 0) {
    x->bos = tokenizer_bos(tok);
    x->eos = tokenizer_eos(tok);
    x->pad = tokenizer_pad(tok);
    tokenizer_free(tok);
  }
}

/* Collective (ZeRO-3 gathers); rank 0 writes. */
static int export_weights(struct trainer *t, FILE *out, long long steps_done, char *err, size_t n)
{
  char path[4096], why[1024];
  if (export_path(t->plan->export_.path, path, sizeof path, err, n))
    return -1;
  const int hf = strcmp(t->plan->export_.format, "hf") == 0;
  struct hf_extras extras;
  char tokenizer[PLAN_PATH_MAX + 32];
  if (hf)
    export_extras(t->plan, &extras, tokenizer, sizeof tokenizer);
  if (dp_export(&t->dp, path, hf ? (uint64_t)(t->plan->export_.shard_mb * 1e6) : 0, hf ? &extras : NULL, why,
                sizeof why))
    return errf(err, n, "export.path %s: %s", path, why);
  if (out) {
    fprintf(out, "exported %s after step %lld\n", path, steps_done);
    fflush(out);
  }
  return 0;
}

/* Test hook: TYCHO_TEST_LEAVE_AFTER_STEP=s makes this rank stop after step s (0-based) as if
 * the run were over, without a word to the others: a rank that exits early, which the comm
 * watchdog must turn into a diagnosis and the end of the job. -1 when unset. */
static long long leave_after_step(void)
{
  const char *v = getenv("TYCHO_TEST_LEAVE_AFTER_STEP");
  char *end;
  long long s = v && *v ? strtoll(v, &end, 10) : -1;
  return v && *v && !*end ? s : -1;
}

enum { TRACE_RECORDS = 1 << 16 };

/* log.trace: every rank's spans and comm records of steps first..last, gathered and written by
 * rank 0 as one Chrome trace-event file. Collective over the world; the same verdict everywhere. */
static int write_trace(const struct plan *p, FILE *out, long long first, long long last, char *err, size_t n)
{
  char why[512];
  if (comm_trace_write_steps(p->log.trace, first, last, why, sizeof why))
    return errf(err, n, "log.trace: %s", why);
  if (out) {
    fprintf(out, "trace %s: steps %lld-%lld (Chrome trace-event JSON; open it in Perfetto)\n", p->log.trace,
            first + 1, last + 1);
    fflush(out);
  }
  return 0;
}

/* checkpoint.async: commits the pending save when every rank has written it (waiting for this
 * rank's writer first with `wait`), saying so. Collective; the same verdict on every rank. */
static int async_commit(struct trainer *t, struct run_log *log, int wait, char *err, size_t n)
{
  long long step;
  double seconds;
  const double k0 = comm_now();
  if (ckpt_async_poll(t, wait, &step, &seconds, err, n))
    return -1;
  if (step >= 0) {
    comm_trace_work("checkpoint commit", -1, -1, 0.0, k0, comm_now());
    if (log->out) {
      fprintf(log->out, "checkpoint %s/step_%08lld written in %.2f s (async)\n", t->plan->checkpoint.dir, step,
              seconds);
      fflush(log->out);
    }
  }
  return 0;
}

static struct train_between between;

void train_run_set_between(const struct train_between *b)
{
  between = b ? *b : (struct train_between){ 0 };
}

static int run_steps(struct trainer *t, struct run_log *log, struct train_moe *moe, int *left, char *err,
                     size_t n)
{
  const struct plan *p = t->plan;
  struct comm_group *g = t->world;
  long long steps = p->train.steps;
  const long long leave_after = leave_after_step(), first = t->step;
  const double start = now_seconds();
  double interval_seconds = 0.0;
  long long tokens = first * p->batch.global * p->batch.seq, interval_tokens = 0;
  for (long long s = first; s < steps; s++) {
    struct train_step_stats st;
    double t0 = now_seconds();
    if (trainer_step(t, &st, err, n)) /* the same verdict on every rank: loss and norm are */
      return TRAIN_RUNTIME_ERROR;
    double t1 = now_seconds();
    long long step_tokens = (long long)p->batch.global * p->batch.seq;
    tokens += step_tokens;
    interval_tokens += step_tokens;
    interval_seconds += t1 - t0;
    /* From here each rank goes on through the collectives (evaluation, export) even after a
     * failure of its own, and the agreement at the end of the step stops them all. */
    /* the sparse layers' routing, gathered at rank 0 (instrumentation: uncounted) */
    int failed = train_moe_gather(moe, t, err, n);
    if (!failed && (!g || g->rank == 0))
      train_moe_trace(moe);
    if (!failed)
      failed = log_step(log, p, &st, moe, tokens, t1 - t0, t1 - start, err, n);
    char warnings[1024];
    if (!failed && train_moe_window(moe, s, s + 1 == steps, warnings, sizeof warnings) && log->out) {
      fputs(warnings, log->out);
      fflush(log->out);
    }
    if (st.threads_next != st.threads && st.threads_next > 0 && log->out) {
      if (st.threads_next < st.threads)
        fprintf(log->out, "step %lld: %d thread%s from here: other programs are using %.1f of the %d CPU%s this "
                "rank was given (results do not depend on the thread count)\n", s + 1, st.threads_next,
                st.threads_next == 1 ? "" : "s", st.others_cpus, threads_adapt_cpus(), threads_adapt_cpus() == 1 ? "" : "s");
      else
        fprintf(log->out, "step %lld: %d threads from here: other programs are using %.1f of the %d CPUs\n",
                s + 1, st.threads_next, st.others_cpus, threads_adapt_cpus());
      fflush(log->out);
    }
    if (st.skipped && log->out) {
      fprintf(log->out, "step %lld: loss %.4f is %.1f× the mean of the last %d applied steps (%.4f): not applied "
              "(train.max_loss_jump = %g)\n", s + 1, st.loss, st.loss / st.recent_loss, t->recent.n, st.recent_loss,
              p->train.max_loss_jump);
      fflush(log->out);
    }
    int last = s + 1 == steps, printed = 0;
    if ((printed = (s + 1) % p->log.every == 0 || last || s == first)) {
      print_progress(log->out, p, &st, moe, (double)interval_tokens / interval_seconds, t1 - start);
      interval_tokens = 0;
      interval_seconds = 0.0;
    }
    if ((p->train.eval_every > 0 && (s + 1) % p->train.eval_every == 0) || last) {
      struct train_eval_stats ev;
      const double e0 = comm_now();
      trainer_eval_until(t, &ev, &stop_signal); /* a signal ends it at the next batch, agreed */
      comm_trace_work("evaluation", -1, -1, 0.0, e0, comm_now());
      if (trainer_failed(t))
        return errf(err, n, "evaluation after step %lld: %s", s, trainer_failed(t)), TRAIN_RUNTIME_ERROR;
      if (ev.stopped && log->out) { /* the step's agreement below stops the run */
        fprintf(log->out, "eval at step %lld: cut short by a signal\n", ev.step);
        fflush(log->out);
      }
      char why[1024];
      if (log_eval(log, &ev, why, sizeof why) && !failed)
        failed = errf(err, n, "%s", why);
      if (p->train.sample.given && !ev.stopped) /* collective (the gather to rank 0); rank 0 prints */
        train_sample_print(t, log->out, ev.step);
    }
    if (p->export_.path[0] && ((p->export_.every > 0 && (s + 1) % p->export_.every == 0) || last)) {
      char why[1024];
      const double x0 = comm_now();
      if (export_weights(t, log->out, s + 1, why, sizeof why) && !failed) /* s + 1 steps done */
        failed = errf(err, n, "%s", why);
      comm_trace_work("export", -1, -1, 0.0, x0, comm_now());
    }
    /* The step's agreement carries a signal too (status 128 + its number): when any rank was
     * signalled, every rank stops after this same step. No collective is added in the common
     * case (this agreement runs every step anyway); a second one, when a signal was agreed, lets
     * a failure on any rank win over it. */
    const int sig = stop_signal;
    char mine[COMM_AGREE_MSG_MAX];
    snprintf(mine, sizeof mine, "%s", failed ? err : "");
    int agreed = comm_agree_err(g, failed ? TRAIN_RUNTIME_ERROR : sig ? 128 + sig : TRAIN_OK, err, n, COMM_AGREE_NAME_RANK_UNLESS_PLAN), stop = 0;
    if (agreed > 128) {
      stop = agreed - 128;
      snprintf(err, n, "%s", mine);
      if (comm_agree_err(g, failed ? TRAIN_RUNTIME_ERROR : TRAIN_OK, err, n, COMM_AGREE_NAME_RANK_UNLESS_PLAN))
        return TRAIN_RUNTIME_ERROR;
    } else if (agreed) {
      return TRAIN_RUNTIME_ERROR;
    }
    if (stop && !printed)
      print_progress(log->out, p, &st, moe, (double)interval_tokens / interval_seconds, t1 - start);
    const char *ckdir = p->checkpoint.dir;
    const int save = ckdir[0] && ((p->checkpoint.every > 0 && (s + 1) % p->checkpoint.every == 0) || last || stop);
    /* checkpoint.async: a save still being written commits once every rank's file is synced (asked
     * after each step); before the next save, the last step or a stop, it is waited for. */
    if (t->ckpt_pending && async_commit(t, log, save || last || stop, err, n))
      return TRAIN_RUNTIME_ERROR;
    if (save && p->checkpoint.async) {
      double c0 = now_seconds(), k0 = comm_now();
      if (ckpt_save_async(t, ckdir, s + 1, p->checkpoint.keep, err, n))
        return TRAIN_RUNTIME_ERROR;
      comm_trace_work("checkpoint snapshot", -1, -1, 0.0, k0, comm_now());
      if (log->out) {
        fprintf(log->out, "checkpoint %s/step_%08lld: snapshot in %.2f s, writing in the background\n", ckdir,
                s + 1, now_seconds() - c0);
        fflush(log->out);
      }
      /* the last step's (and a stop's) is written before the run ends */
      if ((last || stop) && async_commit(t, log, 1, err, n))
        return TRAIN_RUNTIME_ERROR;
    } else if (save) {
      double c0 = now_seconds(), k0 = comm_now();
      if (ckpt_save(t, ckdir, s + 1, p->checkpoint.keep, err, n))
        return TRAIN_RUNTIME_ERROR;
      comm_trace_work("checkpoint", -1, -1, 0.0, k0, comm_now());
      if (log->out) {
        fprintf(log->out, "checkpoint %s/step_%08lld written in %.2f s\n", ckdir, s + 1, now_seconds() - c0);
        fflush(log->out);
      }
    }
    if (p->log.trace[0] && (s + 1 == first + p->log.trace_steps || ((last || stop) && s + 1 < first + p->log.trace_steps)) &&
        write_trace(p, log->out, first, s, err, n))
      return TRAIN_RUNTIME_ERROR;
    if (stop) {
      const char *name = stop == SIGINT ? "SIGINT" : stop == SIGTERM ? "SIGTERM" : "a signal";
      if (ckdir[0])
        errf(err, n, "interrupted by %s after step %lld: checkpoint %s/step_%08lld written", name, s + 1, ckdir, s + 1);
      else
        errf(err, n, "interrupted by %s after step %lld: no checkpoint.dir, so the trained steps are not saved",
             name, s + 1);
      return 128 + stop;
    }
    /* the REPL's turn between steps (tycho run --listen): it may have stepped or changed the
     * trainer, so the loop goes on from where the trainer is */
    if (between.fn) {
      if (between.fn(between.ctx, t, err, n))
        return TRAIN_RUNTIME_ERROR;
      p = t->plan;
      steps = p->train.steps;
      tokens += (t->step - (s + 1)) * (long long)p->batch.global * p->batch.seq; /* the REPL's steps */
      s = t->step - 1;
    }
    if (s == leave_after) {
      fprintf(stderr, "tycho: rank %d: leaving after step %lld (TYCHO_TEST_LEAVE_AFTER_STEP)\n",
              g ? g->ranks[g->rank] : 0, s);
      *left = 1;
      return TRAIN_OK;
    }
  }
  if (log->out && first >= steps)
    fprintf(log->out, "nothing to train: the checkpoint is at step %lld, train.steps is %lld\n", first, steps);
  else if (log->out) {
    char took[32];
    fprintf(log->out, "done: %lld steps, %lld tokens in %s\n", steps, tokens,
            train_format_duration(took, sizeof took, now_seconds() - start));
  }
  return TRAIN_OK;
}

/* checkpoint.dir holding a checkpoint: every rank loads its blocks and shards of the newest
 * (on any mesh) and the run goes on from its step. Agreed over the job. */
static int resume(struct trainer *t, struct comm_group *all, FILE *out, char *err, size_t n)
{
  char path[4096];
  long long step;
  int found = ckpt_find_latest(t->plan->checkpoint.dir, path, sizeof path, &step, err, n);
  int rc = found < 0 ? classed(TRAIN_RUNTIME_ERROR) : TRAIN_OK;
  int loaded = found == 0 ? ckpt_load(t, path, err, n) : 0;
  if (loaded) /* the plan changes the run, or the checkpoint's content is bad (an input error) */
    rc = loaded == TRAIN_PLAN_ERROR ? TRAIN_PLAN_ERROR : classed(TRAIN_RUNTIME_ERROR);
  rc = comm_agree_err(all, rc, err, n, COMM_AGREE_NAME_RANK_UNLESS_PLAN);
  if (rc == TRAIN_OK && found == 0 && out) {
    fprintf(out, "resumed from %s: step %lld%s\n", path, step,
            t->plan->init.from[0] ? " (init.from is not read when resuming)" : "");
    fflush(out);
  }
  return rc;
}
/* The steps, with the sparse layers' statistics (train_moe.h) open around them. */
static int run_loop(struct trainer *t, struct run_log *log, int *left, char *err, size_t n)
{
  struct train_moe moe;
  if (train_moe_open(&moe, t, err, n))
    return TRAIN_RUNTIME_ERROR;
  int rc = run_steps(t, log, &moe, left, err, n);
  train_moe_close(&moe);
  return rc;
}


int train_run(const struct plan *p, struct comm_group *const *groups, FILE *out, char *err,
              size_t err_size)
{
  struct comm_group *all = groups ? comm_world() : NULL;
  const int rank0 = !all || all->rank == 0;
  struct run_log log = { .out = rank0 ? out : NULL, .metrics_path = "" };
  struct run_locks locks = { { .fd = -1 }, { .fd = -1 }, { .fd = -1 } };
  tb_init(&log.tb);
  log.rank = all ? all->rank : 0;
  log.tb_all = strcmp(p->log.tensorboard_ranks, "all") == 0;
  /* Everything the run will write, tried and locked, and what it will read, looked at, before
   * the trainer opens (exit 1; exit 2 for a path that is not a regular file). */
  err_class_reset();
  int rc = rank0 ? classed(prepare_outputs(p, &log, &locks, err, err_size)) : TRAIN_OK;
  if (rc == TRAIN_OK && p->log.tensorboard[0] && (rank0 || log.tb_all)) /* a new event file */
    rc = status_of(tb_open(&log.tb, p->log.tensorboard, log.rank, log.tb_all, err, err_size));
  rc = comm_agree_err(all, rc, err, err_size, COMM_AGREE_NAME_RANK_UNLESS_PLAN);
  struct trainer t;
  int opened = rc;
  if (rc == TRAIN_OK) {
    opened = classed(trainer_open(&t, p, groups, err, err_size));
    rc = comm_agree_err(all, opened, err, err_size, COMM_AGREE_NAME_RANK_UNLESS_PLAN);
  }
  if (rc == TRAIN_OK) {
    print_header(log.out, p, &t);
    /* Partial step_N.tmp folders: ours to remove, as checkpoint.dir is locked by this run. */
    if (rank0 && p->checkpoint.dir[0] && ckpt_remove_partial(p->checkpoint.dir, log.out, err, err_size))
      rc = TRAIN_RUNTIME_ERROR;
    rc = comm_agree_err(all, rc, err, err_size, COMM_AGREE_NAME_RANK_UNLESS_PLAN);
  }
  if (rc == TRAIN_OK && p->checkpoint.dir[0])
    rc = resume(&t, all, log.out, err, err_size);
  /* log.trace: room for the traced steps' records and spans (some MiB per rank), not 4096 */
  if (rc == TRAIN_OK && p->log.trace[0] && all) { /* rc is agreed: every rank or none */
    if (comm_reserve_records(TRACE_RECORDS))
      rc = errf(err, err_size, "log.trace: out of memory for %d trace records", TRACE_RECORDS);
    rc = comm_agree_err(all, rc, err, err_size, COMM_AGREE_NAME_RANK_UNLESS_PLAN);
  }
  int left = 0;
  if (rc == TRAIN_OK) {
    struct stop_handlers h;
    catch_stop_signals(&h);
    rc = run_loop(&t, &log, &left, err, err_size);
    release_stop_signals(&h);
    /* A run that stopped on an error with an async save pending: the snapshot is of a good
     * step, so it is finished when every rank can (the agreement decides), else left as .tmp. */
    if (t.ckpt_pending && rc == TRAIN_RUNTIME_ERROR && !left) {
      char why[COMM_AGREE_MSG_MAX];
      if (async_commit(&t, &log, 1, why, sizeof why) && log.out)
        fprintf(log.out, "the async checkpoint in progress was not written either: %s\n", why);
    }
  }
  if (rc == TRAIN_OK && !left) {
    rc = print_peaks(all, &log, err, err_size) ? TRAIN_RUNTIME_ERROR : TRAIN_OK;
    if (log.out)
      fflush(log.out);
  }
  if (log.metrics)
    fclose(log.metrics);
  char why[1024]; /* the records kept, written after a failure or a signal too */
  if (tb_flush(&log.tb, 1, why, sizeof why) && rc == TRAIN_OK) {
    errf(err, err_size, "%s", why);
    rc = TRAIN_RUNTIME_ERROR;
  }
  tb_close(&log.tb);
  run_lock_release(&locks.export_);
  run_lock_release(&locks.metrics);
  run_lock_release(&locks.ckpt);
  if (opened == TRAIN_OK)
    trainer_close(&t);
  return rc;
}
