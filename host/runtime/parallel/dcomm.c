/* Collectives on model memory, direct or staged through host buffers (dcomm.h): the staging
 * buffers' pool, and each operation as to_host, the comm layer's operation on host buffers, and
 * from_host (at once for a blocking call, when the caller ends a started one). */
#include "runtime/parallel/dcomm.h"

#include <stdio.h>
#include <stdlib.h>

#include "ops.h"
#include "runtime/model/alloc.h"
#include "util/err.h"

/* Returns call's status, issued with d's CUDA stream set for this thread (the comm layer's NCCL
 * plane), so the operation goes on the stream; the other operations of the thread do not. */
#define ON_STREAM(d, call) do { comm_stream_set((d)->stream); const int rc_ = (call); comm_stream_set(NULL); \
  return rc_; } while (0)

const char *dcomm_mode_name(enum dcomm_mode m)
{
  return m == DCOMM_NCCL ? "nccl" : m == DCOMM_STAGED ? "staged" : "mpi";
}

int dcomm_choose(const struct plan *p, const struct dcomm_facts *f, enum dcomm_mode *mode, char *err,
                 size_t err_size)
{
  const char *at = plan_where(p, "comm");
  const int own_gpu = f->ranks_per_gpu <= 1;
  switch (p->comm) {
  case PLAN_COMM_MPI:
    if (!f->host_visible)
      return errf(err, err_size, "%s: comm = \"mpi\": the %s backend's memory is not host memory, and MPI "
                  "carries host buffers only; use comm = \"staged\" (or \"auto\")", at, f->backend), -2;
    *mode = DCOMM_DIRECT;
    return 0;
  case PLAN_COMM_STAGED:
    *mode = DCOMM_STAGED;
    return 0;
  case PLAN_COMM_NCCL:
    if (!f->cuda)
      return errf(err, err_size, "%s: comm = \"nccl\": NCCL carries a CUDA device's memory, and the %s "
                  "backend's is not; use comm = \"auto\"%s", at, f->backend,
                  f->host_visible ? " (or \"mpi\")" : " (or \"staged\")"), -2;
    if (!f->nccl_built)
      return errf(err, err_size, "%s: comm = \"nccl\": this build of tycho has no NCCL (CMake found none "
                  "beside the CUDA toolkit); use comm = \"staged\" (or \"auto\")", at), -2;
    if (!own_gpu)
      return errf(err, err_size, "%s: comm = \"nccl\": %d ranks share one GPU, and NCCL cannot run two "
                  "ranks on one device; use comm = \"staged\" (or \"auto\"), or one rank per GPU", at,
                  f->ranks_per_gpu), -2;
    *mode = DCOMM_NCCL;
    return 0;
  case PLAN_COMM_AUTO:
  default:
    *mode = f->host_visible ? DCOMM_DIRECT : f->cuda && f->nccl_built && own_gpu ? DCOMM_NCCL : DCOMM_STAGED;
    return 0;
  }
}

/* One staging buffer, and the copy back its operation owes the device. */
struct stage {
  unsigned char *host;
  size_t n_bytes;
  int busy;                   /* an operation holds it */
  const struct kernel_ops *k; /* the copy back: from_host(kctx, dst, host + back_at, n_back) */
  void *kctx;
  void *dst;
  size_t back_at, n_back;
};

static struct stage **pool; /* each its own block: a started operation holds its address */
static int n_pool, cap_pool;

/* A free buffer of at least n_bytes (the smallest that fits), else a new one; NULL with
 * comm_error() set when the host has no room. */
static struct stage *stage_take(const struct dcomm_mem *d, size_t n_bytes)
{
  struct stage *best = NULL;
  for (int i = 0; i < n_pool; i++)
    if (!pool[i]->busy && pool[i]->n_bytes >= n_bytes && (!best || pool[i]->n_bytes < best->n_bytes))
      best = pool[i];
  if (!best) {
    if (n_pool == cap_pool) {
      const int cap = cap_pool ? 2 * cap_pool : 16;
      struct stage **p = realloc(pool, (size_t)cap * sizeof *p);
      if (!p)
        goto oom;
      pool = p;
      cap_pool = cap;
    }
    best = calloc(1, sizeof *best);
    if (!best)
      goto oom;
    best->host = alloc_host_bytes(ALLOC_COMM, n_bytes);
    if (!best->host) {
      free(best);
      goto oom;
    }
    best->n_bytes = n_bytes;
    pool[n_pool++] = best;
  }
  best->busy = 1;
  best->k = d->k;
  best->kctx = d->kctx;
  best->dst = NULL;
  best->back_at = best->n_back = 0;
  return best;
oom : {
  char msg[160];
  snprintf(msg, sizeof msg, "out of host memory for a staging buffer of %zu bytes", n_bytes);
  comm_set_error(msg);
  return NULL;
}
}

