/* Hugging Face safetensors in and out of the parameter table. Loading is strict: the model's
 * parameter set and the file's tensor set must be equal, with equal shapes, so a checkpoint of
 * another configuration fails at once with the name of the first tensor that disagrees. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/model/weights.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/hf.h"
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
      return errf_input(err, err_size, "init.from %s: tensor '%s' holds a non-finite value (%g at element %zu): "
                  "a run cannot start from these weights", path, name, (double)x[i], i);
  return 0;
}

static int load_tensors(struct model *m, const struct source *s, const char *path, char *err,
                        size_t err_size)
{
  for (int i = 0; i < source_count(s); i++) {
    const char *name = source_name(s, i);
    if (!model_find(m, name) && !ends_with(name, ".rotary_emb.inv_freq"))
      return errf_input(err, err_size, "init.from %s: tensor '%s' is not a parameter of this model "
                  "(check model.n_layers and model.tie_embeddings)", path, name);
  }
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    const struct st_file *file;
    const struct st_tensor *t = source_find(s, p->name, &file);
    if (!t)
      return errf_input(err, err_size, "init.from %s: tensor '%s' is missing", path, p->name);
    int same = t->n_dims == p->n_dims;
    for (int d = 0; same && d < p->n_dims; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
      char want[64], found[128];
      format_shape(want, sizeof want, p->n_dims, p->shape);
      format_shape(found, sizeof found, t->n_dims, t->shape);
      return errf_input(err, err_size, "init.from %s: tensor '%s' has shape %s, the model expects %s",
                  path, p->name, found, want);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16 && t->dtype != ST_F64)
      return errf_input(err, err_size, "init.from %s: tensor '%s' is %s; F32, F16, BF16 and F64 are read",
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

/* A number as short as prints it exactly, for messages. */
static void format_number(char *buf, size_t n, double v)
{
  snprintf(buf, n, "%g", v);
  if (strtod(buf, NULL) != v)
    snprintf(buf, n, "%.17g", v);
}

int weights_hf_config(const struct plan_model *m, struct hf_config *c, char *err, size_t err_size)
{
  if (m->moe.experts > 0 && m->moe.n_layers != m->n_layers)
    return errf(err, err_size, "%d of the model's %d layers are sparse (model.moe.layers): a Hugging Face Mixtral "
                "has every layer sparse and a Llama none", m->moe.n_layers, m->n_layers), 2;
  memset(c, 0, sizeof *c);
  c->n_layers = m->n_layers;
  c->dim = m->dim;
  c->n_heads = m->n_heads;
  c->n_kv_heads = m->n_kv_heads;
  c->ffn_dim = m->moe.experts > 0 ? m->moe.ffn_dim : m->ffn_dim;
  c->vocab = m->vocab;
  c->max_seq = m->max_seq;
  c->norm_eps = m->norm_eps;
  c->rope_theta = m->rope_theta;
  c->tie_embeddings = m->tie_embeddings;
  c->experts = m->moe.experts > 0 ? m->moe.experts : 0;
  c->top_k = c->experts ? m->moe.top_k : 0;
  c->aux_loss = c->experts ? m->moe.aux_loss : 0;
  return 0;
}

/* The plan's model against a folder's config.json: every field both have, the first that differs
 * refused with both values (2). */
static int config_check(const struct plan_model *m, const struct hf_config *c, const char *dir, char *err,
                        size_t err_size)
{
  const int sparse = m->moe.experts > 0;
  const struct { const char *plan, *hf; double mine, theirs; int is_bool; } f[] = {
    { "model.n_layers", "num_hidden_layers", m->n_layers, c->n_layers, 0 },
    { "model.dim", "hidden_size", m->dim, c->dim, 0 },
    { "model.n_heads", "num_attention_heads", m->n_heads, c->n_heads, 0 },
    { "model.n_kv_heads", "num_key_value_heads", m->n_kv_heads, c->n_kv_heads, 0 },
    { "model.moe.experts", "num_local_experts", sparse ? m->moe.experts : 0, c->experts, 0 },
    { "model.moe.top_k", "num_experts_per_tok", sparse ? m->moe.top_k : 0, c->top_k, 0 },
    { sparse ? "model.moe.ffn_dim" : "model.ffn_dim", "intermediate_size", sparse ? m->moe.ffn_dim : m->ffn_dim,
      c->ffn_dim, 0 },
    { "model.vocab", "vocab_size", m->vocab, c->vocab, 0 },
    { "model.rope_theta", "rope_theta", m->rope_theta, c->rope_theta, 0 },
    { "model.norm_eps", "rms_norm_eps", m->norm_eps, c->norm_eps, 0 },
    { "model.tie_embeddings", "tie_word_embeddings", m->tie_embeddings, c->tie_embeddings, 1 },
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    if (f[i].mine == f[i].theirs)
      continue;
    char mine[32], theirs[32];
    if (f[i].is_bool) {
      snprintf(mine, sizeof mine, "%s", f[i].mine ? "true" : "false");
      snprintf(theirs, sizeof theirs, "%s", f[i].theirs ? "true" : "false");
    } else {
      format_number(mine, sizeof mine, f[i].mine);
      format_number(theirs, sizeof theirs, f[i].theirs);
    }
    const char *sep = dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/";
    errf_input(err, err_size, "init.from %s: %s = %s in the plan, but %s%s" HF_CONFIG " has %s = %s", dir, f[i].plan, mine,
         dir, sep, f[i].hf, theirs);
    return 2;
  }
  return 0;
}

