/* The MPI side of the comm layer: start-up (MPI_THREAD_MULTIPLE, errors returned as codes
 * rather than fatal), groups over MPI communicators, and the data-plane backend for CPU
 * buffers. The backend starts MPI's non-blocking calls on the comm thread, in issue order, and
 * MPI_Tests them there; MPI matches collectives by the order they are started on a
 * communicator, so one thread starting them all keeps every rank in step. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf16.h"
#include "comm_internal.h"
#include "util/launch.h"

#define ctx comm_ctx

static int watch_created;

int comm_mpi_fail(int code, const char *call, const char *file, int line, char *err, size_t err_size)
{
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error code %d", code);
  const char *where = strstr(file, "host/");
  snprintf(err, err_size, "rank %d: %s:%d: %.*s failed: %s", ctx.rank, where ? where : file, line,
           (int)strcspn(call, "("), call, msg);
  return -1;
}

static int env_int(const char *name, int *out)
{
  const char *v = getenv(name);
  char *end;
  if (!v || !*v)
    return 0;
  long x = strtol(v, &end, 10);
  if (*end || x < 0 || x > INT_MAX)
    return 0;
  *out = (int)x;
  return 1;
}

static const char *thread_level_name(int level)
{
  return level == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED"
       : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED" : "MPI_THREAD_MULTIPLE";
}

/* Local rank and size: from the launcher's environment (Open MPI, Slurm), else from the ranks
 * that share this node's memory. */
static int find_local_rank(char *err, size_t n)
{
  int have_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", &ctx.local_rank) ||
                  env_int("SLURM_LOCALID", &ctx.local_rank);
  int have_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &ctx.local_size);
  if (have_rank && have_size)
    return 0;
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx.rank, MPI_INFO_NULL, &node), err, n);
  if (!have_rank)
    MPI_CHECK(MPI_Comm_rank(node, &ctx.local_rank), err, n);
  if (!have_size)
    MPI_CHECK(MPI_Comm_size(node, &ctx.local_size), err, n);
  MPI_CHECK(MPI_Comm_free(&node), err, n);
  return 0;
}

/* A process no launcher started (a one-rank `tycho run`, `tycho repl` without -n) is Open MPI's
 * singleton, and Open MPI 4.1 starts it listening on TCP on every interface: the process itself
 * (its TCP transport, e.g. 0.0.0.0:1024 and [::]:1024) and the daemon it forks (orted, on two
 * more ports). A run with no peers needs none of that. Measured with `ss -ltnp` during a run:
 * oob_tcp_if_include=lo leaves orted on 0.0.0.0; the two settings below leave no listening socket
 * at all — no daemon (ess_singleton_isolated: the singleton runs alone, which only loses
 * MPI_Comm_spawn, unused here) and no TCP transport (btl self,vader: the process talks to itself
 * only). Starting MPI anyway keeps one code path for every world size. A value the user set is
 * kept, ours are unset once MPI_Init has read them; under a launcher nothing is changed. */
#ifdef OMPI_MAJOR_VERSION
static const char *const singleton_env[][2] = { { "OMPI_MCA_ess_singleton_isolated", "1" },
                                                  { "OMPI_MCA_btl", "self,vader" } };
static int singleton_set[2]; /* which of them this process set: unset again once MPI has read them */
#endif

static void singleton_alone(void)
{
#ifdef OMPI_MAJOR_VERSION
  if (launch_under_launcher())
    return;
  for (int i = 0; i < 2; i++)
    singleton_set[i] = !getenv(singleton_env[i][0]) && setenv(singleton_env[i][0], singleton_env[i][1], 0) == 0;
#endif
}

/* After MPI_Init: the settings were the singleton's, not those of programs it may start. */
static void singleton_env_clear(void)
{
#ifdef OMPI_MAJOR_VERSION
  for (int i = 0; i < 2; i++)
    if (singleton_set[i])
      unsetenv(singleton_env[i][0]);
#endif
}

