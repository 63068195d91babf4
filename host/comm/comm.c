/* The comm layer's front (comm.h): start-up and shut-down, argument checks, and for every
 * operation its sequence number, counters and record; then the queue to the comm thread,
 * which starts operations in issue order and tests them until they finish, so a non-blocking
 * collective progresses while the caller computes (Open MPI progresses non-blocking
 * collectives only inside MPI calls). Blocking calls take the same path and wait, so one
 * ordering holds for both. */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

struct comm_context comm_ctx = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .work = PTHREAD_COND_INITIALIZER,
  .finished = PTHREAD_COND_INITIALIZER,
  .wake_watchdog = PTHREAD_COND_INITIALIZER,
  .rank = 0, .size = 1, .timeout = COMM_TIMEOUT_DEFAULT,
};
#define ctx comm_ctx

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx.error, sizeof ctx.error, fmt, ap);
  va_end(ap);
}

const char *comm_error(void) { return ctx.error; }

int comm_set_error(const char *msg)
{
  set_error("%s", msg);
  return -1;
}

double comm_clock(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double comm_now(void) { return comm_clock() - ctx.t0; }

const char *comm_op_name(enum comm_op op)
{
  static const char *const names[] = { "all-reduce", "all-gather", "reduce-scatter", "broadcast",
                                       "send", "recv", "all-to-all" };
  return (unsigned)op < COMM_N_OPS ? names[op] : "?";
}

const char *comm_dtype_name(enum comm_dtype dtype)
{
  static const char *const names[] = { "fp32", "bf16", "fp16", "int32", "int64", "uint8", "fp64" };
  return (unsigned)dtype < COMM_N_DTYPES ? names[dtype] : "?";
}

const char *comm_reduce_name(enum comm_reduce reduce)
{
  static const char *const names[] = { "sum", "max" };
  return (unsigned)reduce < COMM_N_REDUCES ? names[reduce] : "?";
}

size_t comm_dtype_size(enum comm_dtype dtype)
{
  static const size_t sizes[] = { 4, 2, 2, 4, 8, 1, 8 };
  return (unsigned)dtype < COMM_N_DTYPES ? sizes[dtype] : 0;
}

struct comm_group *comm_world(void) { return ctx.world; }
int comm_local_rank(void) { return ctx.local_rank; }
int comm_local_size(void) { return ctx.local_size; }
const char *comm_backend_name(void) { return ctx.backend ? ctx.backend->name : "none"; }

int comm_group_add(struct comm_group *g)
{
  if (ctx.n_groups == ctx.cap_groups) {
    int cap = ctx.cap_groups ? 2 * ctx.cap_groups : 8;
    struct comm_group **groups = realloc(ctx.groups, (size_t)cap * sizeof *groups);
    if (!groups)
      return -1;
    ctx.groups = groups;
    ctx.cap_groups = cap;
  }
  ctx.groups[ctx.n_groups++] = g;
  return 0;
}

/* ---- setters and queries ---- */

static _Thread_local void *stream_now; /* comm_stream_set's, per issuing thread */

void comm_stream_set(void *stream) { stream_now = stream; }

int comm_stream_status(char *err, size_t n)
{
  pthread_mutex_lock(&ctx.lock);
  const int failed = ctx.stream_error[0] != 0;
  if (failed)
    snprintf(err, n, "%s", ctx.stream_error);
  pthread_mutex_unlock(&ctx.lock);
  return failed ? -1 : 0;
}

void comm_stream_drain(const struct comm_group *g)
{
  pthread_mutex_lock(&ctx.lock);
  for (;;) {
    int busy = 0;
    for (const struct comm_request *r = ctx.inflight; r && !busy; r = r->next_inflight)
      busy = r->stream && r->group == g;
    if (!busy)
      break;
    pthread_cond_wait(&ctx.finished, &ctx.lock);
  }
  pthread_mutex_unlock(&ctx.lock);
}

void comm_set_step(long long step, int mb)
{
  pthread_mutex_lock(&ctx.lock);
  ctx.step = step;
  ctx.mb = mb;
  pthread_mutex_unlock(&ctx.lock);
}

void comm_set_check(int on) { ctx.check = on != 0; }

void comm_set_timeout(double seconds)
{
  pthread_mutex_lock(&ctx.lock);
  ctx.timeout = seconds > 0 ? seconds : 0;
  pthread_mutex_unlock(&ctx.lock);
  pthread_cond_signal(&ctx.wake_watchdog);
}

/* ---- the comm thread ---- */

static void inflight_add(struct comm_request *r)
{
  r->prev_inflight = NULL;
  r->next_inflight = ctx.inflight;
  if (ctx.inflight)
    ctx.inflight->prev_inflight = r;
  ctx.inflight = r;
}

static void inflight_remove(struct comm_request *r)
{
  if (r->prev_inflight)
    r->prev_inflight->next_inflight = r->next_inflight;
  else
    ctx.inflight = r->next_inflight;
  if (r->next_inflight)
    r->next_inflight->prev_inflight = r->prev_inflight;
}

static void request_free(struct comm_request *r);

/* Ends r under ctx.lock. The caller may free r as soon as the lock is released. */
static void finish_locked(struct comm_request *r)
{
  struct comm_group_state *s = r->group->state;
  r->rec.t_end = comm_now();
  r->rec.status = r->status;
  comm_recorder_update(r->rec_id, &r->rec);
  s->last_done = r->rec;
  s->has_last_done = 1;
  inflight_remove(r);
  pthread_cond_broadcast(&ctx.finished);
  atomic_store(&r->done, 1);
}

/* Both threads poll briefly before sleeping on a condition variable: back-to-back small
 * operations then skip two thread wake-ups each (~15 us on Linux). */
#define SPIN_SECONDS 30e-6

static int spin_until_set(atomic_int *flag)
{
  double until = comm_clock() + SPIN_SECONDS;
  while (!atomic_load(flag)) {
    if (comm_clock() > until)
      return 0;
    sched_yield();
  }
  return 1;
}

static void *comm_thread_main(void *arg)
{
  (void)arg;
  struct comm_request *active = NULL, *active_tail = NULL; /* started, linked by next_queued */
  for (;;) {
    if (!active)
      spin_until_set(&ctx.work_queued);
    pthread_mutex_lock(&ctx.lock);
    while (!ctx.queue_head && !active && !ctx.stop_thread)
      pthread_cond_wait(&ctx.work, &ctx.lock);
    if (!ctx.queue_head && !active) {
      pthread_mutex_unlock(&ctx.lock);
      break;
    }
    struct comm_request *taken = ctx.queue_head;
    ctx.queue_head = ctx.queue_tail = NULL;
    atomic_store(&ctx.work_queued, 0);
    double now = comm_now();
    for (struct comm_request *q = taken; q; q = q->next_queued) {
      q->rec.t_start = now;
      comm_recorder_update(q->rec_id, &q->rec);
    }
    pthread_mutex_unlock(&ctx.lock);

    int moved = taken != NULL;
    if (taken) { /* start in issue order: the order every rank agrees on */
      for (struct comm_request *q = taken; q; q = q->next_queued)
        if (!q->stream) /* a stream operation was started on its caller's thread */
          ctx.backend->start(q);
      if (active_tail)
        active_tail->next_queued = taken;
      else
        active = taken;
      for (active_tail = taken; active_tail->next_queued; active_tail = active_tail->next_queued) {}
    }
    struct comm_request *prev = NULL, *q = active;
    while (q) {
      struct comm_request *next = q->next_queued;
      int done = q->status != 0;
      if (!done && q->stream)
        comm_nccl_progress(q, &done);
      else if (!done)
        ctx.backend->progress(q, &done);
      if (done) {
        if (prev)
          prev->next_queued = next;
        else
          active = next;
        if (active_tail == q)
          active_tail = prev;
        const int orphan = q->stream != NULL; /* a stream operation: nobody waits for it */
        pthread_mutex_lock(&ctx.lock);
        if (orphan && q->status && !ctx.stream_error[0])
          snprintf(ctx.stream_error, sizeof ctx.stream_error, "%s", q->err);
        finish_locked(q); /* q may be gone from here on, unless it is an orphan */
        pthread_mutex_unlock(&ctx.lock);
        if (orphan) {
          comm_nccl_release(q);
          request_free(q);
        }
        moved = 1;
      } else {
        prev = q;
      }
      q = next;
    }
    if (!moved) /* polling: MPI progresses only inside MPI_Test. Sleeping between polls
                 * instead was measured to slow mid-size all-reduces up to 10x. */
      sched_yield();
  }
  return NULL;
}

/* ---- issuing ---- */

static int is_collective(enum comm_op op) { return op != COMM_SEND && op != COMM_RECV; }
static int is_reduction(enum comm_op op) { return op == COMM_ALL_REDUCE || op == COMM_REDUCE_SCATTER; }

static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return na && nb && x < y + nb && y < x + na;
}

