/* Sharded checkpoints: see ckpt.h for the format and its guarantees. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "runtime/alloc.h"
#include "runtime/hostview.h"
#include "runtime/train.h"
#include "util/err.h"

#include "runtime/manifest.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/path.h"
#include "util/strbuf.h"

/* A piece: elements [lo, hi) (row-major) of the block (r0, c0, rows, cols) of one tensor. */
struct ckpt_piece {
  int64_t param, kind, r0, c0, rows, cols, lo, hi, offset, hash, rank;
};
#define PIECE_WORDS 11

/* The block a parameter holds on this rank, in the stored tensor's (rows, columns). */
static void param_block(const struct model_param *p, int64_t *r0, int64_t *c0, int64_t *rows,
                        int64_t *cols)
{
  *r0 = p->start[0];
  *rows = p->local[0];
  *c0 = p->n_dims == 2 ? p->start[1] : 0;
  *cols = p->n_dims == 2 ? p->local[1] : 1;
}

/* Calls fn for every (parameter, kind, element range of its block) this rank holds, with the
 * memory of the range's first element: the backend's memory of model m (parameters, shards and
 * AdamW's moments all live there), which fn reads or writes only through a host view
 * (hostview.h) on m->k, m->kctx. owner_only: only the ranges this rank writes (each element of
 * the model once over the job, padding rows left out). */
typedef int (*piece_fn)(void *ctx, const struct model *m, const struct model_param *p, int index,
                        int kind, size_t lo, size_t hi, real *mem);

static int for_each_piece(struct trainer *t, int owner_only, piece_fn fn, void *ctx)
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
    param_block(p, &r0, &c0, &rows, &cols);
    const int64_t real_rows = p->shape[0] - r0 < rows ? p->shape[0] - r0 : rows;
    const size_t tensor_end = real_rows > 0 ? (size_t)(real_rows * cols) : 0;
    for (int kind = 0; kind < CKPT_N_KINDS; kind++) {
      const int sharded = kind == CKPT_PARAM ? d->zero == 3 : d->zero >= 1;
      if (!sharded) {
        if (owner_only && dp_bucket_rank(d, d->layout.param_bucket[i]) != 0)
          continue; /* written by one rank of those holding it */
        real *mem = kind == CKPT_PARAM ? p->data : state[kind] + p->offset;
        const size_t hi = owner_only ? tensor_end : p->n_elems;
        if (hi > 0 && fn(ctx, m, p, i, kind, 0, hi, mem))
          return 1;
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
        return 1;
    }
  }
  return 0;
}

/* ---- saving ---------------------------------------------------------------------------- */

/* Where the pieces go: the file fd, or (mem non-NULL) memory at mem + offset; count_only lists
 * nothing and copies nothing, it only counts the pieces (n) and their bytes (offset). */
struct writer {
  int fd;
  const char *path;
  int64_t offset, rank;
  struct ckpt_piece *pieces;
  int n, cap;
  char *mem;
  int count_only;
  char *err;
  size_t err_size;
};