/* bf16 sums (precision.grads = "bf16": the gradient reductions move 2-byte elements): MPI has no
 * bf16 type, so the elements move as 16-bit words and this operation adds them: each pair widened
 * (exact), added in fp32 and rounded to nearest even, once per combination, as NCCL's bf16 sum
 * does. Created with the first group, freed at finalize. */
static MPI_Op bf16_sum_op = MPI_OP_NULL;

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) {
    uint32_t x = (uint32_t)a[i] << 16, y = (uint32_t)b[i] << 16;
    float fx, fy;
    memcpy(&fx, &x, 4);
    memcpy(&fy, &y, 4);
    b[i] = bf16_from_float(fx + fy);
  }
}

int comm_mpi_init(int *argc, char ***argv, char *err, size_t n)
{
  int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Finalized(&finalized);
  if (finalized)
    return snprintf(err, n, "comm_init: MPI has already been finalized"), -1;
  MPI_Initialized(&initialized);
  if (!initialized) {
    singleton_alone();
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    singleton_env_clear();
    if (rc != MPI_SUCCESS)
      return comm_mpi_fail(rc, "MPI_Init_thread", __FILE__, __LINE__, err, n);
    ctx.mpi_owned = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), err, n);
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank), err, n);
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &ctx.size), err, n);
  if (provided < MPI_THREAD_MULTIPLE)
    return snprintf(err, n, "rank %d: MPI provides %s; tycho needs MPI_THREAD_MULTIPLE (its comm "
                    "thread calls MPI while the caller computes)", ctx.rank, thread_level_name(provided)), -1;
  if (find_local_rank(err, n))
    return -1;
  if (bf16_sum_op == MPI_OP_NULL)
    MPI_CHECK(MPI_Op_create(bf16_sum, 1, &bf16_sum_op), err, n);
  MPI_Comm ctl;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &ctl), err, n);
  if (comm_mpi_group_new(ctl, "world", &ctx.world, err, n))
    return -1;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &ctx.watch), err, n);
  watch_created = 1;
  MPI_CHECK(MPI_Barrier(ctx.world->state->ctl), err, n);
  ctx.t0 = comm_clock(); /* every rank leaves the barrier within microseconds: a shared zero */
  return 0;
}

static int group_fill(struct comm_group *g, char *err, size_t n)
{
  struct comm_group_state *s = g->state;
  MPI_Group world_group, group;
  MPI_CHECK(MPI_Comm_set_errhandler(s->ctl, MPI_ERRORS_RETURN), err, n);
  MPI_CHECK(MPI_Comm_rank(s->ctl, &g->rank), err, n);
  MPI_CHECK(MPI_Comm_size(s->ctl, &g->size), err, n);
  g->ranks = malloc((size_t)g->size * sizeof *g->ranks);
  int *index = malloc((size_t)g->size * sizeof *index);
  s->send_seq = calloc((size_t)g->size, sizeof *s->send_seq);
  s->recv_seq = calloc((size_t)g->size, sizeof *s->recv_seq);
  if (!g->ranks || !index || !s->send_seq || !s->recv_seq) {
    free(index);
    return snprintf(err, n, "rank %d: out of memory for group %s", ctx.rank, g->name), -1;
  }
  for (int i = 0; i < g->size; i++)
    index[i] = i;
  int rc = MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  if (rc == MPI_SUCCESS && (rc = MPI_Comm_group(s->ctl, &group)) != MPI_SUCCESS)
    MPI_Group_free(&world_group);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Group_translate_ranks(group, g->size, index, world_group, g->ranks);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
  }
  free(index);
  if (rc != MPI_SUCCESS)
    return comm_mpi_fail(rc, "MPI_Comm_group or MPI_Group_translate_ranks", __FILE__, __LINE__, err, n);
  return ctx.backend->group_open(g, err, n);
}