/* An all-to-all-v's element totals (sent, received) with its counts checked: no overflow, and
 * this rank's block to itself the size it expects from itself. */
static int per_peer_totals(const struct comm_request *r, size_t *sent, size_t *received, char *err, size_t n)
{
  const struct comm_group *g = r->group;
  const size_t *to = r->counts, *from = r->counts + g->size, limit = SIZE_MAX / comm_dtype_size(r->dtype);
  *sent = *received = 0;
  for (int j = 0; j < g->size; j++) {
    if (to[j] > limit - *sent || from[j] > limit - *received)
      return snprintf(err, n, "comm all-to-all on %s: the counts (%zu elements to group rank %d, %zu from it) "
                      "overflow a byte count", g->name, to[j], j, from[j]), -1;
    *sent += to[j];
    *received += from[j];
  }
  if (to[g->rank] != from[g->rank])
    return snprintf(err, n, "comm all-to-all on %s: group rank %d sends %zu elements to itself but expects %zu "
                    "from itself (send_counts[%d] must equal recv_counts[%d])", g->name, g->rank, to[g->rank],
                    from[g->rank], g->rank, g->rank), -1;
  return 0;
}

/* Checks r's arguments and sets r->rec.n_bytes. */
static int validate(struct comm_request *r, char *err, size_t n)
{
  const char *op = comm_op_name(r->op);
  struct comm_group *g = r->group;
  if (!ctx.initialized)
    return snprintf(err, n, "comm_%s: comm_init has not run", op), -1;
  if (!g || !g->state)
    return snprintf(err, n, "comm %s: no group", op), -1;
  if (comm_restricted_check(g, op, err, n))
    return -1;
  if ((unsigned)r->dtype >= COMM_N_DTYPES)
    return snprintf(err, n, "comm %s on %s: unknown dtype %d", op, g->name, (int)r->dtype), -1;
  if (is_reduction(r->op) && (unsigned)r->reduce >= COMM_N_REDUCES)
    return snprintf(err, n, "comm %s on %s: unknown reduction %d", op, g->name, (int)r->reduce), -1;
  if ((r->op == COMM_BROADCAST || !is_collective(r->op)) && (r->peer < 0 || r->peer >= g->size))
    return snprintf(err, n, "comm %s on %s: %s %d is not a rank of the group (size %d)", op, g->name,
                    r->op == COMM_BROADCAST ? "root" : "peer", r->peer, g->size), -1;
  size_t elem = comm_dtype_size(r->dtype), size = (size_t)g->size;
  if (r->op == COMM_ALL_TO_ALL && r->counts) {
    size_t sent, received;
    if (per_peer_totals(r, &sent, &received, err, n))
      return -1;
    r->n_elems = sent;
    r->rec.n_bytes = sent * elem;
    if ((sent && !r->send) || (received && !r->recv))
      return snprintf(err, n, "comm all-to-all on %s: NULL buffer for %zu elements", g->name,
                      sent && !r->send ? sent : received), -1;
    if (overlaps(r->send, sent * elem, r->recv, received * elem))
      return snprintf(err, n, "comm all-to-all on %s: send and recv buffers overlap (the per-peer form has "
                      "no in place)", g->name), -1;
    return r->stream ? comm_nccl_validate(r, err, n) : ctx.backend->validate(r, err, n);
  }
  if (r->n_elems > SIZE_MAX / elem / size)
    return snprintf(err, n, "comm %s on %s: n_elems %zu overflows a byte count", op, g->name, r->n_elems), -1;
  size_t one = r->n_elems * elem, all = one * size, send_bytes = 0, recv_bytes = 0;
  switch (r->op) {
  case COMM_ALL_REDUCE: send_bytes = one; recv_bytes = one; r->rec.n_bytes = one; break;
  case COMM_ALL_GATHER: send_bytes = one; recv_bytes = all; r->rec.n_bytes = all; break;
  case COMM_REDUCE_SCATTER: send_bytes = all; recv_bytes = one; r->rec.n_bytes = all; break;
  case COMM_ALL_TO_ALL: send_bytes = all; recv_bytes = all; r->rec.n_bytes = all; break;
  case COMM_BROADCAST: case COMM_RECV: recv_bytes = one; r->rec.n_bytes = one; break;
  case COMM_SEND: send_bytes = one; r->rec.n_bytes = one; break;
  default: return snprintf(err, n, "comm: unknown operation %d", (int)r->op), -1;
  }
  if ((send_bytes && !r->send) || (recv_bytes && !r->recv))
    return snprintf(err, n, "comm %s on %s: NULL buffer for %zu elements", op, g->name, r->n_elems), -1;
  int in_place = (r->op == COMM_ALL_REDUCE && r->send == r->recv) ||
                 (r->op == COMM_ALL_GATHER && r->send && r->recv &&
                  (const char *)r->send == (const char *)r->recv + (size_t)g->rank * one);
  if (!in_place && overlaps(r->send, send_bytes, r->recv, recv_bytes))
    return snprintf(err, n, "comm %s on %s: send and recv buffers overlap (in place is send == recv "
                    "for all-reduce, send == recv + rank · n_elems for all-gather)", op, g->name), -1;
  return r->stream ? comm_nccl_validate(r, err, n) : ctx.backend->validate(r, err, n);
}