static int write_all(int fd, const void *buf, size_t n)
{
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int write_piece(void *ctx, const struct model *m, const struct model_param *p, int index,
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
  /* The piece's bytes through a read-only host view: checksummed and written from it. */
  const real *view = hostview_open(m->k, m->kctx, mem, bytes, 1);
  if (!view)
    return errf(w->err, w->err_size, "out of host memory staging the %s piece of %s for %s",
                ckpt_kind_names[kind], p->name, w->path);
  struct ckpt_piece *q = &w->pieces[w->n++];
  param_block(p, &q->r0, &q->c0, &q->rows, &q->cols);
  q->param = index;
  q->kind = kind;
  q->lo = (int64_t)lo;
  q->hi = (int64_t)hi;
  q->offset = w->offset;
  q->hash = (int64_t)hash_fnv1a64_bytes(view, bytes);
  q->rank = w->rank;
  const int failed = w->mem ? (memcpy(w->mem + w->offset, view, bytes), 0) : write_all(w->fd, view, bytes);
  const int e = errno;
  hostview_close(m->k, m->kctx, mem, (void *)view, bytes, 0);
  if (failed)
    return errf(w->err, w->err_size, "cannot write %s: %s", w->path, strerror(e));
  w->offset += (int64_t)bytes;
  return 0;
}

static int fsync_path(const char *path, int directory)
{
  int fd = open(path, directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0)
    return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

static void step_folder(char *out, size_t n, const char *dir, long long step, int tmp)
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
  step_folder(path, path_size, dir, *step, 0);
  free(steps);
  return 0;
}

/* The text a resume compares for field i (plan.h, plan_resume_field): the plan's value, and
 * for a data file also its size, so a file replaced under the same name is caught. Returns the
 * parent the field follows, or -1. */
static int computes_value(const struct plan *p, int i, char *buf, size_t n)
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

static void manifest_text(struct strbuf *b, const struct trainer *t, long long steps_done,
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
    computes_value(p, i, v, sizeof v);
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

static int write_file_synced(const char *path, const char *text, size_t n, char *err, size_t err_size)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return errf(err, err_size, "cannot create %s: %s", path, strerror(errno));
  if (write_all(fd, text, n) || fsync(fd)) {
    int e = errno;
    close(fd);
    return errf(err, err_size, "cannot write %s: %s", path, strerror(e));
  }
  if (close(fd))
    return errf(err, err_size, "cannot write %s: %s", path, strerror(errno));
  return 0;
}

/* The lowest failing rank's status and message on every rank. */
static int agree(struct comm_group *g, int status, char *err, size_t n)
{
  int agreed = comm_agree_err(g, status, err, n, 1);
  return agreed < 0 ? 1 : agreed;
}

/* Every rank's list of n pieces, all ranks' lists in rank order into *all (malloc'ed, *n_all
 * of them) on every rank. Collective over g (NULL: a copy); agreed: every rank returns the same
 * status, and *all is NULL on failure. */
static int gather_pieces(struct comm_group *g, const struct ckpt_piece *pieces, int n,
                         struct ckpt_piece **all_out, int *n_all_out, char *err, size_t err_size)
{
  const int world = g ? g->size : 1;
  *all_out = NULL;
  *n_all_out = 0;
  int64_t mine = n, most = n, *counts = malloc((size_t)world * sizeof *counts);
  int rc;
  if ((rc = agree(g, counts ? 0 : errf(err, err_size, "checkpoint: out of memory for %d counts", world), err,
                  err_size))) { /* before the gathers: no rank waits in one alone */
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
  if ((rc = agree(g, rc, err, err_size))) {
    free(counts);
    return rc;
  }
  size_t words = (size_t)most * PIECE_WORDS;
  int64_t *send = calloc(words ? words : 1, sizeof *send), *recv = calloc(words * (size_t)world + 1, sizeof *recv);
  struct ckpt_piece *all = malloc(((size_t)most * (size_t)world + 1) * sizeof *all);
  int oom = !send || !recv || !all;
  if (oom)
    errf(err, err_size, "checkpoint: out of memory gathering %lld pieces", (long long)most * world);
  if (agree(g, oom, err, err_size)) {
    free(send);
    free(recv);
    free(all);
    free(counts);
    return 1;
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
  if ((rc = agree(g, rc, err, err_size))) {
    free(all);
    return rc;
  }
  *all_out = all;
  *n_all_out = n_all;
  return 0;
}

/* A write that failed (agreed: no rank writes into tmp any more): rank 0 removes its folder. */
static int failed_write(int rank, const char *tmp, int rc)
{
  if (rank == 0)
    remove_folder(tmp);
  return rc;
}

/* Rank 0, once every rank's file is synced: the manifest (synced), the rename of tmp to final,
 * the sync of dir, then the removal of the oldest beyond `keep`. */
static int commit(const char *dir, const char *tmp, const char *final, int keep, const struct strbuf *b,
                  char *err, size_t err_size)
{
  char file[4200];
  int rc = 0;
  snprintf(file, sizeof file, "%s/manifest.json", tmp);
  if (b->failed)
    rc = errf(err, err_size, "checkpoint: out of memory writing the manifest");
  else if (write_file_synced(file, b->s, b->n, err, err_size))
    rc = 1;
  else if (fsync_path(tmp, 1))
    rc = errf(err, err_size, "checkpoint: cannot sync %s: %s", tmp, strerror(errno));
  else if ((remove_folder(final), rename(tmp, final)))
    rc = errf(err, err_size, "checkpoint: cannot rename %s to %s: %s", tmp, final, strerror(errno));
  else if (fsync_path(dir, 1))
    rc = errf(err, err_size, "checkpoint: cannot sync %s: %s", dir, strerror(errno));
  /* Keep the newest `keep`. */
  long long *steps;
  int n;
  if (!rc && keep > 0 && !list_steps(dir, &steps, &n)) {
    for (int i = 0; i + keep < n; i++) {
      char old[4096];
      step_folder(old, sizeof old, dir, steps[i], 0);
      if (remove_folder(old) && !rc)
        rc = errf(err, err_size, "checkpoint: cannot remove the old checkpoint %s: %s", old, strerror(errno));
    }
    free(steps);
  }
  return rc;
}

/* rank 0 makes dir/step_N.tmp afresh (agreed). */
static int prepare_tmp(struct comm_group *g, const char *tmp, char *err, size_t err_size)
{
  int rc = 0;
  if (!g || g->rank == 0) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/x", tmp);
    if (remove_folder(tmp) || path_make_parent_dirs(probe, err, err_size))
      rc = err[0] ? 1 : errf(err, err_size, "checkpoint: cannot prepare %s: %s", tmp, strerror(errno));
  }
  return agree(g, rc, err, err_size);
}

int ckpt_save(struct trainer *t, const char *dir, long long steps_done, int keep, char *err,
              size_t err_size)
{
  struct comm_group *g = t->world;
  const int rank = g ? g->rank : 0, world = g ? g->size : 1;
  char tmp[4096], final[4096], file[4200];
  err[0] = 0;
  step_folder(tmp, sizeof tmp, dir, steps_done, 1);
  step_folder(final, sizeof final, dir, steps_done, 0);
  int rc = prepare_tmp(g, tmp, err, err_size);
  if (rc)
    return failed_write(rank, tmp, rc);

  /* Every rank its shard file. */
  struct writer w = { .fd = -1, .path = file, .rank = rank, .err = err, .err_size = err_size };
  snprintf(file, sizeof file, "%s/rank_%05d.bin", tmp, rank);
  w.fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (w.fd < 0)
    rc = errf(err, err_size, "checkpoint: cannot create %s: %s", file, strerror(errno));
  else {
    rc = for_each_piece(t, 1, write_piece, &w);
    if (!rc && fsync(w.fd))
      rc = errf(err, err_size, "checkpoint: cannot sync %s: %s", file, strerror(errno));
    if (close(w.fd) && !rc)
      rc = errf(err, err_size, "checkpoint: cannot write %s: %s", file, strerror(errno));
  }
  if ((rc = agree(g, rc, err, err_size))) {
    free(w.pieces);
    return failed_write(rank, tmp, rc);
  }

  /* Every rank's piece list to every rank (rank 0 writes the manifest). */
  struct ckpt_piece *all = NULL;
  int n_all = 0;
  rc = gather_pieces(g, w.pieces, w.n, &all, &n_all, err, err_size);
  free(w.pieces);
  if (rc)
    return failed_write(rank, tmp, rc);

  if (!rc && rank == 0) {
    struct strbuf b;
    sb_init(&b);
    manifest_text(&b, t, steps_done, all, n_all, world);
    rc = commit(dir, tmp, final, keep, &b, err, err_size);
    sb_free(&b);
  }
  free(all);
  rc = agree(g, rc, err, err_size);
  return rc ? failed_write(rank, tmp, rc) : 0;
}

/* ---- checkpoint.async: a snapshot now, the files written on a thread ---------------------- */

struct ckpt_async {
  char dir[4096], tmp[4096], final[4096], file[4200];
  long long step;
  int keep;
  char *snapshot;      /* this rank's pieces, back to back (alloc: ALLOC_CHECKPOINT) */
  size_t bytes;        /* of them written */
  struct strbuf manifest; /* rank 0 */
  pthread_t thread;
  int running;         /* the thread was started and not yet joined */
  int done;            /* set by the thread (atomic) when it has synced and closed the file */
  int status;          /* the thread's: 0, or an errno */
  const char *failed_call; /* "write", "fsync", "close" or "create" */
  double started;
};

size_t ckpt_snapshot_elems(size_t layout_elems, size_t shard_elems, int zero)
{
  const size_t params = zero < 3 ? layout_elems : shard_elems, state = zero == 0 ? layout_elems : shard_elems;
  return params + 2 * state;
}

static void *async_writer(void *arg)
{
  struct ckpt_async *a = arg;
  int fd = open(a->file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    a->status = errno, a->failed_call = "create";
  else {
    if (write_all(fd, a->snapshot, a->bytes))
      a->status = errno ? errno : EIO, a->failed_call = "write";
    else if (fsync(fd))
      a->status = errno, a->failed_call = "sync";
    if (close(fd) && !a->status)
      a->status = errno, a->failed_call = "write";
  }
  __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void async_free(struct trainer *t)
{
  struct ckpt_async *a = t->ckpt_pending;
  if (!a)
    return;
  alloc_free(a->snapshot);
  sb_free(&a->manifest);
  free(a);
  t->ckpt_pending = NULL;
}

int ckpt_save_async(struct trainer *t, const char *dir, long long steps_done, int keep, char *err,
                    size_t err_size)
{
  struct comm_group *g = t->world;
  const int rank = g ? g->rank : 0, world = g ? g->size : 1;
  err[0] = 0;
  if (t->ckpt_pending)
    return errf(err, err_size, "checkpoint: step %lld's is still being written", t->ckpt_pending->step);
  struct ckpt_async *a = calloc(1, sizeof *a);
  int rc = agree(g, a ? 0 : errf(err, err_size, "checkpoint: out of memory"), err, err_size);
  if (rc)
    return free(a), rc;
  t->ckpt_pending = a;
  snprintf(a->dir, sizeof a->dir, "%s", dir);
  step_folder(a->tmp, sizeof a->tmp, dir, steps_done, 1);
  step_folder(a->final, sizeof a->final, dir, steps_done, 0);
  snprintf(a->file, sizeof a->file, "%s/rank_%05d.bin", a->tmp, rank);
  a->step = steps_done;
  a->keep = keep;
  a->started = comm_now();
  sb_init(&a->manifest);
  if ((rc = prepare_tmp(g, a->tmp, err, err_size))) {
    failed_write(rank, a->tmp, rc);
    return async_free(t), rc;
  }
  /* The snapshot: sized for the rank's whole state (its parameters and AdamW's moments, as the
   * memory bill counts it), the most any rank of its stage writes; a rank that owns less fills
   * part of it (the rest is never touched). */
  struct writer w = { .fd = -1, .path = a->file, .rank = rank, .count_only = 1, .err = err, .err_size = err_size };
  for_each_piece(t, 1, write_piece, &w);
  const size_t need = (size_t)w.offset,
               billed = ckpt_snapshot_elems(t->dp.layout.n_elems, t->dp.layout.n_shard, t->dp.zero) * sizeof(real);
  a->bytes = need;
  a->snapshot = alloc_host_bytes(ALLOC_CHECKPOINT, need > billed ? need : billed);
  if (!a->snapshot)
    rc = errf(err, err_size, "checkpoint: out of memory for the %.1f MiB async snapshot (checkpoint.async)",
              (double)billed / 1048576.0);
  w = (struct writer){ .fd = -1, .path = a->file, .rank = rank, .mem = a->snapshot, .err = err, .err_size = err_size };
  if (!rc)
    rc = for_each_piece(t, 1, write_piece, &w);
  if ((rc = agree(g, rc, err, err_size))) {
    free(w.pieces);
    failed_write(rank, a->tmp, rc);
    return async_free(t), rc;
  }
  struct ckpt_piece *all = NULL;
  int n_all = 0;
  rc = gather_pieces(g, w.pieces, w.n, &all, &n_all, err, err_size);
  free(w.pieces);
  if (rc) {
    failed_write(rank, a->tmp, rc);
    return async_free(t), rc;
  }
  if (rank == 0) {
    manifest_text(&a->manifest, t, steps_done, all, n_all, world);
    if (a->manifest.failed)
      rc = errf(err, err_size, "checkpoint: out of memory writing the manifest");
  }
  free(all);
  if (!rc) {
    int e = pthread_create(&a->thread, NULL, async_writer, a);
    if (e)
      rc = errf(err, err_size, "checkpoint: cannot start the writer thread: %s", strerror(e));
    else
      a->running = 1;
  }
  if ((rc = agree(g, rc, err, err_size))) {
    /* a writer that started on this rank writes on: wait for it before removing its folder */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", a->tmp);
    ckpt_async_abandon(t);
    failed_write(rank, tmp, rc);
    return rc;
  }
  return 0;
}

enum { ASYNC_FAILED = 2, ASYNC_BUSY = 3 };

int ckpt_async_poll(struct trainer *t, int wait, long long *committed, double *seconds, char *err,
                    size_t err_size)
{
  struct ckpt_async *a = t->ckpt_pending;
  *committed = -1;
  if (!a)
    return 0;
  struct comm_group *g = t->world;
  const int rank = g ? g->rank : 0;
  err[0] = 0;
  const int done = wait || __atomic_load_n(&a->done, __ATOMIC_ACQUIRE);
  if (done && a->running) {
    pthread_join(a->thread, NULL);
    a->running = 0;
  }
  int state = 0;
  if (!done)
    state = ASYNC_BUSY;
  else if (a->status) {
    errf(err, err_size, "checkpoint: cannot %s %s: %s", a->failed_call, a->file, strerror(a->status));
    state = ASYNC_FAILED;
  }
  int agreed = agree(g, state, err, err_size);
  if (agreed == ASYNC_BUSY)
    return 0; /* a rank is still writing (never when waiting): asked again after the next step */
  if (!agreed) /* every rank's file is synced: rank 0 commits */
    agreed = agree(g, rank == 0 ? commit(a->dir, a->tmp, a->final, a->keep, &a->manifest, err, err_size) : 0,
                   err, err_size);
  if (agreed) {
    failed_write(rank, a->tmp, agreed);
    async_free(t);
    return 1;
  }
  *committed = a->step;
  *seconds = comm_now() - a->started;
  async_free(t);
  return 0;
}

void ckpt_async_abandon(struct trainer *t)
{
  struct ckpt_async *a = t->ckpt_pending;
  if (!a)
    return;
  if (a->running)
    pthread_join(a->thread, NULL);
  a->running = 0;
  async_free(t);
}

/* ---- reading ---------------------------------------------------------------------------- */

/* The checkpoint at path: path/manifest.json, or, when path holds step_N folders, the newest.
 * Read and checked by the one manifest reader (manifest.h). mf is to be freed either way. */
static int manifest_open(struct manifest *mf, const char *path, char *err, size_t err_size)
{
  char file[4200], latest[4096];
  struct stat st;
  memset(mf, 0, sizeof *mf);
  snprintf(file, sizeof file, "%s/manifest.json", path);
  if (stat(file, &st) && errno == ENOENT) {
    long long step;
    int found = ckpt_find_latest(path, latest, sizeof latest, &step, err, err_size);
    if (found < 0)
      return 1;
    if (found > 0)
      return errf(err, err_size, "%s: not a checkpoint (no manifest.json) and holds no step_N checkpoint", path);
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
    return errf(ld->err, ld->err_size, "checkpoint %s: has no tensor %s", mf->path, p->name);
  const int64_t s1 = p->n_dims == 2 ? p->shape[1] : 1;
  if (tt->n_dims != p->n_dims || tt->shape[0] != p->shape[0] || tt->shape[1] != s1)
    return errf(ld->err, ld->err_size, "checkpoint %s: tensor %s has shape [%lld, %lld], the plan's model [%lld, %lld]",
                mf->path, p->name, (long long)tt->shape[0], (long long)tt->shape[1], (long long)p->shape[0], (long long)s1);
  int64_t r0, c0, rows, cols;
  param_block(p, &r0, &c0, &rows, &cols);
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
      return 1;
    }
    copied += copy_overlap(view, r0, c0, rows, cols, (int64_t)lo, (int64_t)hi, sp, src, p->shape[0]);
  }
  for (size_t e = 0; e < hi - lo; e++) /* a diverged state would fail at the first step, blamed on the lr */
    if (!isfinite((double)view[e])) {
      const double v = (double)view[e];
      hostview_close(m->k, m->kctx, mem, view, bytes, 1);
      return errf(ld->err, ld->err_size, "checkpoint %s: the %s of %s holds %s (element %zu of this rank's "
                  "range): the run that saved it had diverged; resume from an earlier checkpoint",
                  mf->path, ckpt_kind_names[kind], p->name, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", lo + e);
    }
  hostview_close(m->k, m->kctx, mem, view, bytes, 1);
  const int64_t want = range_count(r0, rows, cols, (int64_t)lo, (int64_t)hi, p->shape[0]);
  if (copied != want)
    return errf(ld->err, ld->err_size, "checkpoint %s: the %s pieces of %s cover %lld of the %lld elements "
                "this rank needs", mf->path, ckpt_kind_names[kind], p->name, (long long)copied, (long long)want);
  return 0;
}

static void model_values(const struct plan_model *c, long long vals[CKPT_MODEL_KEYS])
{
  const int v[CKPT_MODEL_KEYS] = { c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab,
                                   c->tie_embeddings, c->moe.experts, c->moe.experts > 0 ? c->moe.ffn_dim : 0 };
  for (int i = 0; i < CKPT_MODEL_KEYS; i++)
    vals[i] = v[i];
}

/* The model check, then every piece t holds copied from the manifest's pieces, then the step. */
static int load_manifest(struct trainer *t, struct manifest *mf, char *err, size_t err_size)
{
  long long vals[CKPT_MODEL_KEYS];
  model_values(&t->plan->model, vals);
  for (int i = 0; i < CKPT_MODEL_KEYS; i++)
    if (mf->model[i] != vals[i])
      return errf(err, err_size, "checkpoint %s: its model has %s = %lld, the plan's %lld", mf->path,
                  ckpt_model_keys[i], mf->model[i], vals[i]);
  struct loader ld = { mf, err, err_size };
  t->model.bf16_fresh = 0; /* bf16 models: the copies are rounded again before the next forward */
  if (for_each_piece(t, 0, load_piece, &ld))
    return 1;
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
          return errf(err, err_size, "checkpoint %s: state.recent_losses holds a non-number", mf->path);
      if (!get_int(j, mf->state, "skipped_in_a_row", &in_a_row))
        t->recent.skipped_in_a_row = (int)in_a_row;
    }
  }
  return 0;
}

/* A resume continues the run the checkpoint saved: each field of what the run computes must be
 * as the checkpoint recorded it, unless the plan's checkpoint.allow_changes names it (or the
 * parent it follows). 0 ok; 2 with a message naming every changed field. */
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
    int follows = computes_value(p, i, v, sizeof v);
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
    rc = 2;
  }
  sb_free(&lines);
  sb_free(&names);
  return rc;
}

