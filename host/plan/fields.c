/* The plan-field table (fields.h): every scalar field of a plan, once. The compiler reads these
 * fields through it (compile.c, compile_read.c), --set's values reach them through the compiler,
 * t:set changes the LIVE ones with the compiler's check and message, the plan JSON writes them
 * (plan_json.c) and a resume compares the EQUAL ones (plan_resume_field, plan.c).
 *
 * What is not a row, and stays with its own reader: the structured parts, which a path, a type
 * and a range do not describe. model.layers-like lists and functions (stages, tp_split,
 * recompute, model.moe.layers: compile_layers.c, compile.c), mesh.dp (an integer or "auto") and
 * mesh.order (a list of axes), zero_every (each part's default depends on the zero stage and the
 * pipeline, plan_validate), checkpoint.allow_changes (a list of this table's resume names), and the derived
 * numbers plan_validate computes (head_dim, vocab_padded, microbatches). */
#include "fields.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"
#include "util/strbuf.h"

static const char *const families[] = { "llama", NULL };
static const char *const devices[] = { "auto", "cpu", "cuda", NULL };
static const char *const comms[] = { "auto", "staged", "mpi", "nccl", NULL }; /* enum plan_comm */
static const char *const schedules[] = { "gpipe", "1f1b", "interleaved", "zb-h1", NULL };
static const char *const dtypes[] = { "fp32", "bf16", "fp16", NULL };
static const char *const opt_kinds[] = { "adamw", NULL };
static const char *const decays[] = { "constant", "cosine", "linear", NULL };
static const char *const synthetic[] = { "addition", NULL };
static const char *const export_formats[] = { "safetensors", "hf", NULL };
static const char *const tb_ranks[] = { "0", "all", NULL };

#define AT(member) offsetof(struct plan, member), sizeof(((struct plan *)0)->member)
#define INF INFINITY
#define TWO53 9007199254740992.0
enum { R_SEEDS_GLOBAL = PLAN_N_RESUME_FIELDS, R_TRAIN_STEPS = PLAN_N_RESUME_FIELDS + 1 };
/* the fields a resume compares: its index, no derived flag */
#define EQ(i) PLAN_RESUME_EQUAL, i, -1, NULL
#define FREE PLAN_RESUME_FREE, -1, -1, NULL
#define LAYOUT PLAN_RESUME_LAYOUT, -1, -1, NULL
#define LIVE PLAN_FIELD_LIVE
#define FIN PLAN_FIELD_FINITE
#define LO PLAN_FIELD_MIN_OPEN
#define HO PLAN_FIELD_MAX_OPEN
#define REQ PLAN_FIELD_REQUIRED
#define SEC PLAN_FIELD_IN_SECTION
#define DER PLAN_FIELD_DERIVED

/* Within a section the rows are in the plan JSON's order (plan_fields_json writes them so);
 * resume_index is the order of the resume names (checkpoint.allow_changes bits). */
