/* Sharded checkpoints (ckpt.h has the format and its guarantees): the pieces a rank holds, the
 * synchronous save and the step folders' upkeep (partial writes, the oldest beyond keep). The
 * asynchronous save, loading, the in-memory replan and the ckpt command are in ckpt_async.c,
 * ckpt_load.c, ckpt_mem.c and ckpt_inspect.c; what they share is in ckpt_internal.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/state/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "runtime/state/ckpt_internal.h"
#include "runtime/model/hostview.h"
#include "runtime/train/train.h"
#include "util/err.h"
#include "util/file.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/path.h"
#include "util/strbuf.h"

/* The block a parameter holds on this rank, in the stored tensor's (rows, columns). */
void ckpt_param_block(const struct model_param *p, int64_t *r0, int64_t *c0, int64_t *rows,
                      int64_t *cols)
{
  *r0 = p->start[0];
  *rows = p->local[0];
  *c0 = p->n_dims == 2 ? p->start[1] : 0;
  *cols = p->n_dims == 2 ? p->local[1] : 1;
}

int ckpt_for_each_piece(struct trainer *t, int owner_only, ckpt_piece_fn fn, void *ctx)
{
  struct model *m = &t->model;
  struct dp *d = &t->dp;
  real *state[CKPT_N_KINDS] = { NULL, t->opt.m, t->opt.v };
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    if (!p->here || p->n_elems == 0)
      continue;
    if (owner_only && ((p->tp_dim < 0 && m->tp.rank != 0) || (p->kind == MODEL_EMBED && !m->embed_here)))
      continue;
    /* Saving stops at the tensor's last row: vocabulary padding rows (at the end of the last
     * vocab-split block) are not written. */
    int64_t r0, c0, rows, cols;
    ckpt_param_block(p, &r0, &c0, &rows, &cols);
    const int64_t real_rows = p->shape[0] - r0 < rows ? p->shape[0] - r0 : rows;
    const size_t tensor_end = real_rows > 0 ? (size_t)(real_rows * cols) : 0;
    for (int kind = 0; kind < CKPT_N_KINDS; kind++) {
      const int sharded = kind == CKPT_PARAM ? dp_master_sharded(d) : d->zero >= 1;
      if (!sharded) {
        if (owner_only && dp_bucket_rank(d, d->layout.param_bucket[i]) != 0)
          continue; /* written by one rank of those holding it */
        real *mem = kind == CKPT_PARAM ? p->data : state[kind] + p->offset;
        const size_t hi = owner_only ? tensor_end : p->n_elems;
        if (hi > 0 && fn(ctx, m, p, i, kind, 0, hi, mem))
          return -1;
        continue;
      }
      const struct dp_bucket *k = &d->layout.buckets[d->layout.param_bucket[i]];
      const size_t s0 = k->start + (size_t)dp_bucket_rank(d, d->layout.param_bucket[i]) * k->share, s1 = s0 + k->share;
      const size_t lo = p->offset > s0 ? p->offset : s0;
      size_t hi = p->offset + p->n_elems < s1 ? p->offset + p->n_elems : s1;
      if (owner_only && hi > p->offset + tensor_end)
        hi = p->offset + tensor_end;
      if (lo >= hi)
        continue;
      real *base = kind == CKPT_PARAM ? d->shard_params : state[kind];
      if (fn(ctx, m, p, i, kind, lo - p->offset, hi - p->offset, base + k->shard_offset + (lo - s0)))
        return -1;
    }
  }
  return 0;
}

/* ---- saving ---------------------------------------------------------------------------- */