/* The MPI data plane's channel: a duplicate of the group's control communicator. */
static int mpi_group_open(struct comm_group *g, char *err, size_t n)
{
  MPI_Comm *data = malloc(sizeof *data);
  if (!data)
    return snprintf(err, n, "rank %d: out of memory for group %s", ctx.rank, g->name), -1;
  *data = MPI_COMM_NULL;
  g->state->data = data;
  MPI_CHECK(MPI_Comm_dup(g->state->ctl, data), err, n);
  MPI_CHECK(MPI_Comm_set_errhandler(*data, MPI_ERRORS_RETURN), err, n);
  return 0;
}

static void mpi_group_close(struct comm_group *g)
{
  MPI_Comm *data = g->state->data;
  if (data && *data != MPI_COMM_NULL)
    MPI_Comm_free(data);
  free(data);
  g->state->data = NULL;
}

int comm_mpi_group_new(MPI_Comm ctl, const char *name, struct comm_group **out, char *err, size_t n)
{
  struct comm_group *g = calloc(1, sizeof *g);
  struct comm_group_state *s = calloc(1, sizeof *s);
  *out = NULL;
  if (!g || !s) {
    free(g);
    free(s);
    MPI_Comm_free(&ctl);
    return snprintf(err, n, "rank %d: out of memory for group %s", ctx.rank, name), -1;
  }
  snprintf(g->name, sizeof g->name, "%s", name);
  g->state = s;
  s->ctl = ctl;
  if (group_fill(g, err, n)) {
    comm_mpi_group_free(g);
    return -1;
  }
  if (comm_group_add(g)) {
    comm_mpi_group_free(g);
    return snprintf(err, n, "rank %d: out of memory for group %s", ctx.rank, name), -1;
  }
  *out = g;
  return 0;
}

void comm_mpi_group_free(struct comm_group *g)
{
  if (!g)
    return;
  if (g->state) {
    comm_stream_close(g); /* its NCCL communicator, if it still has one */
    if (g->state->data)
      ctx.backend->group_close(g);
    if (g->state->ctl != MPI_COMM_NULL)
      MPI_Comm_free(&g->state->ctl);
    free(g->state->send_seq);
    free(g->state->recv_seq);
    free(g->state);
  }
  free(g->ranks);
  free(g);
}

int comm_group_split(struct comm_group *parent, int color, int key, const char *name,
                     struct comm_group **out, char *err, size_t n)
{
  *out = NULL;
  if (!comm_ctx.initialized || !parent || !parent->state)
    return snprintf(err, n, "comm_group_split: %s", comm_ctx.initialized ? "no parent group" : "comm_init has not run"), -1;
  if (color < 0)
    return snprintf(err, n, "comm_group_split %s: color %d must be ≥ 0", name, color), -1;
  if (comm_restricted_check(parent, "a group split", err, n))
    return -1;
  MPI_Comm ctl;
  comm_control_begin("group split");
  int rc = MPI_Comm_split(parent->state->ctl, color, key, &ctl);
  int status = rc == MPI_SUCCESS ? comm_mpi_group_new(ctl, name, out, err, n)
                                 : comm_mpi_fail(rc, "MPI_Comm_split", __FILE__, __LINE__, err, n);
  comm_control_end();
  return status;
}

int comm_group_free(struct comm_group *g, char *err, size_t n)
{
  if (!g)
    return 0;
  if (!comm_ctx.initialized || g == comm_ctx.world)
    return snprintf(err, n, "comm_group_free: %s", comm_ctx.initialized ? "the world group lives until comm_finalize"
                                                                      : "comm_init has not run"), -1;
  if (comm_restricted_check(g, "freeing a group", err, n))
    return -1;
  pthread_mutex_lock(&ctx.lock);
  int busy = 0, at = -1;
  for (const struct comm_request *r = ctx.inflight; r; r = r->next_inflight)
    busy += r->group == g;
  for (int i = 0; i < ctx.n_groups; i++)
    at = ctx.groups[i] == g ? i : at;
  if (!busy && at >= 0) { /* off the list the watchdog and the counters walk */
    memmove(&ctx.groups[at], &ctx.groups[at + 1], (size_t)(ctx.n_groups - at - 1) * sizeof *ctx.groups);
    ctx.n_groups--;
  }
  pthread_mutex_unlock(&ctx.lock);
  if (at < 0)
    return snprintf(err, n, "comm_group_free: rank %d holds no such group", ctx.rank), -1;
  if (busy)
    return snprintf(err, n, "comm_group_free %s: %d operation%s in flight; wait for them first", g->name, busy,
                    busy == 1 ? "" : "s"), -1;
  comm_mpi_group_free(g);
  return 0;
}

