/* checkpoint.async (ckpt.h, ckpt_save_async): the pieces copied into a snapshot at the step, the
 * shard file written and synced on a thread, the commit once every rank's file is synced. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "runtime/model/alloc.h"
#include "runtime/state/ckpt_internal.h"
#include "util/err.h"
#include "util/file.h"
#include "util/strbuf.h"

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
  int failed;          /* the thread's status: 0, or nonzero with its message in why */
  char why[4400];
  double started;
};

static void *async_writer(void *arg)
{
  struct ckpt_async *a = arg;
  int fd;
  if (file_create(a->file, &fd, a->why, sizeof a->why))
    a->failed = 1;
  else if (file_write_all(fd, a->file, a->snapshot, a->bytes, a->why, sizeof a->why))
    a->failed = 1, close(fd);
  else if (file_sync_close(fd, a->file, a->why, sizeof a->why))
    a->failed = 1;
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
  int rc = comm_agree_err(g, a ? 0 : errf(err, err_size, "checkpoint: out of memory"), err, err_size, COMM_AGREE_NAME_RANK);
  if (rc)
    return free(a), rc;
  t->ckpt_pending = a;
  snprintf(a->dir, sizeof a->dir, "%s", dir);
  ckpt_step_folder(a->tmp, sizeof a->tmp, dir, steps_done, 1);
  ckpt_step_folder(a->final, sizeof a->final, dir, steps_done, 0);
  snprintf(a->file, sizeof a->file, "%s/rank_%05d.bin", a->tmp, rank);
  a->step = steps_done;
  a->keep = keep;
  a->started = comm_now();
  sb_init(&a->manifest);
  if ((rc = ckpt_prepare_tmp(g, a->tmp, err, err_size))) {
    ckpt_failed_write(rank, a->tmp, rc);
    return async_free(t), rc;
  }
  /* The snapshot: sized for the rank's whole state (its parameters and AdamW's moments, as the
   * memory bill counts it), the most any rank of its stage writes; a rank that owns less fills
   * part of it (the rest is never touched). */
  struct writer w = { .fd = -1, .path = a->file, .rank = rank, .count_only = 1, .err = err, .err_size = err_size };
  ckpt_for_each_piece(t, 1, ckpt_write_piece, &w);
  const size_t need = (size_t)w.offset,
               billed = dp_snapshot_elems(t->dp.layout.n_elems, t->dp.layout.n_shard, t->dp.zero, t->model.bf16, t->dp.size) * sizeof(real);
  a->bytes = need;
  a->snapshot = alloc_host_bytes(ALLOC_CHECKPOINT, need > billed ? need : billed);
  if (!a->snapshot)
    rc = errf(err, err_size, "checkpoint: out of memory for the %.1f MiB async snapshot (checkpoint.async)",
              (double)billed / 1048576.0);
  w = (struct writer){ .fd = -1, .path = a->file, .rank = rank, .mem = a->snapshot, .err = err, .err_size = err_size };
  if (!rc)
    rc = ckpt_for_each_piece(t, 1, ckpt_write_piece, &w);
  if ((rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK))) {
    free(w.pieces);
    ckpt_failed_write(rank, a->tmp, rc);
    return async_free(t), rc;
  }
  struct ckpt_piece *all = NULL;
  int n_all = 0;
  rc = ckpt_gather_pieces(g, w.pieces, w.n, &all, &n_all, err, err_size);
  free(w.pieces);
  if (rc) {
    ckpt_failed_write(rank, a->tmp, rc);
    return async_free(t), rc;
  }
  if (rank == 0) {
    ckpt_manifest_text(&a->manifest, t, steps_done, all, n_all, world);
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
  if ((rc = comm_agree_err(g, rc, err, err_size, COMM_AGREE_NAME_RANK))) {
    /* a writer that started on this rank writes on: wait for it before removing its folder */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", a->tmp);
    ckpt_async_abandon(t);
    ckpt_failed_write(rank, tmp, rc);
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
  else if (a->failed) {
    errf(err, err_size, "checkpoint: %s", a->why);
    state = ASYNC_FAILED;
  }
  int agreed = comm_agree_err(g, state, err, err_size, COMM_AGREE_NAME_RANK);
  if (agreed == ASYNC_BUSY)
    return 0; /* a rank is still writing (never when waiting): asked again after the next step */
  if (!agreed) /* every rank's file is synced: rank 0 commits */
    agreed = comm_agree_err(g, rank == 0 ? ckpt_commit(a->dir, a->tmp, a->final, a->keep, &a->manifest, err, err_size) : 0,
                            err, err_size, COMM_AGREE_NAME_RANK);
  if (agreed) {
    ckpt_failed_write(rank, a->tmp, agreed);
    async_free(t);
    return -1;
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