static int wait_done(struct comm_request *r)
{
  if (!spin_until_set(&r->done)) {
    pthread_mutex_lock(&ctx.lock);
    while (!atomic_load(&r->done))
      pthread_cond_wait(&ctx.finished, &ctx.lock);
    pthread_mutex_unlock(&ctx.lock);
  }
  if (r->status)
    set_error("%s", r->err);
  return r->status;
}

/* Frees what r owns, and r itself unless it lives in a blocking caller's frame. */
static void request_free(struct comm_request *r)
{
  free(r->counts);
  free(r->backend_mem);
  if (!r->on_stack)
    free(r);
}

static int issue(struct comm_request *r, struct comm_request **req)
{
  char err[COMM_ERR_MAX];
  if (validate(r, err, sizeof err)) {
    set_error("%s", err);
    request_free(r);
    return -1;
  }
  struct comm_group *g = r->group;
  struct comm_group_state *s = g->state;
  r->rec.op = r->op;
  snprintf(r->rec.group, sizeof r->rec.group, "%s", g->name);
  r->rec.peer = r->peer;
  r->checked = ctx.check && g->size > 1;

  pthread_mutex_lock(&ctx.lock);
  r->rec.seq = is_collective(r->op) ? s->seq++ : r->op == COMM_SEND ? s->send_seq[r->peer]++
                                                                    : s->recv_seq[r->peer]++;
  r->rec.step = ctx.step;
  r->rec.mb = ctx.mb;
  r->rec.t_issue = comm_now();
  s->counters[r->op].calls++;
  ctx.ops_started++;
  s->counters[r->op].n_bytes += r->rec.n_bytes;
  r->rec_id = comm_recorder_add(&r->rec);
  inflight_add(r);
  pthread_mutex_unlock(&ctx.lock);

  comm_check_key(r, r->check_key);
  if (r->checked && is_collective(r->op) && comm_check_collective(r, r->err, sizeof r->err)) {
    r->status = -1;
    pthread_mutex_lock(&ctx.lock);
    finish_locked(r);
    pthread_mutex_unlock(&ctx.lock);
    set_error("%s", r->err);
    request_free(r);
    return -1;
  }

  if (r->stream) { /* onto the stream now, on this thread: ordered with its kernels */
    comm_nccl_start(r);
    if (r->status) {
      pthread_mutex_lock(&ctx.lock);
      finish_locked(r);
      pthread_mutex_unlock(&ctx.lock);
      set_error("%s", r->err);
      comm_nccl_release(r);
      request_free(r);
      return -1;
    }
  }
  pthread_mutex_lock(&ctx.lock);
  r->next_queued = NULL;
  if (ctx.queue_tail)
    ctx.queue_tail->next_queued = r;
  else
    ctx.queue_head = r;
  ctx.queue_tail = r;
  atomic_store(&ctx.work_queued, 1);
  pthread_cond_signal(&ctx.work);
  pthread_mutex_unlock(&ctx.lock);

  if (r->stream) { /* the comm thread ends and frees it; nothing to wait for here */
    if (req)
      *req = NULL;
    return 0;
  }
  if (req) {
    *req = r;
    return 0;
  }
  int status = wait_done(r);
  request_free(r);
  return status;
}