static void stage_out(struct stage *s, size_t at, const void *src, size_t n_bytes)
{
  if (n_bytes)
    s->k->to_host(s->kctx, s->host + at, src, n_bytes);
}

/* The end of a staged operation: the result to the device (when it succeeded), the buffer free. */
static void stage_done(void *arg, int status)
{
  struct stage *s = arg;
  if (!status && s->n_back)
    s->k->from_host(s->kctx, s->dst, s->host + s->back_at, s->n_back);
  s->busy = 0;
}

/* After the comm call: on failure to issue, the buffer is free again; blocking, the copy back now;
 * started, the copy back when the caller ends it. */
static int stage_issued(struct stage *s, int rc, struct comm_request **req)
{
  if (rc) {
    s->busy = 0;
    return rc;
  }
  if (req && *req)
    comm_request_then(*req, stage_done, s);
  else
    stage_done(s, 0);
  return 0;
}

static void owe(struct stage *s, void *dst, size_t back_at, size_t n_back)
{
  s->dst = dst;
  s->back_at = back_at;
  s->n_back = n_back;
}

int dcomm_all_reduce(const struct dcomm_mem *d, struct comm_group *g, const void *send, void *recv,
                     size_t n_elems, enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req)
{
  if (d->mode == DCOMM_NCCL && g)
    ON_STREAM(d, comm_all_reduce(g, send, recv, n_elems, dtype, reduce, req));
  if (d->mode == DCOMM_DIRECT || !g)
    return comm_all_reduce(g, send, recv, n_elems, dtype, reduce, req);
  const size_t n = n_elems * comm_dtype_size(dtype);
  struct stage *s = stage_take(d, n);
  if (!s)
    return -1;
  stage_out(s, 0, send, n);
  owe(s, recv, 0, n);
  return stage_issued(s, comm_all_reduce(g, s->host, s->host, n_elems, dtype, reduce, req), req);
}

int dcomm_all_gather(const struct dcomm_mem *d, struct comm_group *g, const void *send, void *recv,
                     size_t n_elems, enum comm_dtype dtype, struct comm_request **req)
{
  if (d->mode == DCOMM_NCCL && g)
    ON_STREAM(d, comm_all_gather(g, send, recv, n_elems, dtype, req));
  if (d->mode == DCOMM_DIRECT || !g)
    return comm_all_gather(g, send, recv, n_elems, dtype, req);
  const size_t n = n_elems * comm_dtype_size(dtype), mine = (size_t)g->rank * n;
  struct stage *s = stage_take(d, (size_t)g->size * n);
  if (!s)
    return -1;
  stage_out(s, mine, send, n); /* in place on the host, whether or not it was on the device */
  owe(s, recv, 0, (size_t)g->size * n);
  return stage_issued(s, comm_all_gather(g, s->host + mine, s->host, n_elems, dtype, req), req);
}

int dcomm_reduce_scatter(const struct dcomm_mem *d, struct comm_group *g, const void *send, void *recv,
                         size_t n_elems, enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req)
{
  if (d->mode == DCOMM_NCCL && g)
    ON_STREAM(d, comm_reduce_scatter(g, send, recv, n_elems, dtype, reduce, req));
  if (d->mode == DCOMM_DIRECT || !g)
    return comm_reduce_scatter(g, send, recv, n_elems, dtype, reduce, req);
  const size_t n = n_elems * comm_dtype_size(dtype), whole = (size_t)g->size * n;
  struct stage *s = stage_take(d, whole + n);
  if (!s)
    return -1;
  stage_out(s, 0, send, whole);
  owe(s, recv, whole, n);
  return stage_issued(s, comm_reduce_scatter(g, s->host, s->host + whole, n_elems, dtype, reduce, req), req);
}

