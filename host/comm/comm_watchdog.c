/* The watchdog (docs/design.md, "Collectives"): a thread that turns an operation outliving
 * TYCHO_COMM_TIMEOUT into a diagnosis and a clean abort of the job, never a silent hang. Every tick
 * it also answers peers' questions ("where are you on group dp?") on its own communicator, so a
 * rank stuck in a collective can say which peers never arrived and what they are doing instead:
 * waiting elsewhere, computing, or not answering at all (exited or dead). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

#define ctx comm_ctx

#define TAG_QUERY 10
#define TAG_REPLY 11
#define REPLY_MAX 400
#define TICK_SECONDS 0.1
#define ANSWER_SECONDS 2.0 /* how long a stuck rank waits for its peers' answers */
#define LAST_RECORDS 8
#define DEFER_SECONDS 10.0 /* how long a rank waits for a lower stuck peer's abort before its own */

void comm_control_begin(const char *what)
{
  comm_control_begin_on(what, NULL);
}

void comm_control_begin_on(const char *what, const struct comm_group *group)
{
  pthread_mutex_lock(&ctx.lock);
  ctx.control.what = what;
  ctx.control.group = group;
  ctx.control.t_begin = comm_now();
  ctx.control.active = 1;
  ctx.control.untimed = 0;
  ctx.ops_started++;
  pthread_mutex_unlock(&ctx.lock);
}

void comm_control_begin_untimed(const char *what, const struct comm_group *group)
{
  comm_control_begin_on(what, group);
  pthread_mutex_lock(&ctx.lock);
  ctx.control.untimed = 1;
  pthread_mutex_unlock(&ctx.lock);
}

void comm_control_end(void)
{
  pthread_mutex_lock(&ctx.lock);
  ctx.control.active = 0;
  pthread_mutex_unlock(&ctx.lock);
}

/* The oldest in-flight operation, on group g (or on any group when g is NULL). Under lock. */
static const struct comm_request *oldest_inflight(const struct comm_group *g)
{
  const struct comm_request *oldest = NULL;
  for (const struct comm_request *r = ctx.inflight; r; r = r->next_inflight)
    if ((!g || r->group == g) && (!oldest || r->rec.t_issue < oldest->rec.t_issue))
      oldest = r;
  return oldest;
}

/* This rank's answer to "where are you on the group named `name`?". */
static void answer_line(const char *name, char *out, size_t n)
{
  double now = comm_now();
  size_t len = 0;
  pthread_mutex_lock(&ctx.lock);
  const struct comm_group *g = NULL;
  for (int i = 0; i < ctx.n_groups && !g; i++)
    if (!strcmp(ctx.groups[i]->name, name))
      g = ctx.groups[i];
  const struct comm_request *here = g ? oldest_inflight(g) : NULL, *any = oldest_inflight(NULL);
  if (!g) {
    len = (size_t)snprintf(out, n, "rank %d: holds no group named %s", ctx.rank, name);
  } else if (here) {
    len = (size_t)snprintf(out, n, "rank %d: in %s %s seq %llu (%zu bytes) for %.1f s", ctx.rank, name,
                           comm_op_name(here->op), (unsigned long long)here->rec.seq, here->rec.n_bytes,
                           now - here->rec.t_issue);
  } else {
    const struct comm_record *last = &g->state->last_done;
    if (g->state->has_last_done)
      len = (size_t)snprintf(out, n, "rank %d: not in a %s operation; its last, %s seq %llu, ended %.1f s ago",
                             ctx.rank, name, comm_op_name(last->op), (unsigned long long)last->seq,
                             now - last->t_end);
    else
      len = (size_t)snprintf(out, n, "rank %d: has started no %s operation", ctx.rank, name);
    if (len < n && any)
      snprintf(out + len, n - len, "; it waits in %s %s seq %llu for %.1f s", any->group->name,
               comm_op_name(any->op), (unsigned long long)any->rec.seq, now - any->rec.t_issue);
    else if (len < n && ctx.control.active) /* untimed: its watchdog will not end the job (ask_peers) */
      snprintf(out + len, n - len, ctx.control.untimed ? "; it waits, untimed, in %s for %.1f s" : "; it waits in %s for %.1f s",
               ctx.control.what, now - ctx.control.t_begin);
    else if (len < n)
      snprintf(out + len, n - len, "; it is in no comm operation (computing, or stuck outside comm)");
  }
  pthread_mutex_unlock(&ctx.lock);
}