int ckpt_load(struct trainer *t, const char *path, char *err, size_t err_size)
{
  struct manifest mf;
  int rc = manifest_open(&mf, path, err, err_size);
  if (!rc)
    rc = check_computes(t->plan, &mf, err, err_size);
  if (!rc)
    rc = load_manifest(t, &mf, err, err_size);
  manifest_free(&mf);
  return rc;
}

/* ---- in memory: the state a replan moves (ckpt.h, train.h trainer_replan) -------------------- */

struct ckpt_mem {
  struct manifest mf;  /* in_memory: "file" r is rank r's segment of data */
  real *data;          /* every rank's pieces, rank after rank (the allocator's, "comm") */
  size_t bytes;
};

void ckpt_mem_free(struct ckpt_mem *cm)
{
  if (!cm)
    return;
  alloc_free(cm->data);
  manifest_free(&cm->mf);
  free(cm);
}

size_t ckpt_mem_bytes(const struct ckpt_mem *cm)
{
  return cm ? cm->bytes : 0;
}

/* The manifest of the gathered pieces: tensors named and shaped as t's parameter table (the
 * same on every rank), "files" the ranks' segments of cm->data. Local; 0 or out of memory. */
static int mem_manifest(struct ckpt_mem *cm, const struct trainer *t, const struct ckpt_piece *all, int n_all,
                        const int64_t *seg_bytes, int world, char *err, size_t err_size)
{
  struct manifest *mf = &cm->mf;
  const struct model *m = &t->model;
  memset(mf, 0, sizeof *mf);
  mf->in_memory = 1;
  mf->computes = -1;
  mf->state = -1;
  snprintf(mf->path, sizeof mf->path, "in memory (replan)");
  snprintf(mf->plan, sizeof mf->plan, "%.200s", t->plan->name[0] ? t->plan->name : t->plan->file);
  snprintf(mf->plan_hash, sizeof mf->plan_hash, "%016" PRIx64, plan_hash(t->plan));
  mf->step = t->step;
  mf->world = world;
  const int mesh[4] = { t->plan->mesh.tp, t->plan->mesh.pp, t->plan->mesh.dp, t->plan->zero };
  for (int i = 0; i < 4; i++)
    mf->mesh[i] = mesh[i];
  model_values(&t->plan->model, mf->model);
  /* the names: parameters', then "rank R" per segment, in one block (text) */
  size_t text = 0;
  for (int i = 0; i < m->n_params; i++)
    text += strlen(m->params[i].name) + 1;
  text += (size_t)world * 24;
  mf->text = malloc(text);
  mf->n_files = world;
  mf->files = calloc((size_t)world + 1, sizeof *mf->files);
  mf->maps = calloc((size_t)world + 1, sizeof *mf->maps);
  mf->n_tensors = m->n_params;
  mf->tensors = calloc((size_t)m->n_params + 1, sizeof *mf->tensors);
  if (!mf->text || !mf->files || !mf->maps || !mf->tensors)
    return errf(err, err_size, "replan: out of memory for the table of %d tensors", m->n_params);
  char *s = mf->text;
  size_t at = 0;
  for (int r = 0; r < world; r++) {
    mf->files[r] = s;
    s += snprintf(s, 24, "rank %d", r) + 1;
    mf->maps[r].map = (char *)cm->data + at;
    mf->maps[r].bytes = (size_t)seg_bytes[r];
    mf->maps[r].opened = 1;
    at += (size_t)seg_bytes[r];
  }
  for (int k = 0; k < n_all; k++)
    if (all[k].param < 0 || all[k].param >= m->n_params || all[k].kind < 0 || all[k].kind >= CKPT_N_KINDS ||
        all[k].rank < 0 || all[k].rank >= world)
      return errf(err, err_size, "replan: piece %d names parameter %lld, kind %lld, rank %lld: not this model's", k,
                  (long long)all[k].param, (long long)all[k].kind, (long long)all[k].rank);
    else
      mf->tensors[all[k].param].n_pieces++;
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    struct manifest_tensor *tt = &mf->tensors[i];
    size_t len = strlen(p->name) + 1;
    memcpy(s, p->name, len);
    tt->name = s;
    s += len;
    tt->n_dims = p->n_dims;
    tt->shape[0] = p->shape[0];
    tt->shape[1] = p->n_dims == 2 ? p->shape[1] : 1;
    tt->pieces = calloc((size_t)tt->n_pieces + 1, sizeof *tt->pieces);
    if (!tt->pieces)
      return errf(err, err_size, "replan: out of memory for the pieces of %s", p->name);
    tt->n_pieces = 0;
  }
  for (int k = 0; k < n_all; k++) {
    const struct ckpt_piece *e = &all[k];
    struct manifest_tensor *tt = &mf->tensors[e->param];
    struct manifest_piece *sp = &tt->pieces[tt->n_pieces++];
    sp->kind = (int)e->kind;
    sp->file = (int)e->rank;
    sp->offset = e->offset;
    sp->r0 = e->r0, sp->c0 = e->c0, sp->rows = e->rows, sp->cols = e->cols;
    sp->lo = e->lo, sp->hi = e->hi;
    sp->hash = (uint64_t)e->hash;
  }
  return 0;
}