/* Runs the operation described by `proto`: on the stack when blocking, else on the heap. */
static int run(const struct comm_request *proto, struct comm_request **req)
{
  if (!req && !stream_now) {
    struct comm_request r = *proto;
    r.on_stack = 1;
    return issue(&r, NULL);
  }
  if (req)
    *req = NULL;
  struct comm_request *r = malloc(sizeof *r);
  if (!r) {
    set_error("comm %s: out of memory", comm_op_name(proto->op));
    free(proto->counts);
    return -1;
  }
  *r = *proto;
  r->stream = stream_now;
  return issue(r, req);
}

int comm_all_reduce(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                    enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req)
{
  struct comm_request r = { .group = g, .op = COMM_ALL_REDUCE, .dtype = dtype, .reduce = reduce,
                            .send = send, .recv = recv, .n_elems = n_elems, .peer = -1 };
  return run(&r, req);
}

int comm_all_gather(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                    enum comm_dtype dtype, struct comm_request **req)
{
  struct comm_request r = { .group = g, .op = COMM_ALL_GATHER, .dtype = dtype, .send = send,
                            .recv = recv, .n_elems = n_elems, .peer = -1 };
  return run(&r, req);
}

int comm_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                        enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req)
{
  struct comm_request r = { .group = g, .op = COMM_REDUCE_SCATTER, .dtype = dtype, .reduce = reduce,
                            .send = send, .recv = recv, .n_elems = n_elems, .peer = -1 };
  return run(&r, req);
}