int ckpt_write_piece(void *ctx, const struct model *m, const struct model_param *p, int index,
                     int kind, size_t lo, size_t hi, real *mem)
{
  struct writer *w = ctx;
  if (w->count_only) {
    w->n++;
    w->offset += (int64_t)((hi - lo) * sizeof(real));
    return 0;
  }
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    struct ckpt_piece *pieces = realloc(w->pieces, (size_t)cap * sizeof *pieces);
    if (!pieces)
      return errf(w->err, w->err_size, "out of memory listing checkpoint pieces");
    w->pieces = pieces;
    w->cap = cap;
  }
  const size_t bytes = (hi - lo) * sizeof(real);
  /* The piece's bytes through a read-only host view: checksummed and written from it (none when
   * the backend holds a failure: the save fails with it, and its folder goes). */
  char why[FAULT_MSG_MAX];
  const real *view = hostview_read(m->k, m->kctx, mem, bytes, why, sizeof why);
  if (!view)
    return errf(w->err, w->err_size, "checkpoint: the %s piece of %s for %s: %s", ckpt_kind_names[kind],
                p->name, w->path, why);
  struct ckpt_piece *q = &w->pieces[w->n++];
  ckpt_param_block(p, &q->r0, &q->c0, &q->rows, &q->cols);
  q->param = index;
  q->kind = kind;
  q->lo = (int64_t)lo;
  q->hi = (int64_t)hi;
  q->offset = w->offset;
  q->hash = (int64_t)hash_fnv1a64_bytes(view, bytes);
  q->rank = w->rank;
  const int failed = w->mem ? (memcpy(w->mem + w->offset, view, bytes), 0)
                            : file_write_all(w->fd, w->path, view, bytes, w->err, w->err_size);
  hostview_close(m->k, m->kctx, mem, (void *)view, bytes, 0);
  if (failed)
    return failed;
  w->offset += (int64_t)bytes;
  return 0;
}

void ckpt_step_folder(char *out, size_t n, const char *dir, long long step, int tmp)
{
  snprintf(out, n, "%s/step_%08lld%s", dir, step, tmp ? ".tmp" : "");
}

/* Removes the entry `name` of the folder open as parent_fd, never following a symbolic link: a link
 * (or any entry not a folder) is unlinked itself, never its target; a folder is emptied the
 * same way through a descriptor opened with O_NOFOLLOW, then removed. So a step folder that is a
 * link into another run's checkpoints loses the link, and that run keeps its files. 0, or -1
 * with errno (of the first failure). */
static int remove_at(int parent_fd, const char *name, int depth)
{
  if (!unlinkat(parent_fd, name, 0) || errno == ENOENT)
    return 0;
  if (errno != EISDIR && errno != EPERM) /* a folder: EISDIR (Linux), EPERM (POSIX) */
    return -1;
  if (depth >= 8) { /* a checkpoint holds plain files: deeper is not one of ours */
    errno = ELOOP;
    return -1;
  }
  int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR *dh = fd >= 0 ? fdopendir(fd) : NULL;
  if (!dh) {
    const int e = errno;
    if (fd >= 0)
      close(fd);
    errno = e;
    return -1;
  }
  int rc = 0, first = 0;
  struct dirent *e;
  while ((e = readdir(dh)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && remove_at(fd, e->d_name, depth + 1) && !rc)
      rc = -1, first = errno;
  closedir(dh);
  if (unlinkat(parent_fd, name, AT_REMOVEDIR) && !rc)
    rc = -1, first = errno;
  errno = first;
  return rc;
}

/* rm -r of a step folder, path = DIR/NAME: DIR (checkpoint.dir) is opened as given, NAME and
 * everything under it without following a link (remove_at). Missing: nothing to do. */
static int remove_folder(const char *path)
{
  char parent[4096];
  const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
  if (slash)
    snprintf(parent, sizeof parent, "%.*s", (int)(slash == path ? 1 : slash - path), path);
  else
    snprintf(parent, sizeof parent, ".");
  int parent_fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent_fd < 0)
    return errno == ENOENT ? 0 : -1;
  int rc = remove_at(parent_fd, name, 0);
  const int e = errno;
  close(parent_fd);
  errno = e;
  return rc;
}