/* Broadcasts of at most this many elements (MPI's counts are ints). */
#define MEM_CHUNK_ELEMS ((size_t)1 << 28)

int ckpt_mem_gather(struct trainer *t, size_t max_bytes, struct ckpt_mem **out, char *err, size_t err_size)
{
  struct comm_group *g = t->world;
  const int rank = g ? g->rank : 0, world = g ? g->size : 1;
  *out = NULL;
  err[0] = 0;
  /* 1. What this rank holds (the pieces ckpt_save would write): counted, then every rank's size. */
  struct ckpt_mem *cm = calloc(1, sizeof *cm);
  int64_t *seg = calloc((size_t)world + 1, sizeof *seg);
  struct writer w = { .fd = -1, .path = "memory", .rank = rank, .count_only = 1, .err = err, .err_size = err_size };
  int rc = !cm || !seg ? errf(err, err_size, "replan: out of memory") : for_each_piece(t, 1, write_piece, &w);
  const int64_t mine = w.offset;
  if (!(rc = agree(g, rc, err, err_size))) {
    if (world > 1 && comm_all_gather(g, &mine, seg, 1, COMM_INT64, NULL))
      rc = errf(err, err_size, "replan: gathering the state's sizes: %s", comm_error());
    else if (world == 1)
      seg[0] = mine;
    rc = agree(g, rc, err, err_size);
  }
  /* 2. Room for all of it on every rank, within the bound. */
  size_t total = 0, offset = 0;
  for (int r = 0; !rc && r < world; r++) {
    total += (size_t)seg[r];
    offset += r < rank ? (size_t)seg[r] : 0;
  }
  const double mib = 1024.0 * 1024.0;
  if (!rc && max_bytes && total > max_bytes)
    rc = errf(err, err_size, "replan: moving the training state (master weights and AdamW's two moments) "
              "needs %zu bytes (%.2f MiB) on every rank, more than the bound of %zu bytes (%.2f MiB; "
              "TYCHO_REPLAN_LIMIT_MB sets it); save a checkpoint and resume on the new layout instead",
              total, total / mib, max_bytes, max_bytes / mib);
  else if (!rc && !(cm->data = alloc_host_bytes(ALLOC_COMM, total)))
    rc = errf(err, err_size, "replan: out of memory: the allocator cannot give the %zu bytes (%.2f MiB) that "
              "hold the whole training state on every rank", total, total / mib);
  if (!rc)
    cm->bytes = total;
  rc = agree(g, rc, err, err_size);
  /* 3. This rank's pieces into its segment, then every segment to every rank. */
  if (!rc) {
    w.count_only = 0;
    w.n = 0;
    w.offset = 0;
    w.mem = (char *)cm->data + offset;
    rc = for_each_piece(t, 1, write_piece, &w);
    if (!rc && w.offset != mine)
      rc = errf(err, err_size, "replan: this rank's pieces hold %lld bytes, %lld when counted",
                (long long)w.offset, (long long)mine);
    rc = agree(g, rc, err, err_size);
  }
  struct ckpt_piece *all = NULL;
  int n_all = 0;
  if (!rc)
    rc = gather_pieces(g, w.pieces, w.n, &all, &n_all, err, err_size);
  if (!rc && world > 1) {
    size_t at = 0;
    for (int r = 0; r < world; r++) {
      real *segment = (real *)((char *)cm->data + at);
      const size_t n = (size_t)seg[r] / sizeof(real);
      for (size_t done = 0; !rc && done < n; done += MEM_CHUNK_ELEMS) {
        const size_t part = n - done < MEM_CHUNK_ELEMS ? n - done : MEM_CHUNK_ELEMS;
        if (comm_broadcast(g, segment + done, part, COMM_REAL, r, NULL))
          rc = errf(err, err_size, "replan: broadcasting rank %d's %lld bytes of state: %s", r,
                    (long long)seg[r], comm_error());
      }
      at += (size_t)seg[r];
    }
    rc = agree(g, rc, err, err_size);
  }
  /* 4. The manifest a load reads, as if of a checkpoint whose files are the segments. */
  if (!rc)
    rc = agree(g, mem_manifest(cm, t, all, n_all, seg, world, err, err_size), err, err_size);
  free(all);
  free(w.pieces);
  free(seg);
  if (rc) {
    ckpt_mem_free(cm);
    return rc;
  }
  *out = cm;
  return 0;
}

