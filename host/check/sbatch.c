/* sbatch.h: a checked plan as a Slurm batch script. The script carries what check knows (the
 * layout, the bill against the device's memory, the predicted step) as comments, so the job's
 * owner sees before submitting what the job needs and what it should take. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/check_ep.h"
#include "check/check_internal.h"
#include "check/cost.h"
#include "check/sbatch.h"
#include "util/err.h"

/* s as one shell word on one line: as it is where it holds only safe characters; single-quoted
 * where it holds others; as $'...' (bash's escapes, the script's interpreter is bash) where it
 * holds a control character, so that a line break or a carriage return in a value never starts
 * a new line of the script. */
static void put_word(FILE *f, const char *s)
{
  int plain = *s != 0, control = 0;
  for (const char *c = s; *c; c++) {
    plain = plain && strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./=,:+@%", *c) != NULL;
    control = control || (unsigned char)*c < 0x20 || *c == 0x7f;
  }
  if (plain) {
    fputs(s, f);
    return;
  }
  if (control) {
    fputs("$'", f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
      if (*c == '\\' || *c == '\'')
        fprintf(f, "\\%c", *c);
      else if (*c < 0x20 || *c == 0x7f)
        fprintf(f, "\\x%02x", *c);
      else
        fputc(*c, f);
    fputc('\'', f);
    return;
  }
  fputc('\'', f);
  for (const char *c = s; *c; c++)
    if (*c == '\'')
      fputs("'\\''", f);
    else
      fputc(*c, f);
  fputc('\'', f);
}

/* The first control character in s (a line break ends an #SBATCH line: what follows would be
 * a line of the script), or NULL. */
static const char *control_char(const char *s)
{
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f)
      return s;
  return NULL;
}

/* s on a comment line: a line break in it would end the comment and run the rest. */
static void put_comment_text(FILE *f, const char *s)
{
  for (const char *c = s; *c; c++)
    fputc(*c == '\n' || *c == '\r' ? ' ' : *c, f);
}

/* A job name Slurm and file names take as they are: letters, digits, '.', '_', '-'. */
static void job_name(const struct plan *p, char *buf, size_t n)
{
  const char *s = p->name[0] ? p->name : "tycho";
  size_t k = 0;
  for (; s[k] && k + 1 < n && k < 64; k++) {
    const char c = s[k];
    buf[k] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                     c == '-'
                 ? c
                 : '_';
  }
  buf[k] = 0;
}