/* Steps of the complete checkpoints in dir (step_N folders with a manifest), ascending. */
static int list_steps(const char *dir, long long **steps, int *n)
{
  *steps = NULL;
  *n = 0;
  DIR *dh = opendir(dir);
  if (!dh)
    return errno == ENOENT ? 0 : -1;
  int cap = 0;
  struct dirent *e;
  while ((e = readdir(dh))) {
    char *end;
    if (strncmp(e->d_name, "step_", 5))
      continue;
    long long s = strtoll(e->d_name + 5, &end, 10);
    if (end == e->d_name + 5 || *end || s < 0)
      continue; /* step_N.tmp and anything else */
    char manifest[4096];
    struct stat st;
    snprintf(manifest, sizeof manifest, "%s/%s/manifest.json", dir, e->d_name);
    if (stat(manifest, &st))
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      long long *more = realloc(*steps, (size_t)cap * sizeof *more);
      if (!more) {
        closedir(dh);
        return -1;
      }
      *steps = more;
    }
    (*steps)[(*n)++] = s;
  }
  closedir(dh);
  for (int a = 1; a < *n; a++) /* insertion sort: a handful of entries */
    for (int b = a; b > 0 && (*steps)[b - 1] > (*steps)[b]; b--) {
      long long x = (*steps)[b];
      (*steps)[b] = (*steps)[b - 1];
      (*steps)[b - 1] = x;
    }
  return 0;
}

int ckpt_remove_partial(const char *dir, FILE *out, char *err, size_t err_size)
{
  DIR *dh = opendir(dir);
  if (!dh)
    return errno == ENOENT ? 0 : errf(err, err_size, "checkpoint.dir %s: cannot list it: %s", dir, strerror(errno));
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(dh))) {
    const size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "step_", 5) || len < 9 || strcmp(e->d_name + len - 4, ".tmp"))
      continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(path, &st) || !S_ISDIR(st.st_mode))
      continue;
    if (remove_folder(path))
      rc = errf(err, err_size, "checkpoint.dir: cannot remove the partial checkpoint %s: %s", path, strerror(errno));
    else if (out)
      fprintf(out, "checkpoint: removed the partial %s (a write that did not finish)\n", path);
  }
  closedir(dh);
  if (out)
    fflush(out);
  return rc;
}

int ckpt_find_latest(const char *dir, char *path, size_t path_size, long long *step, char *err,
                     size_t err_size)
{
  long long *steps;
  int n;
  if (list_steps(dir, &steps, &n))
    return errf(err, err_size, "checkpoint.dir %s: cannot list it: %s", dir, strerror(errno)), -1;
  if (n == 0)
    return free(steps), 1;
  *step = steps[n - 1];
  ckpt_step_folder(path, path_size, dir, *step, 0);
  free(steps);
  return 0;
}

/* The text a resume compares for field i (plan.h, plan_resume_field): the plan's value, and
 * for a data file also its size, so a file replaced under the same name is caught. Returns the
 * parent the field follows, or -1. */
int ckpt_computes_value(const struct plan *p, int i, char *buf, size_t n)
{
  int follows = plan_resume_field(p, i, buf, n);
  const char *file = i == 5 ? p->data.train : i == 6 ? p->data.val : NULL;
  struct stat st;
  if (file && file[0] && !stat(file, &st)) {
    size_t used = strlen(buf);
    snprintf(buf + used, n - used, " (%lld bytes)", (long long)st.st_size);
  }
  return follows;
}