int comm_broadcast(struct comm_group *g, void *buf, size_t n_elems, enum comm_dtype dtype, int root,
                   struct comm_request **req)
{
  struct comm_request r = { .group = g, .op = COMM_BROADCAST, .dtype = dtype, .recv = buf,
                            .n_elems = n_elems, .peer = root };
  return run(&r, req);
}

int comm_send(struct comm_group *g, const void *buf, size_t n_elems, enum comm_dtype dtype, int peer,
              struct comm_request **req)
{
  struct comm_request r = { .group = g, .op = COMM_SEND, .dtype = dtype, .send = buf,
                            .n_elems = n_elems, .peer = peer };
  return run(&r, req);
}

int comm_recv(struct comm_group *g, void *buf, size_t n_elems, enum comm_dtype dtype, int peer,
              struct comm_request **req)
{
  struct comm_request r = { .group = g, .op = COMM_RECV, .dtype = dtype, .recv = buf,
                            .n_elems = n_elems, .peer = peer };
  return run(&r, req);
}

int comm_all_to_all(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                    enum comm_dtype dtype, struct comm_request **req)
{
  struct comm_request r = { .group = g, .op = COMM_ALL_TO_ALL, .dtype = dtype, .send = send,
                            .recv = recv, .n_elems = n_elems, .peer = -1 };
  return run(&r, req);
}

