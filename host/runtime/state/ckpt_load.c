/* Loading a checkpoint into a trainer (ckpt.h, ckpt_load): the manifest opened through the one
 * reader, the resume check of what the run computes, and every piece this rank holds assembled
 * from the pieces of any layout that overlap it (resharding). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/state/ckpt_internal.h"
#include "runtime/model/hostview.h"
#include "runtime/state/manifest.h"
#include "util/err.h"
#include "util/json.h"
#include "util/strbuf.h"

/* ---- reading ---------------------------------------------------------------------------- */

/* The checkpoint at path: path/manifest.json, or, when path holds step_N folders, the newest.
 * Read and checked by the one manifest reader (manifest.h). mf is to be freed either way. */
int ckpt_manifest_open(struct manifest *mf, const char *path, char *err, size_t err_size)
{
  char file[4200], latest[4096];
  struct stat st;
  memset(mf, 0, sizeof *mf);
  snprintf(file, sizeof file, "%s/manifest.json", path);
  if (stat(file, &st) && errno == ENOENT) {
    long long step;
    int found = ckpt_find_latest(path, latest, sizeof latest, &step, err, err_size);
    if (found < 0)
      return -1;
    if (found > 0)
      return errf_input(err, err_size, "%s: not a checkpoint (no manifest.json) and holds no step_N checkpoint", path);
    path = latest;
  }
  return manifest_read(mf, path, err, err_size);
}

static int get_int(const struct json_doc *j, int obj, const char *key, long long *out)
{
  int id = json_member(j, obj, key);
  uint64_t v;
  if (id < 0 || !json_uint64(j, id, &v) || v > (uint64_t)INT64_MAX)
    return -1;
  *out = (long long)v;
  return 0;
}

/* Elements with row < limit of the block (rows, cols) range [lo, hi). */
static int64_t range_count(int64_t r0, int64_t rows, int64_t cols, int64_t lo, int64_t hi, int64_t limit)
{
  int64_t n = 0;
  for (int64_t a = lo / cols; a < rows && a * cols < hi; a++) {
    if (r0 + a >= limit)
      break;
    int64_t x0 = lo - a * cols > 0 ? lo - a * cols : 0, x1 = hi - a * cols < cols ? hi - a * cols : cols;
    n += x1 - x0;
  }
  return n;
}

/* Copies into dst (elements [tlo, thi) of the block (tr0, tc0, trows, tcols); host memory, a
 * view of the range) what source piece sp holds of it, over rows below `limit`. Returns the
 * elements copied. */
static int64_t copy_overlap(real *dst, int64_t tr0, int64_t tc0, int64_t trows, int64_t tcols,
                            int64_t tlo, int64_t thi, const struct manifest_piece *sp, const real *src,
                            int64_t limit)
{
  int64_t g0 = tr0 > sp->r0 ? tr0 : sp->r0;
  int64_t g1 = tr0 + trows < sp->r0 + sp->rows ? tr0 + trows : sp->r0 + sp->rows;
  g1 = g1 < limit ? g1 : limit;
  int64_t copied = 0;
  for (int64_t g = g0; g < g1; g++) {
    const int64_t a = g - tr0, b = g - sp->r0;
    int64_t ta0 = tlo - a * tcols > 0 ? tlo - a * tcols : 0, ta1 = thi - a * tcols < tcols ? thi - a * tcols : tcols;
    int64_t sb0 = sp->lo - b * sp->cols > 0 ? sp->lo - b * sp->cols : 0;
    int64_t sb1 = sp->hi - b * sp->cols < sp->cols ? sp->hi - b * sp->cols : sp->cols;
    if (ta0 >= ta1 || sb0 >= sb1)
      continue;
    int64_t x0 = tc0 + ta0 > sp->c0 + sb0 ? tc0 + ta0 : sp->c0 + sb0; /* global columns */
    int64_t x1 = tc0 + ta1 < sp->c0 + sb1 ? tc0 + ta1 : sp->c0 + sb1;
    if (x0 >= x1)
      continue;
    memcpy(dst + (a * tcols + (x0 - tc0) - tlo), src + (b * sp->cols + (x0 - sp->c0) - sp->lo),
           (size_t)(x1 - x0) * sizeof(real));
    copied += x1 - x0;
  }
  return copied;
}

struct loader {
  struct manifest *mf;
  char *err;
  size_t err_size;
};