void ckpt_manifest_text(struct strbuf *b, const struct trainer *t, long long steps_done,
                        const struct ckpt_piece *all, int n_all, int world)
{
  const struct plan *p = t->plan;
  const struct model *m = &t->model;
  struct json j;
  json_init(&j, b);
  json_begin_object(&j);
  json_key(&j, "format");
  json_string(&j, "tycho-checkpoint");
  json_key(&j, "version");
  json_int(&j, CKPT_FORMAT_VERSION);
  json_key(&j, "step");
  json_int(&j, steps_done);
  char hash[32];
  snprintf(hash, sizeof hash, "%016" PRIx64, plan_hash(p));
  json_key(&j, "plan_hash");
  json_string(&j, hash);
  json_key(&j, "plan");
  json_string(&j, p->name[0] ? p->name : p->file);
  json_key(&j, "model");
  json_begin_object(&j);
  const struct plan_model *c = &p->model;
  const char *keys[] = { "n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab", "tie_embeddings",
                         "moe_experts", "moe_ffn_dim" };
  const int vals[] = { c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab, c->tie_embeddings,
                       c->moe.experts, c->moe.experts > 0 ? c->moe.ffn_dim : 0 };
  for (int i = 0; i < CKPT_MODEL_KEYS; i++) {
    json_key(&j, keys[i]);
    json_int(&j, vals[i]);
  }
  json_end_object(&j);
  json_key(&j, "mesh");
  json_begin_object(&j);
  const char *mkeys[] = { "world", "tp", "pp", "dp", "zero" };
  const int mvals[] = { world, p->mesh.tp, p->mesh.pp, p->mesh.dp, p->zero };
  for (int i = 0; i < 5; i++) {
    json_key(&j, mkeys[i]);
    json_int(&j, mvals[i]);
  }
  json_end_object(&j);
  /* The rest of the training state: windows, dropout masks, learning rate and bias correction
   * are functions of these and the step. */
  json_key(&j, "state");
  json_begin_object(&j);
  json_key(&j, "windows_done");
  json_int(&j, steps_done * p->batch.global);
  if (p->train.max_loss_jump > 0) { /* train.max_loss_jump's recent losses, so a resume decides alike */
    json_key(&j, "recent_losses");
    json_begin_array(&j);
    for (int i = 0; i < t->recent.n; i++)
      json_number(&j, t->recent.loss[i]);
    json_end_array(&j);
    json_key(&j, "skipped_in_a_row");
    json_int(&j, t->recent.skipped_in_a_row);
  }
  for (int s = 0; s < PLAN_N_SEEDS; s++) {
    char key[48];
    snprintf(key, sizeof key, "seed_%s", plan_seed_name((enum plan_seed)s));
    json_key(&j, key);
    json_int(&j, p->seeds.value[s]);
  }
  json_end_object(&j);
  /* What the run computes, as the plan says it (a resume compares: ckpt_load). */
  json_key(&j, "computes");
  json_begin_object(&j);
  for (int i = 0; i < PLAN_N_RESUME_FIELDS; i++) {
    char v[PLAN_PATH_MAX + 64];
    ckpt_computes_value(p, i, v, sizeof v);
    json_key(&j, plan_resume_field_name(i));
    json_string(&j, v);
  }
  json_end_object(&j);
  json_key(&j, "checksum");
  json_string(&j, "fnv1a64");
  json_key(&j, "files");
  json_begin_array(&j);
  for (int r = 0; r < world; r++) {
    char name[32];
    snprintf(name, sizeof name, "rank_%05d.bin", r);
    json_string(&j, name);
  }
  json_end_array(&j);
  json_key(&j, "tensors");
  json_begin_array(&j);
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *q = &m->params[i];
    json_begin_object(&j);
    json_key(&j, "name");
    json_string(&j, q->name);
    json_key(&j, "dtype");
    json_string(&j, tensor_dtype_name(q->dtype)); /* the build's: models refuse any other table */
    json_key(&j, "shape");
    json_begin_array(&j);
    for (int d = 0; d < q->n_dims; d++)
      json_int(&j, q->shape[d]);
    json_end_array(&j);
    json_key(&j, "pieces");
    json_begin_array(&j);
    for (int kind = 0; kind < CKPT_N_KINDS; kind++)
      for (int k = 0; k < n_all; k++) {
        const struct ckpt_piece *e = &all[k];
        if (e->param != i || e->kind != kind)
          continue;
        json_begin_object(&j);
        json_key(&j, "kind");
        json_string(&j, ckpt_kind_names[kind]);
        json_key(&j, "file");
        json_int(&j, e->rank);
        json_key(&j, "offset");
        json_int(&j, e->offset);
        json_key(&j, "block");
        json_begin_array(&j);
        json_int(&j, e->r0);
        json_int(&j, e->c0);
        json_int(&j, e->rows);
        json_int(&j, e->cols);
        json_end_array(&j);
        json_key(&j, "range");
        json_begin_array(&j);
        json_int(&j, e->lo);
        json_int(&j, e->hi);
        json_end_array(&j);
        char h[32];
        snprintf(h, sizeof h, "%016" PRIx64, (uint64_t)e->hash);
        json_key(&j, "fnv1a64");
        json_string(&j, h);
        json_end_object(&j);
      }
    json_end_array(&j);
    json_end_object(&j);
  }
  json_end_array(&j);
  json_end_object(&j);
  sb_puts(b, "\n");
}