int comm_all_to_all_v(struct comm_group *g, const void *send, const size_t *send_counts, void *recv,
                      const size_t *recv_counts, enum comm_dtype dtype, struct comm_request **req)
{
  if (req)
    *req = NULL;
  if (!g || !g->state || !send_counts || !recv_counts) { /* validate names a missing group */
    if (g && g->state) {
      set_error("comm all-to-all on %s: NULL %s", g->name, send_counts ? "recv_counts" : "send_counts");
      return -1;
    }
    struct comm_request r = { .group = g, .op = COMM_ALL_TO_ALL, .dtype = dtype, .peer = -1 };
    return run(&r, req);
  }
  /* the request's own copy: the caller's arrays are free again when this returns */
  size_t *counts = malloc(2 * (size_t)g->size * sizeof *counts);
  if (!counts) {
    set_error("comm all-to-all on %s: out of memory for %d counts", g->name, 2 * g->size);
    return -1;
  }
  memcpy(counts, send_counts, (size_t)g->size * sizeof *counts);
  memcpy(counts + g->size, recv_counts, (size_t)g->size * sizeof *counts);
  struct comm_request r = { .group = g, .op = COMM_ALL_TO_ALL, .dtype = dtype, .send = send, .recv = recv,
                            .counts = counts, .peer = -1 };
  return run(&r, req);
}

/* size_t moves as COMM_INT64 */
_Static_assert(sizeof(size_t) == 8, "comm_all_to_all_counts moves size_t as 8-byte integers");

int comm_all_to_all_counts(struct comm_group *g, const size_t *send_counts, size_t *recv_counts,
                           struct comm_request **req)
{
  return comm_all_to_all(g, send_counts, recv_counts, 1, COMM_INT64, req);
}

/* ---- waiting ---- */

void comm_request_then(struct comm_request *req, void (*fn)(void *arg, int status), void *arg)
{
  req->then = fn;
  req->then_arg = arg;
}

int comm_wait(struct comm_request **req)
{
  if (!req || !*req)
    return 0;
  int status = wait_done(*req);
  if ((*req)->then)
    (*req)->then((*req)->then_arg, status);
  request_free(*req);
  *req = NULL;
  return status;
}

int comm_wait_all(struct comm_request **reqs, int n)
{
  int status = 0;
  char first[COMM_ERR_MAX] = "";
  for (int i = 0; i < n; i++)
    if (comm_wait(&reqs[i]) && !status) {
      status = -1;
      snprintf(first, sizeof first, "%s", ctx.error);
    }
  if (status)
    set_error("%s", first);
  return status;
}

int comm_test(struct comm_request **req, int *done)
{
  *done = 1;
  if (!req || !*req)
    return 0;
  *done = atomic_load(&(*req)->done);
  return *done ? comm_wait(req) : 0;
}

/* ---- start-up and shut-down ---- */

static int env_number(const char *name, double lo, double *out, char *err, size_t n)
{
  const char *v = getenv(name);
  if (!v || !*v)
    return 0;
  char *end;
  double x = strtod(v, &end);
  if (*end || x != x || x < lo)
    return snprintf(err, n, "%s=%s: expected a number ≥ %g", name, v, lo), -1;
  *out = x;
  return 0;
}