static void answer_queries(void)
{
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, ctx.watch, &flag, &st) != MPI_SUCCESS || !flag)
      return;
    char name[COMM_NAME_MAX + 1] = "", reply[REPLY_MAX];
    if (MPI_Recv(name, COMM_NAME_MAX, MPI_CHAR, st.MPI_SOURCE, TAG_QUERY, ctx.watch, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    answer_line(name, reply, sizeof reply);
    MPI_Send(reply, (int)strlen(reply) + 1, MPI_CHAR, st.MPI_SOURCE, TAG_REPLY, ctx.watch);
  }
}

static void sleep_seconds(double s)
{
  struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* Asks every other member of g where it is and appends the answers to out. *lower_stuck is set
 * when a peer with a lower world rank answered that it waits too, in an operation on g or
 * elsewhere in comm, timed: its own watchdog will abort the job. (A peer in an untimed wait, the
 * REPL's between chunks, never does: left to it, a chunk that leaves it out would hang.) */
static size_t ask_peers(const struct comm_group *g, char *out, size_t n, int *lower_stuck)
{
  *lower_stuck = 0;
  size_t len = (size_t)snprintf(out, n, "  %s group: world ranks", g->name);
  for (int i = 0; i < g->size && len < n; i++)
    len += (size_t)snprintf(out + len, n - len, " %d", g->ranks[i]);
  if (len < n)
    len += (size_t)snprintf(out + len, n - len, "; asking the others where they are:\n");
  char (*replies)[REPLY_MAX] = calloc((size_t)g->size, REPLY_MAX);
  MPI_Request *sends = calloc((size_t)g->size, sizeof *sends);
  if (!replies || !sends) {
    free(replies);
    free(sends);
    return len;
  }
  char name[COMM_NAME_MAX] = "";
  snprintf(name, sizeof name, "%s", g->name);
  int waiting = 0;
  for (int i = 0; i < g->size; i++) {
    sends[i] = MPI_REQUEST_NULL;
    if (i != g->rank && MPI_Isend(name, COMM_NAME_MAX, MPI_CHAR, g->ranks[i], TAG_QUERY, ctx.watch, &sends[i]) == MPI_SUCCESS)
      waiting++;
  }
  double deadline = comm_now() + ANSWER_SECONDS;
  while (waiting > 0 && comm_now() < deadline) {
    answer_queries(); /* peers stuck alike ask us too */
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_REPLY, ctx.watch, &flag, &st) != MPI_SUCCESS || !flag) {
      sleep_seconds(0.01);
      continue;
    }
    char reply[REPLY_MAX] = "";
    MPI_Recv(reply, REPLY_MAX, MPI_CHAR, st.MPI_SOURCE, TAG_REPLY, ctx.watch, MPI_STATUS_IGNORE);
    reply[REPLY_MAX - 1] = 0;
    char stuck_alike[COMM_NAME_MAX + 64];
    snprintf(stuck_alike, sizeof stuck_alike, "rank %d: in %s ", st.MPI_SOURCE, name);
    for (int i = 0; i < g->size; i++)
      if (g->ranks[i] == st.MPI_SOURCE && !replies[i][0] && i != g->rank) {
        snprintf(replies[i], REPLY_MAX, "%s", reply);
        waiting--;
        if (st.MPI_SOURCE < ctx.rank &&
            (!strncmp(reply, stuck_alike, strlen(stuck_alike)) || strstr(reply, "; it waits in ")))
          *lower_stuck = 1;
      }
  }
  for (int i = 0; i < g->size && len < n; i++)
    if (i != g->rank)
      len += (size_t)(replies[i][0] ? snprintf(out + len, n - len, "    %s\n", replies[i])
                                    : snprintf(out + len, n - len, "    rank %d: no answer within %.0f s "
                                               "(exited, dead, or its watchdog is blocked)\n",
                                               g->ranks[i], ANSWER_SECONDS));
  free(replies);
  free(sends); /* the queries are abandoned: the job ends next */
  return len;
}

static size_t last_records(char *out, size_t n)
{
  struct comm_record recs[LAST_RECORDS];
  pthread_mutex_lock(&ctx.lock);
  int k = comm_recorder_last(recs, LAST_RECORDS);
  pthread_mutex_unlock(&ctx.lock);
  size_t len = (size_t)snprintf(out, n, "  last %d operations on this rank (seq op group bytes step mb "
                                "issued started ended, seconds):\n", k);
  for (int i = 0; i < k && len < n; i++) {
    const struct comm_record *r = &recs[i];
    char end[32];
    snprintf(end, sizeof end, r->t_end > 0 ? "%.3f" : "in flight", r->t_end);
    len += (size_t)snprintf(out + len, n - len, "    %llu %s %s %zu %lld %d %.3f %.3f %s%s\n",
                            (unsigned long long)r->seq, comm_op_name(r->op), r->group, r->n_bytes, r->step,
                            r->mb, r->t_issue, r->t_start, end, r->status ? " failed" : "");
  }
  return len;
}