/* Every rank's list of n pieces, all ranks' lists in rank order into *all (malloc'ed, *n_all
 * of them) on every rank. Collective over g (NULL: a copy); agreed: every rank returns the same
 * status, and *all is NULL on failure. */
int ckpt_gather_pieces(struct comm_group *g, const struct ckpt_piece *pieces, int n,
                       struct ckpt_piece **all_out, int *n_all_out, char *err, size_t err_size)
{
  const int world = g ? g->size : 1;
  *all_out = NULL;
  *n_all_out = 0;
  int64_t mine = n, most = n, *counts = malloc((size_t)world * sizeof *counts);
  int rc;
  if ((rc = comm_agree_err(g, counts ? 0 : errf(err, err_size, "checkpoint: out of memory for %d counts", world), err,
                       err_size, COMM_AGREE_NAME_RANK))) { /* before the gathers: no rank waits in one alone */
    free(counts);
    return rc;
  }
  if (world > 1) {
    if (comm_all_gather(g, &mine, counts, 1, COMM_INT64, NULL))
      rc = errf(err, err_size, "checkpoint: gathering the piece counts: %s", comm_error());
    for (int r = 0; !rc && r < world; r++)
      most = counts[r] > most ? counts[r] : most;
  } else {
    counts[0] = mine;
  }
  if ((rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK))) {
    free(counts);
    return rc;
  }
  size_t words = (size_t)most * PIECE_WORDS;
  int64_t *send = calloc(words ? words : 1, sizeof *send), *recv = calloc(words * (size_t)world + 1, sizeof *recv);
  struct ckpt_piece *all = malloc(((size_t)most * (size_t)world + 1) * sizeof *all);
  int oom = !send || !recv || !all;
  if (oom)
    errf(err, err_size, "checkpoint: out of memory gathering %lld pieces", (long long)most * world);
  if (comm_agree_err(g, oom, err, err_size, COMM_AGREE_NAME_RANK)) {
    free(send);
    free(recv);
    free(all);
    free(counts);
    return -1;
  }
  if (n > 0)
    memcpy(send, pieces, (size_t)n * sizeof *pieces);
  if (world > 1 && words > 0 && comm_all_gather(g, send, recv, words, COMM_INT64, NULL))
    rc = errf(err, err_size, "checkpoint: gathering the piece lists: %s", comm_error());
  if (world == 1)
    memcpy(recv, send, words * sizeof *send);
  int n_all = 0;
  for (int r = 0; !rc && r < world; r++)
    for (int64_t k = 0; k < counts[r]; k++)
      memcpy(&all[n_all++], recv + ((size_t)r * (size_t)most + (size_t)k) * PIECE_WORDS, sizeof *all);
  free(send);
  free(recv);
  free(counts);
  if ((rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK))) {
    free(all);
    return rc;
  }
  *all_out = all;
  *n_all_out = n_all;
  return 0;
}

/* A write that failed (agreed: no rank writes into tmp any more): rank 0 removes its folder. */
int ckpt_failed_write(int rank, const char *tmp, int rc)
{
  if (rank == 0)
    remove_folder(tmp);
  return rc;
}

/* Rank 0, once every rank's file is synced: the manifest (synced), the rename of tmp to final,
 * the sync of dir, then the removal of the oldest beyond `keep`. */