int comm_groups_held(void)
{
  pthread_mutex_lock(&ctx.lock);
  int k = ctx.n_groups;
  pthread_mutex_unlock(&ctx.lock);
  return k;
}

int comm_mpi_leave_barrier(char *err, size_t n)
{
  MPI_Request req;
  MPI_CHECK(MPI_Ibarrier(ctx.world->state->ctl, &req), err, n);
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE), err, n);
    if (done)
      return 0;
    struct timespec ts = { 0, 1000000 };
    nanosleep(&ts, NULL);
  }
}

int comm_mpi_finalize(char *err, size_t n)
{
  for (int i = ctx.n_groups - 1; i >= 0; i--)
    comm_mpi_group_free(ctx.groups[i]);
  free(ctx.groups);
  ctx.groups = NULL;
  ctx.n_groups = ctx.cap_groups = 0;
  ctx.world = NULL;
  if (watch_created)
    MPI_Comm_free(&ctx.watch);
  watch_created = 0;
  if (bf16_sum_op != MPI_OP_NULL)
    MPI_Op_free(&bf16_sum_op);
  if (ctx.mpi_owned) {
    ctx.mpi_owned = 0;
    MPI_CHECK(MPI_Finalize(), err, n);
  }
  return 0;
}

void comm_fatal(const char *fmt, ...)
{
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tycho: rank %d: %s\n", ctx.rank, msg);
  fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized)
    MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

/* ---- the data plane ---- */

static MPI_Datatype mpi_type(enum comm_dtype dtype)
{
  switch (dtype) {
  case COMM_FP32: return MPI_FLOAT;
  case COMM_FP64: return MPI_DOUBLE;
  case COMM_BF16: case COMM_FP16: return MPI_UINT16_T; /* moved, never reduced here */
  case COMM_INT32: return MPI_INT32_T;
  case COMM_INT64: return MPI_INT64_T;
  default: return MPI_UINT8_T;
  }
}

static int mpi_validate(const struct comm_request *r, char *err, size_t n)
{
  if ((r->op == COMM_ALL_REDUCE || r->op == COMM_REDUCE_SCATTER) && r->dtype == COMM_FP16)
    return snprintf(err, n, "comm %s on %s: the MPI backend does not reduce fp16", comm_op_name(r->op),
                    r->group->name), -1;
  if ((r->op == COMM_ALL_REDUCE || r->op == COMM_REDUCE_SCATTER) && r->dtype == COMM_BF16 && r->reduce != COMM_SUM)
    return snprintf(err, n, "comm %s on %s: the MPI backend reduces bf16 by sum only (not %s)", comm_op_name(r->op),
                    r->group->name, comm_reduce_name(r->reduce)), -1;
  if (r->counts) { /* MPI_Ialltoallv's counts and displacements are ints: every block's end fits */
    size_t total[2] = { 0, 0 };
    for (int j = 0; j < 2 * r->group->size; j++)
      total[j >= r->group->size] += r->counts[j];
    if (total[0] > INT_MAX || total[1] > INT_MAX)
      return snprintf(err, n, "comm all-to-all on %s: %zu elements %s exceed MPI's int displacements",
                      r->group->name, total[0] > INT_MAX ? total[0] : total[1],
                      total[0] > INT_MAX ? "sent" : "received"), -1;
    return 0;
  }
  if (r->n_elems > INT_MAX)
    return snprintf(err, n, "comm %s on %s: n_elems %zu exceeds MPI's int count", comm_op_name(r->op),
                    r->group->name, r->n_elems), -1;
  return 0;
}