const struct plan_field plan_fields[] = {
  /* not written: named after the plan's file (compile.c) */
  { "name", PLAN_FIELD_TEXT, AT(name), 0, 0, DER, NULL, 0, NULL, FREE },
  { "model.family", PLAN_FIELD_NAME, AT(model.family), 0, 0, 0, families, 0, "llama", FREE },
  { "model.n_layers", PLAN_FIELD_INT, AT(model.n_layers), 1, 100000, REQ, NULL, 0, NULL, FREE },
  { "model.dim", PLAN_FIELD_INT, AT(model.dim), 1, 1 << 20, REQ, NULL, 0, NULL, FREE },
  { "model.n_heads", PLAN_FIELD_INT, AT(model.n_heads), 1, 1 << 16, REQ, NULL, 0, NULL, FREE },
  { "model.n_kv_heads", PLAN_FIELD_INT, AT(model.n_kv_heads), 1, 1 << 16, DER, NULL, 0, NULL, FREE },
  { "model.ffn_dim", PLAN_FIELD_INT, AT(model.ffn_dim), 1, 1 << 22, REQ, NULL, 0, NULL, FREE },
  { "model.vocab", PLAN_FIELD_INT, AT(model.vocab), 2, 1 << 24, REQ, NULL, 0, NULL, FREE },
  { "model.max_seq", PLAN_FIELD_INT, AT(model.max_seq), 1, 1 << 24, REQ, NULL, 0, NULL, FREE },
  { "model.norm_eps", PLAN_FIELD_NUMBER, AT(model.norm_eps), 0, INF, LO | FIN, NULL, 1e-5, NULL, EQ(0) },
  { "model.rope_theta", PLAN_FIELD_NUMBER, AT(model.rope_theta), 0, INF, LO | FIN, NULL, 10000, NULL, EQ(1) },
  { "model.dropout", PLAN_FIELD_NUMBER, AT(model.dropout), 0, 1, HO | FIN, NULL, 0, NULL, EQ(2) },
  { "model.tie_embeddings", PLAN_FIELD_BOOL, AT(model.tie_embeddings), 0, 1, 0, NULL, 0, NULL, FREE },
  /* model.moe: experts, ffn_dim and layers change the tensors, which the checkpoint's own list
   * of tensors catches; the others change what is computed */
  { "model.moe.experts", PLAN_FIELD_INT, AT(model.moe.experts), 1, 1 << 16, REQ, NULL, 0, NULL, FREE },
  { "model.moe.top_k", PLAN_FIELD_INT, AT(model.moe.top_k), 1, 1 << 16, REQ, NULL, 0, NULL, EQ(26) },
  { "model.moe.ffn_dim", PLAN_FIELD_INT, AT(model.moe.ffn_dim), 1, 1 << 22, DER, NULL, 0, NULL, FREE },
  { "model.moe.aux_loss", PLAN_FIELD_NUMBER, AT(model.moe.aux_loss), 0, INF, SEC | FIN, NULL, 0.01, NULL, EQ(27) },
  { "model.moe.z_loss", PLAN_FIELD_NUMBER, AT(model.moe.z_loss), 0, INF, SEC | FIN, NULL, 0, NULL, EQ(28) },
  { "model.moe.capacity_factor", PLAN_FIELD_NUMBER, AT(model.moe.capacity_factor), 0, INF, SEC | FIN, NULL, 0, NULL,
    EQ(29) },
  { "mesh.tp", PLAN_FIELD_INT, AT(mesh.tp), 1, 1 << 20, 0, NULL, 1, NULL, LAYOUT },
  { "mesh.pp", PLAN_FIELD_INT, AT(mesh.pp), 1, 1 << 20, 0, NULL, 1, NULL, LAYOUT },
  { "mesh.ep", PLAN_FIELD_INT, AT(mesh.ep), 1, 1 << 20, 0, NULL, 1, NULL, LAYOUT },
  { "mesh.cp", PLAN_FIELD_INT, AT(mesh.cp), 1, 1 << 20, 0, NULL, 1, NULL, LAYOUT },
  { "virtual_stages", PLAN_FIELD_INT, AT(virtual_stages), 1, 1 << 16, 0, NULL, 1, NULL, LAYOUT },
  { "sequence_parallel", PLAN_FIELD_BOOL, AT(sequence_parallel), 0, 1, 0, NULL, 0, NULL, LAYOUT },
  { "zero", PLAN_FIELD_INT, AT(zero), 0, 3, 0, NULL, 0, NULL, LAYOUT },
  { "bucket_mb", PLAN_FIELD_NUMBER, AT(bucket_mb), 0, 1 << 20, LO | FIN, NULL, 25, NULL, LAYOUT },
  { "schedule.kind", PLAN_FIELD_ENUM, AT(schedule), 0, 0, 0, schedules, PLAN_SCHED_1F1B, NULL, LAYOUT },
  { "batch.global", PLAN_FIELD_INT, AT(batch.global), 1, 1 << 30, REQ, NULL, 0, NULL, EQ(3) },
  { "batch.micro", PLAN_FIELD_INT, AT(batch.micro), 1, 1 << 30, 0, NULL, 1, NULL, LAYOUT },
  { "batch.seq", PLAN_FIELD_INT, AT(batch.seq), 1, 1 << 24, REQ, NULL, 0, NULL, EQ(4) },
  { "precision.compute", PLAN_FIELD_ENUM, AT(precision.compute), 0, 0, 0, dtypes, PLAN_FP32, NULL, EQ(23) },
  { "precision.grads", PLAN_FIELD_ENUM, AT(precision.grads), 0, 0, 0, dtypes, PLAN_FP32, NULL, EQ(24) },
  { "precision.master", PLAN_FIELD_ENUM, AT(precision.master), 0, 0, 0, dtypes, PLAN_FP32, NULL, EQ(25) },
  /* not compared: a checkpoint may move between devices */
  { "device", PLAN_FIELD_ENUM, AT(device), 0, 0, 0, devices, PLAN_DEVICE_AUTO, NULL, FREE },
  /* not compared: staged and direct collectives move the same bits */
  { "comm", PLAN_FIELD_ENUM, AT(comm), 0, 0, 0, comms, PLAN_COMM_AUTO, NULL, FREE },
  /* torch.optim.AdamW's defaults, and Megatron's default clipping at 1.0 */
  { "optimizer.kind", PLAN_FIELD_NAME, AT(optimizer.kind), 0, 0, 0, opt_kinds, 0, "adamw", EQ(12) },
  { "optimizer.lr", PLAN_FIELD_NUMBER, AT(optimizer.lr), 0, INF, LO | FIN | LIVE, NULL, 1e-3, NULL, EQ(13) },
  { "optimizer.beta1", PLAN_FIELD_NUMBER, AT(optimizer.beta1), 0, 1, HO | FIN | LIVE, NULL, 0.9, NULL, EQ(14) },
  { "optimizer.beta2", PLAN_FIELD_NUMBER, AT(optimizer.beta2), 0, 1, HO | FIN | LIVE, NULL, 0.999, NULL, EQ(15) },
  { "optimizer.eps", PLAN_FIELD_NUMBER, AT(optimizer.eps), 0, INF, LO | FIN | LIVE, NULL, 1e-8, NULL, EQ(16) },
  { "optimizer.weight_decay", PLAN_FIELD_NUMBER, AT(optimizer.weight_decay), 0, INF, FIN | LIVE, NULL, 0.01, NULL,
    EQ(17) },
  { "optimizer.grad_clip", PLAN_FIELD_NUMBER, AT(optimizer.grad_clip), 0, INF, FIN | LIVE, NULL, 1.0, NULL, EQ(18) },
  { "lr_schedule.warmup", PLAN_FIELD_INT, AT(lr_schedule.warmup), 0, 1 << 30, LIVE, NULL, 0, NULL, EQ(19) },
  { "lr_schedule.decay", PLAN_FIELD_ENUM, AT(lr_schedule.decay), 0, 0, LIVE, decays, PLAN_DECAY_CONSTANT, NULL,
    EQ(20) },
  /* not written: train.steps (plan_validate) */
  { "lr_schedule.decay_steps", PLAN_FIELD_LONG, AT(lr_schedule.decay_steps), 1, TWO53, DER | LIVE, NULL, 0, NULL,
    PLAN_RESUME_EQUAL, 21, (long)offsetof(struct plan, lr_schedule.decay_steps_derived), "train.steps" },
  { "lr_schedule.min_lr", PLAN_FIELD_NUMBER, AT(lr_schedule.min_lr), 0, INF, FIN | LIVE, NULL, 0, NULL, EQ(22) },
  { "seeds.global", PLAN_FIELD_LONG, AT(seeds.global), 0, TWO53 - 1, 0, NULL, 1234, NULL, PLAN_RESUME_PARENT,
    R_SEEDS_GLOBAL, -1, NULL },
  /* not written: derived from seeds.global and the purpose's name (plan_validate) */
  { "seeds.model", PLAN_FIELD_LONG, AT(seeds.value[PLAN_SEED_MODEL]), 0, TWO53 - 1, DER, NULL, 0, NULL,
    PLAN_RESUME_EQUAL, 9, (long)offsetof(struct plan, seeds.derived[PLAN_SEED_MODEL]), "seeds.global" },
  { "seeds.data", PLAN_FIELD_LONG, AT(seeds.value[PLAN_SEED_DATA]), 0, TWO53 - 1, DER, NULL, 0, NULL,
    PLAN_RESUME_EQUAL, 10, (long)offsetof(struct plan, seeds.derived[PLAN_SEED_DATA]), "seeds.global" },
  { "seeds.dropout", PLAN_FIELD_LONG, AT(seeds.value[PLAN_SEED_DROPOUT]), 0, TWO53 - 1, DER, NULL, 0, NULL,
    PLAN_RESUME_EQUAL, 11, (long)offsetof(struct plan, seeds.derived[PLAN_SEED_DROPOUT]), "seeds.global" },
  { "data.train", PLAN_FIELD_TEXT, AT(data.train), 0, 0, 0, NULL, 0, NULL, EQ(5) },
  { "data.val", PLAN_FIELD_TEXT, AT(data.val), 0, 0, 0, NULL, 0, NULL, EQ(6) },
  { "data.synthetic", PLAN_FIELD_NAME, AT(data.synthetic), 0, 0, 0, synthetic, 0, NULL, EQ(7) },
  { "data.shuffle", PLAN_FIELD_BOOL, AT(data.shuffle), 0, 1, 0, NULL, 0, NULL, EQ(8) },
  /* data.text (a list of files) is read by compile.c; these two go with it */
  { "data.tokenizer", PLAN_FIELD_TEXT, AT(data.tokenizer), 0, 0, 0, NULL, 0, NULL, FREE },
  { "data.fetch", PLAN_FIELD_TEXT, AT(data.fetch), 0, 0, 0, NULL, 0, NULL, FREE },
  { "data.val_fraction", PLAN_FIELD_NUMBER, AT(data.val_fraction), 0, 1, FIN | HO, NULL, 0.05, NULL, FREE },
  { "init.from", PLAN_FIELD_TEXT, AT(init.from), 0, 0, REQ, NULL, 0, NULL, FREE },
  { "export.path", PLAN_FIELD_TEXT, AT(export_.path), 0, 0, REQ, NULL, 0, NULL, FREE },
  { "export.every", PLAN_FIELD_INT, AT(export_.every), 0, 1 << 30, 0, NULL, 0, NULL, FREE },
  { "export.format", PLAN_FIELD_NAME, AT(export_.format), 0, 0, 0, export_formats, 0, "safetensors", FREE },
  { "export.shard_mb", PLAN_FIELD_NUMBER, AT(export_.shard_mb), 0.001, 1e9, FIN, NULL, 5000, NULL, FREE },
  { "train.steps", PLAN_FIELD_LONG, AT(train.steps), 1, TWO53, LIVE, NULL, 1000, NULL, PLAN_RESUME_PARENT,
    R_TRAIN_STEPS, -1, NULL },
  { "train.eval_every", PLAN_FIELD_INT, AT(train.eval_every), 0, 1 << 30, LIVE, NULL, 0, NULL, FREE },
  { "train.eval_batches", PLAN_FIELD_INT, AT(train.eval_batches), 0, 1 << 30, LIVE, NULL, 10, NULL, FREE },
  /* train.sample, read by compile.c as a table of its own; not in the plan JSON (two dots) */
  { "train.sample.prompt", PLAN_FIELD_TEXT, AT(train.sample.prompt), 0, 0, REQ, NULL, 0, NULL, FREE },
  { "train.sample.max_tokens", PLAN_FIELD_INT, AT(train.sample.max_tokens), 1, 1 << 20, 0, NULL, 64, NULL, FREE },
  { "train.sample.temperature", PLAN_FIELD_NUMBER, AT(train.sample.temperature), 0, 1e6, FIN, NULL, 0.8, NULL,
    FREE },
  { "train.sample.top_k", PLAN_FIELD_INT, AT(train.sample.top_k), 0, 1 << 30, 0, NULL, 40, NULL, FREE },
  { "train.sample.seed", PLAN_FIELD_LONG, AT(train.sample.seed), 0, TWO53 - 1, 0, NULL, 0, NULL, FREE },
  { "train.max_loss_jump", PLAN_FIELD_NUMBER, AT(train.max_loss_jump), 0, INF, HO | FIN, NULL, 0, NULL, FREE },
  { "checkpoint.dir", PLAN_FIELD_TEXT, AT(checkpoint.dir), 0, 0, REQ | LIVE, NULL, 0, NULL, FREE },
  { "checkpoint.every", PLAN_FIELD_INT, AT(checkpoint.every), 0, 1 << 30, 0, NULL, 0, NULL, FREE },
  { "checkpoint.keep", PLAN_FIELD_INT, AT(checkpoint.keep), 1, 1 << 20, 0, NULL, 3, NULL, FREE },
  { "checkpoint.async", PLAN_FIELD_BOOL, AT(checkpoint.async), 0, 1, 0, NULL, 0, NULL, FREE },
  { "log.every", PLAN_FIELD_INT, AT(log.every), 1, 1 << 30, LIVE, NULL, 10, NULL, FREE },
  { "log.metrics", PLAN_FIELD_TEXT, AT(log.metrics), 0, 0, 0, NULL, 0, NULL, FREE },
  { "log.trace", PLAN_FIELD_TEXT, AT(log.trace), 0, 0, 0, NULL, 0, NULL, FREE },
  { "log.trace_steps", PLAN_FIELD_INT, AT(log.trace_steps), 1, 1 << 20, 0, NULL, 5, NULL, FREE },
  { "log.tensorboard", PLAN_FIELD_TEXT, AT(log.tensorboard), 0, 0, 0, NULL, 0, NULL, FREE },
  { "log.tensorboard_ranks", PLAN_FIELD_NAME, AT(log.tensorboard_ranks), 0, 0, 0, tb_ranks, 0, "0", FREE },
};
const int plan_n_fields = (int)(sizeof plan_fields / sizeof plan_fields[0]);