/* Prints the diagnosis in one write, so ranks' reports do not interleave, and ends the job.
 * When a lower-ranked peer is stuck in the same group it will diagnose and abort too; this rank
 * then leaves both to it (one diagnosis per job, not one per stuck rank) and only prints its own
 * and aborts if still alive DEFER_SECONDS later. One MPI_Abort per job
 * instead of one per stuck rank: Open MPI 4.1's launcher can crash or hang in its own teardown
 * (PMIx_server_finalize) when several ranks abort at once next to a rank that already finalized. */
static void diagnose_and_abort(const struct comm_record *stuck, const struct comm_group *g,
                               const char *control, double age, double timeout)
{
  size_t n = 16384, len;
  char *out = malloc(n);
  if (!out) {
    fprintf(stderr, "tycho: rank %d: comm watchdog: an operation has not finished after %.1f s; aborting\n",
            ctx.rank, age);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (stuck)
    len = (size_t)snprintf(out, n, "tycho: rank %d: comm watchdog: %s on %s (seq %llu, %zu bytes, step %lld, "
                           "mb %d) has not finished after %.1f s (TYCHO_COMM_TIMEOUT=%g); aborting the job\n",
                           ctx.rank, comm_op_name(stuck->op), stuck->group, (unsigned long long)stuck->seq,
                           stuck->n_bytes, stuck->step, stuck->mb, age, timeout);
  else
    len = (size_t)snprintf(out, n, "tycho: rank %d: comm watchdog: %s has not finished after %.1f s "
                           "(TYCHO_COMM_TIMEOUT=%g); aborting the job\n", ctx.rank, control, age, timeout);
  int lower_stuck = 0;
  if (g && g->size > 1 && len < n)
    len += ask_peers(g, out + len, n - len, &lower_stuck);
  if (len < n)
    len += last_records(out + len, n - len);
  if (lower_stuck) {
    double until = comm_now() + DEFER_SECONDS;
    while (comm_now() < until) {
      answer_queries();
      sleep_seconds(0.05);
    }
    fputs(out, stderr);
    fprintf(stderr, "tycho: rank %d: comm watchdog: the job did not end %.0f s after the diagnosis; aborting\n",
            ctx.rank, DEFER_SECONDS);
  } else {
    fputs(out, stderr);
  }
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  abort(); /* MPI_Abort does not return */
}

static void *watchdog_main(void *arg)
{
  (void)arg;
  pthread_mutex_lock(&ctx.lock);
  while (!ctx.stop_watchdog) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)(TICK_SECONDS * 1e9);
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&ctx.wake_watchdog, &ctx.lock, &until);
    if (ctx.stop_watchdog)
      break;
    double now = comm_now(), timeout = ctx.timeout;
    const struct comm_request *r = oldest_inflight(NULL);
    struct comm_record stuck = r ? r->rec : (struct comm_record){ 0 };
    const struct comm_group *g = r ? r->group : NULL;
    const char *control = ctx.control.active && !ctx.control.untimed ? ctx.control.what : NULL;
    const struct comm_group *control_group = ctx.control.group;
    double control_age = now - ctx.control.t_begin;
    pthread_mutex_unlock(&ctx.lock);

    answer_queries();
    if (timeout > 0 && r && now - stuck.t_issue > timeout)
      diagnose_and_abort(&stuck, g, NULL, now - stuck.t_issue, timeout);
    if (timeout > 0 && control && control_age > timeout)
      diagnose_and_abort(NULL, control_group, control, control_age, timeout);
    pthread_mutex_lock(&ctx.lock);
  }
  pthread_mutex_unlock(&ctx.lock);
  return NULL;
}

int comm_watchdog_start(char *err, size_t err_size)
{
  ctx.stop_watchdog = 0;
  if (pthread_create(&ctx.watchdog, NULL, watchdog_main, NULL))
    return snprintf(err, err_size, "rank %d: cannot start the comm watchdog", ctx.rank), -1;
  return 0;
}

void comm_watchdog_stop(void)
{
  pthread_mutex_lock(&ctx.lock);
  ctx.stop_watchdog = 1;
  pthread_cond_signal(&ctx.wake_watchdog);
  pthread_mutex_unlock(&ctx.lock);
  pthread_join(ctx.watchdog, NULL);
}