/* The data-plane backends of this build; TYCHO_COMM_BACKEND names one (default: the first). */
static const struct comm_backend *const backends[] = { &comm_mpi_backend };
#define N_BACKENDS (sizeof backends / sizeof *backends)

static int pick_backend(char *err, size_t n)
{
  if (ctx.initialized)
    return 0;
  const char *want = getenv("TYCHO_COMM_BACKEND");
  ctx.backend = NULL;
  for (size_t i = 0; i < N_BACKENDS && !ctx.backend; i++)
    if (!want || !*want || strcmp(want, backends[i]->name) == 0)
      ctx.backend = backends[i];
  if (ctx.backend)
    return 0;
  char have[128] = "";
  for (size_t i = 0; i < N_BACKENDS; i++)
    snprintf(have + strlen(have), sizeof have - strlen(have), "%s\"%s\"", i ? ", " : "", backends[i]->name);
  return snprintf(err, n, "TYCHO_COMM_BACKEND=\"%s\": no such comm backend in this build (it has %s)", want, have), -1;
}

int comm_backend_check(char *err, size_t err_size)
{
  return pick_backend(err, err_size);
}

int comm_init(int *argc, char ***argv, char *err, size_t err_size)
{
  if (ctx.initialized)
    return snprintf(err, err_size, "comm_init: already initialized"), -1;
  double timeout = COMM_TIMEOUT_DEFAULT, check = 0, n_records = COMM_RECORDS_DEFAULT;
  if (env_number("TYCHO_COMM_TIMEOUT", 0, &timeout, err, err_size) ||
      env_number("TYCHO_COMM_CHECK", 0, &check, err, err_size) ||
      env_number("TYCHO_COMM_RECORDS", 1, &n_records, err, err_size))
    return -1;
  ctx.timeout = timeout;
  ctx.check = check != 0;
  if (pick_backend(err, err_size))
    return -1;
  ctx.error[0] = 0;
  if (comm_recorder_init(n_records > 1e7 ? 10000000 : (int)n_records))
    return snprintf(err, err_size, "comm_init: out of memory"), -1;
  if (comm_mpi_init(argc, argv, err, err_size))
    return -1;
  ctx.stop_thread = 0;
  if (pthread_create(&ctx.thread, NULL, comm_thread_main, NULL))
    return snprintf(err, err_size, "comm_init: cannot start the comm thread"), -1;
  ctx.threads_started = 1;
  ctx.initialized = 1;
  if (comm_watchdog_start(err, err_size))
    return -1;
  return 0;
}

int comm_finalize(char *err, size_t err_size)
{
  if (!ctx.initialized)
    return 0;
  comm_control_begin("comm_finalize waiting for started operations");
  pthread_mutex_lock(&ctx.lock);
  while (ctx.inflight)
    pthread_cond_wait(&ctx.finished, &ctx.lock);
  pthread_mutex_unlock(&ctx.lock);
  comm_control_end();
  /* Every rank leaves together: a rank that finalizes while others still wait in a collective
   * stays alive here, answers the watchdog's questions ("it waits in comm_finalize ...") and is
   * diagnosed with the rest, instead of vanishing and leaving its peers to hang or abort next to
   * a finalized process. */
  if (ctx.size > 1) {
    comm_control_begin_on("comm_finalize waiting for every rank to leave", ctx.world);
    int left = comm_mpi_leave_barrier(err, err_size);
    comm_control_end();
    if (left)
      return -1;
  }
  pthread_mutex_lock(&ctx.lock);
  ctx.stop_thread = 1;
  pthread_cond_signal(&ctx.work);
  pthread_mutex_unlock(&ctx.lock);
  pthread_join(ctx.thread, NULL);
  comm_watchdog_stop();
  ctx.threads_started = 0;
  ctx.initialized = 0;
  int status = comm_mpi_finalize(err, err_size);
  pthread_mutex_lock(&ctx.lock);
  comm_recorder_free();
  pthread_mutex_unlock(&ctx.lock);
  return status;
}