/* MPI_Ialltoallv's arguments from a per-peer all-to-all's counts (blocks packed in peer order):
 * send counts, send displacements, recv counts, recv displacements, each `size` ints, kept in
 * r->backend_mem until the request is freed (MPI reads them until the operation ends). */
static int *alltoallv_args(struct comm_request *r)
{
  const int size = r->group->size;
  int *v = malloc(4 * (size_t)size * sizeof *v);
  if (!v)
    return NULL;
  for (int side = 0; side < 2; side++) { /* mpi_validate bounded every total by INT_MAX */
    int *count = v + 2 * side * size, *displ = count + size, at = 0;
    for (int j = 0; j < size; j++) {
      count[j] = (int)r->counts[side * size + j];
      displ[j] = at;
      at += count[j];
    }
  }
  r->backend_mem = v;
  return v;
}

/* Appends which operation failed to r->err. */
static void fail_context(struct comm_request *r)
{
  size_t len = strlen(r->err);
  snprintf(r->err + len, sizeof r->err - len, " (%s %s seq %llu)", r->group->name, comm_op_name(r->op),
           (unsigned long long)r->rec.seq);
}

static int post(struct comm_request *r)
{
  MPI_Comm comm = *(MPI_Comm *)r->group->state->data;
  int count = (int)r->n_elems;
  MPI_Datatype type = mpi_type(r->dtype);
  MPI_Op op = r->dtype == COMM_BF16 ? bf16_sum_op : r->reduce == COMM_MAX ? MPI_MAX : MPI_SUM;
  size_t one = r->n_elems * comm_dtype_size(r->dtype);
  char *err = r->err;
  size_t n = sizeof r->err;
  r->n_mpi = 1;
  switch (r->op) {
  case COMM_ALL_REDUCE:
    MPI_CHECK(MPI_Iallreduce(r->send == r->recv ? MPI_IN_PLACE : r->send, r->recv, count, type, op, comm,
                             &r->mpi[0]), err, n);
    break;
  case COMM_ALL_GATHER: {
    int in_place = (const char *)r->send == (const char *)r->recv + (size_t)r->group->rank * one;
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : r->send, count, type, r->recv, count, type, comm,
                             &r->mpi[0]), err, n);
    break;
  }
  case COMM_REDUCE_SCATTER:
    MPI_CHECK(MPI_Ireduce_scatter_block(r->send, r->recv, count, type, op, comm, &r->mpi[0]), err, n);
    break;
  case COMM_BROADCAST:
    MPI_CHECK(MPI_Ibcast(r->recv, count, type, r->peer, comm, &r->mpi[0]), err, n);
    break;
  case COMM_ALL_TO_ALL:
    if (r->counts) {
      const int size = r->group->size, *v = alltoallv_args(r);
      if (!v)
        return snprintf(err, n, "rank %d: out of memory for an all-to-all's %d counts", ctx.rank, 4 * size), -1;
      MPI_CHECK(MPI_Ialltoallv(r->send, v, v + size, type, r->recv, v + 2 * size, v + 3 * size, type, comm,
                               &r->mpi[0]), err, n);
    } else {
      MPI_CHECK(MPI_Ialltoall(r->send, count, type, r->recv, count, type, comm, &r->mpi[0]), err, n);
    }
    break;
  case COMM_SEND: /* the check message first: the receiver reads it before the data */
    r->n_mpi = r->checked ? 2 : 1;
    if (r->checked)
      MPI_CHECK(MPI_Isend(r->check_key, COMM_CHECK_FIELDS, MPI_INT64_T, r->peer, COMM_TAG_CHECK, comm,
                          &r->mpi[1]), err, n);
    MPI_CHECK(MPI_Isend(r->send, count, type, r->peer, COMM_TAG_DATA, comm, &r->mpi[0]), err, n);
    break;
  case COMM_RECV:
    r->n_mpi = r->checked ? 2 : 1;
    if (r->checked)
      MPI_CHECK(MPI_Irecv(r->peer_key, COMM_CHECK_FIELDS, MPI_INT64_T, r->peer, COMM_TAG_CHECK, comm,
                          &r->mpi[1]), err, n);
    MPI_CHECK(MPI_Irecv(r->recv, count, type, r->peer, COMM_TAG_DATA, comm, &r->mpi[0]), err, n);
    break;
  default:
    return snprintf(err, n, "comm: unknown operation %d", (int)r->op), -1;
  }
  return 0;
}