int ckpt_commit(const char *dir, const char *tmp, const char *final, int keep, const struct strbuf *b,
                char *err, size_t err_size)
{
  char file[4200], why[4400];
  int rc = 0;
  snprintf(file, sizeof file, "%s/manifest.json", tmp);
  if (b->failed)
    rc = errf(err, err_size, "checkpoint: out of memory writing the manifest");
  else if (file_write_synced(file, b->s, b->n, err, err_size))
    rc = -1;
  else if (file_sync_folder(tmp, why, sizeof why))
    rc = errf(err, err_size, "checkpoint: %s", why);
  else if ((remove_folder(final), rename(tmp, final)))
    rc = errf(err, err_size, "checkpoint: cannot rename %s to %s: %s", tmp, final, strerror(errno));
  else if (file_sync_folder(dir, why, sizeof why))
    rc = errf(err, err_size, "checkpoint: %s", why);
  /* Keep the newest `keep`. */
  long long *steps;
  int n;
  if (!rc && keep > 0 && !list_steps(dir, &steps, &n)) {
    for (int i = 0; i + keep < n; i++) {
      char old[4096];
      ckpt_step_folder(old, sizeof old, dir, steps[i], 0);
      if (remove_folder(old) && !rc)
        rc = errf(err, err_size, "checkpoint: cannot remove the old checkpoint %s: %s", old, strerror(errno));
    }
    free(steps);
  }
  return rc;
}

/* rank 0 makes dir/step_N.tmp afresh (agreed). */
int ckpt_prepare_tmp(struct comm_group *g, const char *tmp, char *err, size_t err_size)
{
  int rc = 0;
  if (!g || g->rank == 0) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/x", tmp);
    if (remove_folder(tmp) || path_make_parent_dirs(probe, err, err_size))
      rc = err[0] ? 1 : errf(err, err_size, "checkpoint: cannot prepare %s: %s", tmp, strerror(errno));
  }
  return comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK);
}

int ckpt_save(struct trainer *t, const char *dir, long long steps_done, int keep, char *err,
              size_t err_size)
{
  struct comm_group *g = t->world;
  const int rank = g ? g->rank : 0, world = g ? g->size : 1;
  char tmp[4096], final[4096], file[4200];
  err[0] = 0;
  ckpt_step_folder(tmp, sizeof tmp, dir, steps_done, 1);
  ckpt_step_folder(final, sizeof final, dir, steps_done, 0);
  int rc = ckpt_prepare_tmp(g, tmp, err, err_size);
  if (rc)
    return ckpt_failed_write(rank, tmp, rc);

  /* Every rank its shard file. */
  struct writer w = { .fd = -1, .path = file, .rank = rank, .err = err, .err_size = err_size };
  snprintf(file, sizeof file, "%s/rank_%05d.bin", tmp, rank);
  char why[4400];
  if (file_create(file, &w.fd, why, sizeof why))
    rc = errf(err, err_size, "checkpoint: %s", why);
  else if ((rc = ckpt_for_each_piece(t, 1, ckpt_write_piece, &w)) != 0)
    close(w.fd);
  else if (file_sync_close(w.fd, file, why, sizeof why))
    rc = errf(err, err_size, "checkpoint: %s", why);
  if ((rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK))) {
    free(w.pieces);
    return ckpt_failed_write(rank, tmp, rc);
  }

  /* Every rank's piece list to every rank (rank 0 writes the manifest). */
  struct ckpt_piece *all = NULL;
  int n_all = 0;
  rc = ckpt_gather_pieces(g, w.pieces, w.n, &all, &n_all, err, err_size);
  free(w.pieces);
  if (rc)
    return ckpt_failed_write(rank, tmp, rc);

  if (!rc && rank == 0) {
    struct strbuf b;
    sb_init(&b);
    ckpt_manifest_text(&b, t, steps_done, all, n_all, world);
    rc = ckpt_commit(dir, tmp, final, keep, &b, err, err_size);
    sb_free(&b);
  }
  free(all);
  rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK);
  return rc ? ckpt_failed_write(rank, tmp, rc) : 0;
}