const struct plan_field *plan_field_find(const char *path)
{
  for (int i = 0; i < plan_n_fields; i++)
    if (strcmp(plan_fields[i].path, path) == 0)
      return &plan_fields[i];
  return NULL;
}

/* The field's value, as the types store it. */
static void *at(const struct plan_field *f, const struct plan *p)
{
  return (char *)p + f->offset;
}

static void set_default(const struct plan_field *f, struct plan *p)
{
  void *v = at(f, p);
  switch (f->type) {
  case PLAN_FIELD_NUMBER: *(double *)v = f->def; break;
  case PLAN_FIELD_INT: case PLAN_FIELD_BOOL: case PLAN_FIELD_ENUM: *(int *)v = (int)f->def; break;
  case PLAN_FIELD_LONG: *(long long *)v = (long long)f->def; break;
  case PLAN_FIELD_NAME: case PLAN_FIELD_TEXT: snprintf(v, f->size, "%s", f->def_text ? f->def_text : ""); break;
  }
}

void plan_fields_default(struct plan *p, const char *section)
{
  const size_t sn = section ? strlen(section) : 0;
  for (int i = 0; i < plan_n_fields; i++) {
    const struct plan_field *f = &plan_fields[i];
    if (f->flags & (PLAN_FIELD_REQUIRED | PLAN_FIELD_DERIVED))
      continue;
    const int in_section = section && strncmp(f->path, section, sn) == 0 && f->path[sn] == '.';
    if (section ? in_section && (f->flags & PLAN_FIELD_IN_SECTION) : !(f->flags & PLAN_FIELD_IN_SECTION))
      set_default(f, p);
  }
}

