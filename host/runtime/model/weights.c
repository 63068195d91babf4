/* Hugging Face safetensors in and out of the parameter table. Loading is strict: the model's
 * parameter set and the file's tensor set must be equal, with equal shapes, so a checkpoint of
 * another configuration fails at once with the name of the first tensor that disagrees. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/model/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "runtime/model/hostview.h"
#include "util/err.h"
#include "util/path.h"

/* A tensor source: one file or a sharded index. */
struct source {
  int sharded;
  struct st_file file;
  struct st_index index;
};

static int ends_with(const char *s, const char *suffix)
{
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static const struct st_tensor *source_find(const struct source *s, const char *name,
                                           const struct st_file **file)
{
  if (s->sharded)
    return st_index_find(&s->index, name, file);
  *file = &s->file;
  return st_find(&s->file, name);
}

static int source_count(const struct source *s)
{
  return s->sharded ? s->index.n_entries : s->file.n_tensors;
}

static const char *source_name(const struct source *s, int i)
{
  return s->sharded ? s->index.entries[i].name : s->file.tensors[i].name;
}

static void format_shape(char *buf, size_t n, int n_dims, const int64_t *shape)
{
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < n_dims && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (used < n)
    snprintf(buf + used, n - used, "]");
}

/* A run cannot start from weights that are not finite: say so here, naming the tensor and the
 * element, instead of a non-finite loss at step 1 blamed on the learning rate. */
static int all_finite(const real *x, size_t n, const char *path, const char *name, char *err, size_t err_size)
{
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i]))
      return errf(err, err_size, "init.from %s: tensor '%s' holds a non-finite value (%g at element %zu): "
                  "a run cannot start from these weights", path, name, (double)x[i], i);
  return 0;
}

static int load_tensors(struct model *m, const struct source *s, const char *path, char *err,
                        size_t err_size)
{
  for (int i = 0; i < source_count(s); i++) {
    const char *name = source_name(s, i);
    if (!model_find(m, name) && !ends_with(name, ".rotary_emb.inv_freq"))
      return errf(err, err_size, "init.from %s: tensor '%s' is not a parameter of this model "
                  "(check model.n_layers and model.tie_embeddings)", path, name);
  }
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    const struct st_file *file;
    const struct st_tensor *t = source_find(s, p->name, &file);
    if (!t)
      return errf(err, err_size, "init.from %s: tensor '%s' is missing", path, p->name);
    int same = t->n_dims == p->n_dims;
    for (int d = 0; same && d < p->n_dims; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
      char want[64], found[128];
      format_shape(want, sizeof want, p->n_dims, p->shape);
      format_shape(found, sizeof found, t->n_dims, t->shape);
      return errf(err, err_size, "init.from %s: tensor '%s' has shape %s, the model expects %s",
                  path, p->name, found, want);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16 && t->dtype != ST_F64)
      return errf(err, err_size, "init.from %s: tensor '%s' is %s; F32, F16, BF16 and F64 are read",
                  path, p->name, st_dtype_name(t->dtype));
    if (!p->data || !p->here)
      continue; /* not held here now, or on another pipeline stage */
    if (p->tp_dim < 0) {
      /* The file's elements through a write-only host view of the tensor's first t->n_elems
       * (the backend's memory is never dereferenced); the padding rows after them are zeroed
       * in place by the backend. */
      const size_t bytes = t->n_elems * sizeof(real);
      real *view = hostview_open(m->k, m->kctx, p->data, bytes, 0);
      if (!view)
        return errf(err, err_size, "init.from %s: out of host memory staging '%s'", path, p->name);
      int rc = st_read_real(file, t, view, t->n_elems, err, err_size);
      rc = rc ? rc : all_finite(view, t->n_elems, path, p->name, err, err_size);
      hostview_close(m->k, m->kctx, p->data, view, bytes, !rc);
      if (rc)
        return -1;
      m->k->zero(m->kctx, p->data + t->n_elems, (p->n_elems - t->n_elems) * sizeof(real)); /* padding */
      continue;
    }
    /* split over the TP group: the whole stored tensor in host memory, then this rank's block of
     * it through a write-only host view of the parameter (every element of the block is written) */
    size_t whole_elems = (size_t)p->rows * (size_t)p->shape[1];
    real *whole = calloc(whole_elems, sizeof *whole);
    if (!whole)
      return errf(err, err_size, "init.from %s: out of memory reading '%s'", path, p->name);
    int rc = st_read_real(file, t, whole, t->n_elems, err, err_size);
    rc = rc ? rc : all_finite(whole, t->n_elems, path, p->name, err, err_size);
    if (!rc) {
      const size_t bytes = p->n_elems * sizeof(real);
      real *view = hostview_open(m->k, m->kctx, p->data, bytes, 0);
      if (!view)
        rc = errf(err, err_size, "init.from %s: out of host memory staging '%s'", path, p->name);
      else {
        model_param_take_block(p, whole, view);
        hostview_close(m->k, m->kctx, p->data, view, bytes, 1);
        m->bf16_fresh = 0; /* the bf16 copies are rounded again before the next forward */
      }
    }
    free(whole);
    if (rc)
      return -1;
  }
  return 0;
}

int weights_load(struct model *m, const char *path, char *err, size_t err_size)
{
  struct source s;
  memset(&s, 0, sizeof s);
  s.sharded = ends_with(path, ".json");
  char why[768];
  int rc = s.sharded ? st_index_open(&s.index, path, why, sizeof why)
                     : st_open(&s.file, path, why, sizeof why);
  if (rc != 0)
    errf(err, err_size, "init.from: %s", why);
  else
    rc = load_tensors(m, &s, path, err, err_size);
  if (s.sharded)
    st_index_close(&s.index);
  else
    st_close(&s.file);
  return rc;
}

/* Bytes of p's Hugging Face tensor: its stored elements up to the padding rows. */
static size_t export_bytes(const struct model_param *p)
{
  size_t n = (size_t)p->shape[0];
  if (p->n_dims == 2)
    n *= (size_t)p->shape[1];
  return n * sizeof(real);
}

int weights_export(const struct model *m, const char *path, char *err, size_t err_size)
{
  if (path_make_parent_dirs(path, err, err_size))
    return -1;
  struct st_write_tensor *w = calloc((size_t)m->n_params, sizeof *w);
  if (!w)
    return errf(err, err_size, "export %s: out of memory", path);
  /* Each parameter's Hugging Face elements through a read-only host view (padding rows come
   * last, so the first rows are the HF tensor and the view stops before the padding). The
   * writer takes every tensor at once, so every view is open until it returns. */
  int rc = 0, opened = 0;
  for (int i = 0; i < m->n_params; i++, opened++) {
    const struct model_param *p = &m->params[i];
    w[i].name = p->name;
    w[i].n_dims = p->n_dims;
    w[i].shape[0] = p->shape[0];
    w[i].shape[1] = p->shape[1];
    if (!p->data)
      continue; /* no data: the writer refuses it, naming the tensor */
    char why[FAULT_MSG_MAX]; /* none when the backend holds a failure: nothing is written */
    w[i].data = hostview_read(m->k, m->kctx, p->data, export_bytes(p), why, sizeof why);
    if (!w[i].data) {
      rc = errf(err, err_size, "export %s: '%s': %s", path, p->name, why);
      break;
    }
  }
  if (!rc)
    rc = st_write_f32(path, w, m->n_params, err, err_size);
  for (int i = 0; i < opened; i++)
    hostview_close(m->k, m->kctx, m->params[i].data, (void *)w[i].data, export_bytes(&m->params[i]), 0);
  free(w);
  return rc;
}
