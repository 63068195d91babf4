/* The state a replan moves, in memory (ckpt.h, ckpt_mem_*; train.h, trainer_replan): every
 * rank's pieces gathered to every rank with a manifest describing them, loaded as a checkpoint
 * would be. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/model/alloc.h"
#include "runtime/state/ckpt_internal.h"
#include "runtime/state/manifest.h"
#include "util/err.h"

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
  ckpt_model_values(&t->plan->model, mf->model);
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
  int rc = !cm || !seg ? errf(err, err_size, "replan: out of memory") : ckpt_for_each_piece(t, 1, ckpt_write_piece, &w);
  const int64_t mine = w.offset;
  if (!(rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK))) {
    if (world > 1 && comm_all_gather(g, &mine, seg, 1, COMM_INT64, NULL))
      rc = errf(err, err_size, "replan: gathering the state's sizes: %s", comm_error());
    else if (world == 1)
      seg[0] = mine;
    rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK);
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
  rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK);
  /* 3. This rank's pieces into its segment, then every segment to every rank. */
  if (!rc) {
    w.count_only = 0;
    w.n = 0;
    w.offset = 0;
    w.mem = (char *)cm->data + offset;
    rc = ckpt_for_each_piece(t, 1, ckpt_write_piece, &w);
    if (!rc && w.offset != mine)
      rc = errf(err, err_size, "replan: this rank's pieces hold %lld bytes, %lld when counted",
                (long long)w.offset, (long long)mine);
    rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK);
  }
  struct ckpt_piece *all = NULL;
  int n_all = 0;
  if (!rc)
    rc = ckpt_gather_pieces(g, w.pieces, w.n, &all, &n_all, err, err_size);
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
    rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK);
  }
  /* 4. The manifest a load reads, as if of a checkpoint whose files are the segments. */
  if (!rc)
    rc = comm_agree_err(g, mem_manifest(cm, t, all, n_all, seg, world, err, err_size), err, err_size, COMM_AGREE_NAME_RANK);
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
  return ckpt_load_manifest(t, &cm->mf, err, err_size);
}