/* Edit distance counting a swap of neighbours as one edit ("1fb1" is one away from "1f1b"). */
static int edit_distance(const char *a, const char *b)
{
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 63 || lb > 63)
    return 99;
  int d[64][64];
  for (int i = 0; i <= la; i++)
    d[i][0] = i;
  for (int j = 0; j <= lb; j++)
    d[0][j] = j;
  for (int i = 1; i <= la; i++)
    for (int j = 1; j <= lb; j++) {
      int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < c)
        c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c)
        c = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
        c = d[i - 2][j - 2] + 1;
      d[i][j] = c;
    }
  return d[la][lb];
}

const char *plan_field_closest(const char *word, const char *const *names)
{
  const char *best = NULL;
  int best_d = 99;
  for (int i = 0; names[i]; i++) {
    int d = edit_distance(word, names[i]);
    if (d < best_d) {
      best_d = d;
      best = names[i];
    }
  }
  int len = (int)strlen(word);
  return best_d <= (len <= 4 ? 1 : len <= 8 ? 2 : 3) ? best : NULL;
}

int plan_field_check_finite(const struct plan_field *f, const struct plan *p, char *err, size_t err_size)
{
  if (f->type != PLAN_FIELD_NUMBER || !(f->flags & PLAN_FIELD_FINITE))
    return 0;
  const double v = *(const double *)at(f, p);
  if (isfinite(v))
    return 0;
  snprintf(err, err_size, "%s = %s: must be a finite number", f->path, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
  return -1;
}

/* The last part of a dotted path. */
static const char *key_of(const char *path)
{
  const char *dot = strrchr(path, '.');
  return dot ? dot + 1 : path;
}

void plan_field_json(const struct plan_field *f, const struct plan *p, struct json *j)
{
  const void *v = at(f, p);
  json_key(j, key_of(f->path));
  switch (f->type) {
  case PLAN_FIELD_NUMBER: json_number(j, *(const double *)v); break;
  case PLAN_FIELD_INT: json_int(j, *(const int *)v); break;
  case PLAN_FIELD_LONG: json_int(j, *(const long long *)v); break;
  case PLAN_FIELD_BOOL: json_bool(j, *(const int *)v); break;
  case PLAN_FIELD_ENUM: json_string(j, f->names[*(const int *)v]); break;
  case PLAN_FIELD_NAME: case PLAN_FIELD_TEXT:
    if (((const char *)v)[0])
      json_string(j, v);
    else
      json_null(j);
    break;
  }
}

void plan_fields_json(const char *section, const struct plan *p, struct json *j)
{
  const size_t sn = strlen(section);
  for (int i = 0; i < plan_n_fields; i++) {
    const char *path = plan_fields[i].path;
    if (strncmp(path, section, sn) == 0 && path[sn] == '.' && !strchr(path + sn + 1, '.'))
      plan_field_json(&plan_fields[i], p, j);
  }
}

/* The shortest text that reads back as exactly x. */
static void exact_number(char *buf, size_t n, double x)
{
  if (!buf || n == 0)
    return;
  if (x == (double)(long long)x && x > -1e15 && x < 1e15) {
    snprintf(buf, n, "%lld", (long long)x);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x)
      return;
  }
}

void plan_field_text(const struct plan_field *f, const struct plan *p, char *buf, size_t n)
{
  const void *v = at(f, p);
  switch (f->type) {
  case PLAN_FIELD_NUMBER: exact_number(buf, n, *(const double *)v); break;
  case PLAN_FIELD_INT: snprintf(buf, n, "%d", *(const int *)v); break;
  case PLAN_FIELD_LONG: snprintf(buf, n, "%lld", *(const long long *)v); break;
  case PLAN_FIELD_BOOL: snprintf(buf, n, "%s", *(const int *)v ? "true" : "false"); break;
  case PLAN_FIELD_ENUM: snprintf(buf, n, "\"%s\"", f->names[*(const int *)v]); break;
  case PLAN_FIELD_NAME: case PLAN_FIELD_TEXT:
    snprintf(buf, n, ((const char *)v)[0] ? "\"%s\"" : "none", (const char *)v);
    break;
  }
}