int check_write_sbatch(const struct plan *p, const struct cluster *c, const struct sbatch_options *o, FILE *f,
                       char *err, size_t err_size)
{
  const int world = p->mesh.world;
  /* a calibrated CPU cluster's "GPU" is a core running one rank of one thread (plan/cluster.h) */
  const int cpu_cluster = c->peak_flops < 1e12;
  const int gpus = !cpu_cluster && p->device != PLAN_DEVICE_CPU;
  const int per_node = world < c->gpus_per_node ? world : c->gpus_per_node;
  const int nodes = (world + c->gpus_per_node - 1) / c->gpus_per_node;
  const int cpus = o->cpus_per_task ? o->cpus_per_task : cpu_cluster ? 1 : 0;

  const char *bad = control_char(o->cwd);
  if (bad) {
    errf(err, err_size, "--sbatch: the current folder's path holds a control character (byte 0x%02x at offset %d), "
         "which an #SBATCH --chdir line cannot carry: run check from a folder whose path has none (%s)",
         (unsigned char)*bad, (int)(bad - o->cwd), o->cwd);
    return 2;
  }
  char why[512];
  struct bill *b = check_bills_of(p, 1, why, sizeof why);
  if (!b)
    return errf(err, err_size, "--sbatch: no memory bill for the summary: %s", why);
  double fullest = 0;
  int fullest_rank = 0;
  for (int r = 0; r < p->mesh.pp; r++)
    if (check_device_total(&b[r]) > fullest) {
      fullest = check_device_total(&b[r]);
      fullest_rank = r;
    }
  free(b);
  struct cost k;
  if (cost_predict(p, c, &k, why, sizeof why))
    return errf(err, err_size, "--sbatch: no step-time prediction for the summary: %s", why);

  char name[80], v[32], dm[32];
  job_name(p, name, sizeof name);
  fprintf(f, "#!/bin/bash\n");
  fprintf(f, "# plan ");
  put_comment_text(f, p->name[0] ? p->name : o->plan_path);
  fprintf(f, " (");
  put_comment_text(f, o->plan_path);
  fprintf(f, ") on %d rank%s, written by tycho check --sbatch\n# cluster: ", world, world == 1 ? "" : "s");
  put_comment_text(f, c->name);
  fprintf(f, " (");
  put_comment_text(f, o->cluster_path);
  fprintf(f, ")\n");
  char cp[32] = ""; /* context parallelism: named where it is there */
  if (p->mesh.cp > 1)
    snprintf(cp, sizeof cp, " x cp %d", p->mesh.cp);
  fprintf(f, "# layout: tp %d%s x pp %d x dp %d, zero %d; %d node%s of %d %s\n", p->mesh.tp, cp, p->mesh.pp, p->mesh.dp,
          p->zero, nodes, nodes == 1 ? "" : "s", c->gpus_per_node, cpu_cluster ? "cores (one rank each)" : "GPUs");
  const double head = 1.0 - fullest / c->device_memory;
  fprintf(f, "# memory: the fullest rank (pp rank %d) holds %s of %s per device: ", fullest_rank,
          check_format_bytes(fullest, v, sizeof v), check_format_bytes(c->device_memory, dm, sizeof dm));
  if (head >= 0)
    fprintf(f, "fits, %.0f%% headroom\n", 100.0 * head);
  else
    fprintf(f, "DOES NOT FIT (%s over)\n", check_format_bytes(-head * c->device_memory, v, sizeof v));
  fprintf(f, "# time: %.4g s per step, %.0f tokens/s, MFU %.1f%% (tycho check's prediction on this cluster)\n",
          k.step, k.tokens_per_s, 100.0 * k.mfu);
  fprintf(f, "#SBATCH --job-name=%s\n", name);
  fprintf(f, "#SBATCH --nodes=%d\n", nodes);
  fprintf(f, "#SBATCH --ntasks=%d\n", world);
  fprintf(f, "#SBATCH --ntasks-per-node=%d\n", per_node);
  if (gpus)
    fprintf(f, "#SBATCH --gpus-per-node=%d\n", per_node);
  if (cpus)
    fprintf(f, "#SBATCH --cpus-per-task=%d\n", cpus);
  else /* no figure for the node's cores in the cluster file: whole nodes, shared out below */
    fprintf(f, "#SBATCH --exclusive\n");
  fprintf(f, "#SBATCH --output=%s-%%j.out\n", name);
  fprintf(f, "#SBATCH --chdir=");
  put_word(f, o->cwd);
  fputc('\n', f);
  fprintf(f, "# checkpoints: ");
  if (p->checkpoint.dir[0]) {
    put_comment_text(f, p->checkpoint.dir);
    fprintf(f, " (every %d steps; submitted again, the job resumes from the newest)\n", p->checkpoint.every);
  } else {
    fprintf(f, "none (the plan sets no checkpoint.dir)\n");
  }
  fprintf(f, "# metrics: ");
  put_comment_text(f, p->log.metrics[0] ? p->log.metrics : "none (the plan sets no log.metrics)");
  fputc('\n', f);
  if (p->log.tensorboard[0]) {
    fprintf(f, "# tensorboard: ");
    put_comment_text(f, p->log.tensorboard);
    fputc('\n', f);
  }
  if (p->export_.path[0]) {
    fprintf(f, "# export: ");
    put_comment_text(f, p->export_.path);
    fputc('\n', f);
  }
  /* Debian's Open MPI starts under srun through PMIx only; srun passes --cpus-per-task to the
   * ranks itself (since Slurm 22.05 it does not take it from the job) */
  fprintf(f, "srun --mpi=pmix ");
  if (cpus)
    fprintf(f, "--cpus-per-task=%d ", cpus);
  else
    fprintf(f, "--cpus-per-task=$((SLURM_CPUS_ON_NODE / SLURM_NTASKS_PER_NODE)) ");
  put_word(f, o->self);
  fprintf(f, " run ");
  put_word(f, o->plan_path);
  if (o->unsafe)
    fprintf(f, " --unsafe");
  for (int i = 0; i < o->n_sets; i++) {
    fprintf(f, " --set ");
    put_word(f, o->sets[i]);
  }
  fputc('\n', f);
  return 0;
}