int ckpt_mem_load(struct trainer *t, struct ckpt_mem *cm, char *err, size_t err_size)
{
  return load_manifest(t, &cm->mf, err, err_size);
}

/* ---- the ckpt command ------------------------------------------------------------------- */

int ckpt_inspect(const char *path, FILE *out, char *err, size_t err_size)
{
  struct manifest mf;
  if (manifest_open(&mf, path, err, err_size))
    return manifest_free(&mf), 1;
  fprintf(out, "checkpoint %s: step %lld of plan %s (hash %s)\n", mf.path, mf.step, mf.plan, mf.plan_hash);
  fprintf(out, "model:");
  for (int i = 0; i < (mf.model[CKPT_MODEL_KEYS_DENSE] > 0 ? CKPT_MODEL_KEYS : CKPT_MODEL_KEYS_DENSE); i++)
    fprintf(out, " %s %lld", ckpt_model_keys[i], mf.model[i]);
  fprintf(out, "\nsaved on %lld ranks: tp %lld, pp %lld, dp %lld, zero %lld\n", mf.world, mf.mesh[0],
          mf.mesh[1], mf.mesh[2], mf.mesh[3]);
  if (mf.computes >= 0) { /* what a resume compares */
    fprintf(out, "computes:");
    for (int c = mf.j.nodes[mf.computes].first; c >= 0; c = mf.j.nodes[c].next)
      if (mf.j.nodes[c].type == JSON_STRING && mf.j.nodes[c].key)
        fprintf(out, " %s=%s", mf.j.nodes[c].key, mf.j.nodes[c].str);
    fprintf(out, "\n");
  }
  /* sums of bytes the shards are not read to confirm: doubles, which cannot overflow */
  double *bytes = calloc((size_t)mf.n_files + 1, sizeof *bytes), total = 0;
  long long pieces = 0;
  for (int i = 0; bytes && i < mf.n_tensors; i++)
    for (int k = 0; k < mf.tensors[i].n_pieces; k++) {
      const struct manifest_piece *sp = &mf.tensors[i].pieces[k];
      bytes[sp->file] += (double)(sp->hi - sp->lo) * (double)sizeof(real);
      total += (double)(sp->hi - sp->lo) * (double)sizeof(real);
      pieces++;
    }
  fprintf(out, "%d tensors, %lld pieces, %.2f MiB in %d files:\n", mf.n_tensors, pieces, total / 1048576.0, mf.n_files);
  for (int f = 0; bytes && f < mf.n_files; f++)
    fprintf(out, "  %s  %.0f bytes\n", mf.files[f], bytes[f]);
  free(bytes);
  manifest_free(&mf);
  return 0;
}