/* Gives up on r's outstanding MPI requests after a failure. */
static void abandon(struct comm_request *r)
{
  for (int i = 0; i < r->n_mpi; i++)
    if (r->mpi[i] != MPI_REQUEST_NULL) {
      if (r->op == COMM_RECV)
        MPI_Cancel(&r->mpi[i]);
      MPI_Request_free(&r->mpi[i]);
    }
}

static void mpi_start(struct comm_request *r)
{
  r->mpi[0] = r->mpi[1] = MPI_REQUEST_NULL;
  r->n_mpi = 0;
  if (r->group->size == 1 && r->op != COMM_SEND && r->op != COMM_RECV) {
    /* A group of one: the result is the input; a copy unless in place. */
    size_t n_bytes = r->n_elems * comm_dtype_size(r->dtype);
    if (r->op != COMM_BROADCAST && r->send != r->recv && n_bytes)
      memmove(r->recv, r->send, n_bytes);
    return;
  }
  if (post(r)) {
    r->status = -1;
    fail_context(r);
    abandon(r);
  }
}

static void mpi_progress(struct comm_request *r, int *done)
{
  int pending = 0;
  for (int i = 0; i < r->n_mpi; i++) {
    if (r->mpi[i] == MPI_REQUEST_NULL)
      continue;
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Test(&r->mpi[i], &flag, &st);
    if (rc != MPI_SUCCESS) {
      comm_mpi_fail(rc, "MPI_Test", __FILE__, __LINE__, r->err, sizeof r->err);
      r->mpi[i] = MPI_REQUEST_NULL;
      r->status = -1;
      break;
    }
    if (!flag) {
      pending = 1;
    } else if (i == 0 && r->op == COMM_RECV) {
      int got = 0;
      MPI_Get_count(&st, MPI_BYTE, &got);
      size_t want = r->n_elems * comm_dtype_size(r->dtype);
      if ((size_t)got != want) {
        snprintf(r->err, sizeof r->err, "rank %d: received %d bytes from group rank %d (world rank %d), "
                 "expected %zu", ctx.rank, got, r->peer, r->group->ranks[r->peer], want);
        r->status = -1;
      }
    }
  }
  if (r->status == 0 && pending) {
    *done = 0;
    return;
  }
  /* A checked recv: the sender's view of the message says more than a size mismatch. */
  if (r->status && r->op == COMM_RECV && r->checked && r->mpi[1] != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Test(&r->mpi[1], &flag, MPI_STATUS_IGNORE);
  }
  if (r->op == COMM_RECV && r->checked && r->mpi[1] == MPI_REQUEST_NULL &&
      comm_check_p2p(r, r->err, sizeof r->err))
    r->status = -1;
  if (r->status) {
    fail_context(r);
    abandon(r);
  }
  *done = 1;
}

const struct comm_backend comm_mpi_backend = {
  .name = "mpi",
  .group_open = mpi_group_open,
  .group_close = mpi_group_close,
  .validate = mpi_validate,
  .start = mpi_start,
  .progress = mpi_progress,
};