int dcomm_broadcast(const struct dcomm_mem *d, struct comm_group *g, void *buf, size_t n_elems,
                    enum comm_dtype dtype, int root, struct comm_request **req)
{
  if (d->mode == DCOMM_NCCL && g)
    ON_STREAM(d, comm_broadcast(g, buf, n_elems, dtype, root, req));
  if (d->mode == DCOMM_DIRECT || !g)
    return comm_broadcast(g, buf, n_elems, dtype, root, req);
  const size_t n = n_elems * comm_dtype_size(dtype);
  struct stage *s = stage_take(d, n);
  if (!s)
    return -1;
  if (g->rank == root)
    stage_out(s, 0, buf, n); /* the root's buffer stays as it is */
  else
    owe(s, buf, 0, n);
  return stage_issued(s, comm_broadcast(g, s->host, n_elems, dtype, root, req), req);
}

int dcomm_send(const struct dcomm_mem *d, struct comm_group *g, const void *buf, size_t n_elems,
               enum comm_dtype dtype, int peer, struct comm_request **req)
{
  if (d->mode == DCOMM_NCCL && g)
    ON_STREAM(d, comm_send(g, buf, n_elems, dtype, peer, req));
  if (d->mode == DCOMM_DIRECT || !g)
    return comm_send(g, buf, n_elems, dtype, peer, req);
  const size_t n = n_elems * comm_dtype_size(dtype);
  struct stage *s = stage_take(d, n);
  if (!s)
    return -1;
  stage_out(s, 0, buf, n);
  return stage_issued(s, comm_send(g, s->host, n_elems, dtype, peer, req), req);
}

int dcomm_recv(const struct dcomm_mem *d, struct comm_group *g, void *buf, size_t n_elems,
               enum comm_dtype dtype, int peer, struct comm_request **req)
{
  if (d->mode == DCOMM_NCCL && g)
    ON_STREAM(d, comm_recv(g, buf, n_elems, dtype, peer, req));
  if (d->mode == DCOMM_DIRECT || !g)
    return comm_recv(g, buf, n_elems, dtype, peer, req);
  const size_t n = n_elems * comm_dtype_size(dtype);
  struct stage *s = stage_take(d, n);
  if (!s)
    return -1;
  owe(s, buf, 0, n);
  return stage_issued(s, comm_recv(g, s->host, n_elems, dtype, peer, req), req);
}

int dcomm_all_to_all_v(const struct dcomm_mem *d, struct comm_group *g, const void *send,
                       const size_t *send_counts, void *recv, const size_t *recv_counts,
                       enum comm_dtype dtype, struct comm_request **req)
{
  if (d->mode == DCOMM_NCCL && g)
    ON_STREAM(d, comm_all_to_all_v(g, send, send_counts, recv, recv_counts, dtype, req));
  if (d->mode == DCOMM_DIRECT || !g || !send_counts || !recv_counts)
    return comm_all_to_all_v(g, send, send_counts, recv, recv_counts, dtype, req);
  size_t ns = 0, nr = 0;
  for (int j = 0; j < g->size; j++) {
    ns += send_counts[j];
    nr += recv_counts[j];
  }
  const size_t es = comm_dtype_size(dtype);
  struct stage *s = stage_take(d, (ns + nr) * es);
  if (!s)
    return -1;
  stage_out(s, 0, send, ns * es);
  owe(s, recv, ns * es, nr * es);
  return stage_issued(s, comm_all_to_all_v(g, s->host, send_counts, s->host + ns * es, recv_counts, dtype, req),
                      req);
}

void dcomm_release(void)
{
  int kept = 0;
  for (int i = 0; i < n_pool; i++) {
    if (pool[i]->busy) {
      pool[kept++] = pool[i];
      continue;
    }
    alloc_free(pool[i]->host);
    free(pool[i]);
  }
  n_pool = kept;
  if (!n_pool) {
    free(pool);
    pool = NULL;
    cap_pool = 0;
  }
}

size_t dcomm_staging_bytes(void)
{
  size_t n = 0;
  for (int i = 0; i < n_pool; i++)
    n += pool[i]->n_bytes;
  return n;
}