/* A folder's config checked against the model and its weights' file found: 0, 2 or -1. */
static int open_folder(const struct plan_model *m, const char *dir, char *weights, size_t n, char *err,
                       size_t err_size)
{
  struct hf_config c;
  char why[1024];
  int rc = hf_config_read(dir, &c, why, sizeof why);
  if (rc)
    return errf(err, err_size, "init.from %s: %s", dir, why), rc;
  if ((rc = config_check(m, &c, dir, err, err_size)) != 0)
    return rc;
  if ((rc = hf_weights_path(dir, weights, n, why, sizeof why)) != 0)
    return errf(err, err_size, "init.from %s", why), rc;
  return 0;
}

int weights_probe_hf(const struct plan_model *m, const char *dir, char *err, size_t err_size)
{
  struct hf_config c;
  char why[512], probe[4300];
  int rc = weights_hf_config(m, &c, why, sizeof why);
  if (rc)
    return errf(err, err_size, "export.format = \"hf\": %s", why), rc;
  if ((rc = hf_check_output("export.path", dir, err, err_size)) != 0)
    return rc;
  size_t len = strlen(dir);
  while (len > 1 && dir[len - 1] == '/')
    len--;
  /* DIR.tmp and DIR.old, made afresh by the export, must be removable as it will remove them (a
   * link, or a folder of export files): refused now, not after the steps */
  for (int i = 0; i < 2; i++) {
    struct stat st;
    snprintf(probe, sizeof probe, "%.*s.%s", (int)len, dir, i ? "old" : "tmp");
    if (lstat(probe, &st) == 0 && !S_ISLNK(st.st_mode) && (rc = hf_check_output("", probe, why, sizeof why)) != 0)
      return errf(err, err_size, "export.path %s: %s", dir, why), rc;
  }
  /* DIR.tmp is made beside DIR: the folder that holds it must take new files */
  snprintf(probe, sizeof probe, "%.*s.tycho-probe-%ld", (int)len, dir, (long)getpid());
  if (path_make_parent_dirs(probe, why, sizeof why))
    return errf(err, err_size, "export.path %s: %s", dir, why);
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return errf(err, err_size, "export.path %s: cannot create files beside it (%s): %s", dir, probe, strerror(errno));
  close(fd);
  unlink(probe);
  return 0;
}

int weights_check_from(const struct plan_model *m, const char *path, char *err, size_t err_size)
{
  char weights[4200];
  const char *file = path;
  int rc, fd;
  if (!path[0])
    return 0;
  if (hf_is_folder(path)) {
    if ((rc = open_folder(m, path, weights, sizeof weights, err, err_size)) != 0)
      return rc;
    file = weights;
  }
  rc = path_open_input("init.from", file, 0, &fd, NULL, err, err_size);
  if (rc == 0)
    close(fd);
  return rc == 2 ? 2 : 0; /* a missing file: its reader says so */
}

int weights_load(struct model *m, const char *path, char *err, size_t err_size)
{
  struct source s;
  memset(&s, 0, sizeof s);
  char folder_weights[4200];
  const char *file = path;
  if (hf_is_folder(path)) {
    if (open_folder(&m->config, path, folder_weights, sizeof folder_weights, err, err_size))
      return -1;
    file = folder_weights;
  }
  s.sharded = ends_with(file, ".json");
  char why[768];
  int rc = s.sharded ? st_index_open(&s.index, file, why, sizeof why)
                     : st_open(&s.file, file, why, sizeof why);
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

/* One writer for both forms: hf_shard_bytes 0, one file; else a Hugging Face folder. */
static int export_to(const struct model *m, const char *path, uint64_t hf_shard_bytes, const struct hf_extras *extras,
                     char *err, size_t err_size)
{
  struct hf_config c;
  if (hf_shard_bytes) {
    char why[512];
    if (weights_hf_config(&m->config, &c, why, sizeof why))
      return errf(err, err_size, "export %s: %s", path, why);
  }
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
  if (!rc && hf_shard_bytes)
    rc = hf_write_folder("export.path", path, &c, w, m->n_params, hf_shard_bytes, extras, err, err_size) ? -1 : 0;
  else if (!rc)
    rc = st_write_f32(path, w, m->n_params, err, err_size);
  for (int i = 0; i < opened; i++)
    hostview_close(m->k, m->kctx, m->params[i].data, (void *)w[i].data, export_bytes(&m->params[i]), 0);
  free(w);
  return rc;
}

int weights_export(const struct model *m, const char *path, char *err, size_t err_size)
{
  return export_to(m, path, 0, NULL, err, err_size);
}

int weights_export_hf(const struct model *m, const char *dir, uint64_t shard_bytes, const struct hf_extras *extras,
                      char *err, size_t err_size)
{
  return export_to(m, dir, shard_bytes ? shard_bytes : HF_DEFAULT_SHARD_BYTES, extras, err, err_size);
}