static struct manifest_tensor *find_tensor(struct manifest *mf, const char *name)
{
  for (int i = 0; i < mf->n_tensors; i++)
    if (!strcmp(mf->tensors[i].name, name))
      return &mf->tensors[i];
  return NULL;
}

static int load_piece(void *ctx, const struct model *m, const struct model_param *p, int index,
                      int kind, size_t lo, size_t hi, real *mem)
{
  (void)index;
  struct loader *ld = ctx;
  struct manifest *mf = ld->mf;
  struct manifest_tensor *tt = find_tensor(mf, p->name);
  if (!tt)
    return errf_input(ld->err, ld->err_size, "checkpoint %s: has no tensor %s", mf->path, p->name);
  const int64_t s1 = p->n_dims == 2 ? p->shape[1] : 1;
  if (tt->n_dims != p->n_dims || tt->shape[0] != p->shape[0] || tt->shape[1] != s1)
    return errf_input(ld->err, ld->err_size, "checkpoint %s: tensor %s has shape [%lld, %lld], the plan's model [%lld, %lld]",
                mf->path, p->name, (long long)tt->shape[0], (long long)tt->shape[1], (long long)p->shape[0], (long long)s1);
  int64_t r0, c0, rows, cols;
  ckpt_param_block(p, &r0, &c0, &rows, &cols);
  /* The range is assembled in a write-only host view of it, then written back whole. */
  const size_t bytes = (hi - lo) * sizeof(real);
  real *view = hostview_open(m->k, m->kctx, mem, bytes, 0);
  if (!view)
    return errf(ld->err, ld->err_size, "checkpoint %s: out of host memory staging the %s of %s",
                mf->path, ckpt_kind_names[kind], p->name);
  memset(view, 0, bytes); /* vocabulary padding stays zero */
  int64_t copied = 0;
  for (int k = 0; k < tt->n_pieces; k++) {
    struct manifest_piece *sp = &tt->pieces[k];
    if (sp->kind != kind || sp->r0 >= r0 + rows || sp->r0 + sp->rows <= r0)
      continue;
    if (sp->c0 >= c0 + cols || sp->c0 + sp->cols <= c0)
      continue;
    const real *src = manifest_piece_data(mf, tt, sp, ld->err, ld->err_size);
    if (!src) { /* partly loaded, as the range would be had it been written in place */
      hostview_close(m->k, m->kctx, mem, view, bytes, 1);
      return -1;
    }
    copied += copy_overlap(view, r0, c0, rows, cols, (int64_t)lo, (int64_t)hi, sp, src, p->shape[0]);
  }
  for (size_t e = 0; e < hi - lo; e++) /* a diverged state would fail at the first step, blamed on the lr */
    if (!isfinite((double)view[e])) {
      const double v = (double)view[e];
      hostview_close(m->k, m->kctx, mem, view, bytes, 1);
      return errf_input(ld->err, ld->err_size, "checkpoint %s: the %s of %s holds %s (element %zu of this rank's "
                  "range): the run that saved it had diverged; resume from an earlier checkpoint",
                  mf->path, ckpt_kind_names[kind], p->name, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", lo + e);
    }
  hostview_close(m->k, m->kctx, mem, view, bytes, 1);
  const int64_t want = range_count(r0, rows, cols, (int64_t)lo, (int64_t)hi, p->shape[0]);
  if (copied != want)
    return errf_input(ld->err, ld->err_size, "checkpoint %s: the %s pieces of %s cover %lld of the %lld elements "
                "this rank needs", mf->path, ckpt_kind_names[kind], p->name, (long long)copied, (long long)want);
  return 0;
}

void ckpt_model_values(const struct plan_model *c, long long vals[CKPT_MODEL_KEYS])
{
  const int v[CKPT_MODEL_KEYS] = { c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab,
                                   c->tie_embeddings, c->moe.experts, c->moe.experts > 0 ? c->moe.ffn_dim : 0 };
  for (int i = 0; i < CKPT_MODEL_KEYS; i++)
    vals[i] = v[i];
}

/* The model check, then every piece t holds copied from the manifest's pieces, then the step. */
int ckpt_load_manifest(struct trainer *t, struct manifest *mf, char *err, size_t err_size)
{
  long long vals[CKPT_MODEL_KEYS];
  ckpt_model_values(&t->plan->model, vals);
  for (int i = 0; i < CKPT_MODEL_KEYS; i++)
    if (mf->model[i] != vals[i])
      return errf_input(err, err_size, "checkpoint %s: its model has %s = %lld, the plan's %lld", mf->path,
                  ckpt_model_keys[i], mf->model[i], vals[i]);
  struct loader ld = { mf, err, err_size };
  t->model.bf16_fresh = 0; /* bf16 models: the copies are rounded again before the next forward */
  if (ckpt_for_each_piece(t, 0, load_piece, &ld))
    return -1;
  t->step = mf->step;
  /* train.max_loss_jump's window: as saved (a checkpoint without one starts it empty) */
  if (!mf->in_memory) /* a replan keeps the trainer's own */
    memset(&t->recent, 0, sizeof t->recent);
  if (mf->state >= 0) {
    const struct json_doc *j = &mf->j;
    int arr = json_member(j, mf->state, "recent_losses");
    long long in_a_row = 0;
    if (arr >= 0 && j->nodes[arr].type == JSON_ARRAY) {
      for (int c = j->nodes[arr].first; c >= 0 && t->recent.n < TRAIN_LOSS_WINDOW; c = j->nodes[c].next)
        if (!json_double(j, c, &t->recent.loss[t->recent.n++]))
          return errf_input(err, err_size, "checkpoint %s: state.recent_losses holds a non-number", mf->path);
      if (!get_int(j, mf->state, "skipped_in_a_row", &in_a_row))
        t->recent.skipped_in_a_row = (int)in_a_row;
    }
  }
  return 0;
}

/* A resume continues the run the checkpoint saved: each field of what the run computes must be
 * as the checkpoint recorded it, unless the plan's checkpoint.allow_changes names it (or the
 * parent it follows). 0 ok; TRAIN_PLAN_ERROR with a message naming every changed field. */
static int check_computes(const struct plan *p, const struct manifest *mf, char *err, size_t err_size)
{
  if (mf->computes < 0)
    return 0; /* recorded before resumes were compared: nothing to compare with */
  const struct json_doc *j = &mf->j;
  struct strbuf lines, names;
  sb_init(&lines);
  sb_init(&names);
  int changed = 0;
  uint32_t suggested = 0;
  for (int i = 0; i < PLAN_N_RESUME_FIELDS; i++) {
    const char *name = plan_resume_field_name(i);
    int node = json_member(j, mf->computes, name);
    if (node < 0 || j->nodes[node].type != JSON_STRING)
      continue; /* a field the checkpoint's tycho did not record */
    char v[PLAN_PATH_MAX + 64];
    int follows = ckpt_computes_value(p, i, v, sizeof v);
    if (!strcmp(v, j->nodes[node].str))
      continue;
    uint32_t allow = p->checkpoint.allow_changes;
    if (allow >> i & 1 || (follows >= 0 && allow >> follows & 1))
      continue;
    char how[PLAN_PATH_MAX + 96];
    if (follows >= 0)
      snprintf(how, sizeof how, "follows %s, %s", plan_resume_field_name(follows),
               plan_where(p, plan_resume_field_name(follows)));
    else
      snprintf(how, sizeof how, "%s", plan_where(p, name));
    sb_printf(&lines, "\n  %s = %s (%s); the checkpoint's run had %s", name, v, how, j->nodes[node].str);
    int named = follows >= 0 ? follows : i;
    if (!(suggested >> named & 1))
      sb_printf(&names, "%s\"%s\"", suggested ? ", " : "", plan_resume_field_name(named));
    suggested |= (uint32_t)1 << named;
    changed++;
  }
  int rc = 0;
  if (changed) {
    errf(err, err_size, "checkpoint %s: the plan changes what the run computes, so resuming would "
              "not continue the run it saved (%d field%s):%s\nA resume may change the layout (mesh, tp_split, "
              "zero, schedule, batch.micro, recompute). To change these anyway, list them in the plan: "
              "checkpoint = { allow_changes = { %s } }", mf->path, changed, changed == 1 ? "" : "s",
              lines.s ? lines.s : "", names.s ? names.s : "");
    rc = TRAIN_PLAN_ERROR;
  }
  sb_free(&lines);
  sb_free(&names);
  return rc;
}

int ckpt_load(struct trainer *t, const char *path, char *err, size_t err_size)
{
  struct manifest mf;
  int rc = ckpt_manifest_open(&mf, path, err, err_size);
  if (!rc)
    rc = check_computes(t->plan, &mf, err, err_size);
  if (!rc)
    rc = ckpt_load_manifest(t, &mf, err, err_size);
  manifest_free(&mf);
  return rc;
}