/* The reader has judged the coverage (every element of every tensor and kind in exactly one
 * piece) as it does for a resume; this reads every piece: its bytes within its file, its
 * checksum, every element finite. */
int ckpt_verify(const char *path, FILE *out, char *err, size_t err_size)
{
  struct manifest mf;
  if (manifest_open(&mf, path, err, err_size))
    return manifest_free(&mf), 1;
  long long pieces = 0;
  double total = 0.0, largest = 0.0;
  const char *largest_name = "";
  for (int i = 0; i < mf.n_tensors; i++) {
    struct manifest_tensor *tt = &mf.tensors[i];
    for (int k = 0; k < tt->n_pieces; k++) {
      struct manifest_piece *sp = &tt->pieces[k];
      const real *data = manifest_piece_data(&mf, tt, sp, err, err_size);
      if (!data)
        return manifest_free(&mf), 1;
      /* a diverged run's weights: a non-finite element is an error, the largest magnitude shown */
      for (int64_t e = 0; e < sp->hi - sp->lo; e++) {
        const double v = (double)data[e];
        if (!isfinite(v)) {
          const int64_t at = sp->lo + e, row = sp->r0 + at / sp->cols, col = sp->c0 + at % sp->cols;
          errf(err, err_size, "checkpoint %s: element [%lld, %lld] of %s (%s) is %s", mf.path, (long long)row,
               (long long)col, tt->name, ckpt_kind_names[sp->kind], isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
          return manifest_free(&mf), 1;
        }
        if (sp->kind == CKPT_PARAM && fabs(v) > largest) {
          largest = fabs(v);
          largest_name = tt->name;
        }
      }
      pieces++;
      total += (double)(sp->hi - sp->lo) * (double)sizeof(real);
    }
  }
  fprintf(out, "ok: checkpoint %s, step %lld: %d tensors × %d kinds covered exactly once, %lld pieces "
          "(%.2f MiB in %d files) match their checksums; every element finite, the largest weight "
          "|%.4g| in %s\n", mf.path, mf.step, mf.n_tensors, CKPT_N_KINDS, pieces, total / 1048576.0,
          mf.n_files, largest, largest_name);
  manifest_free(&mf);
  return 0;
}
