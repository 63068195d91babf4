/* Which ranks may take part in operations now (comm_restrict), and the REPL's control plane:
 * a chunk's bytes broadcast, every rank's output gathered, on a group of their own (not counted
 * as model traffic; an idle wait is not timed, and the wait for the next chunk sleeps). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

#define ctx comm_ctx

static unsigned char *allowed; /* (ctx.size) 1: may take part; NULL: every rank */
static char allowed_text[256];

void comm_format_ranks(const unsigned char *flags, int n, char *out, size_t size)
{
  size_t len = 0;
  out[0] = 0;
  for (int i = 0; i < n && len + 1 < size;) {
    if (!flags[i]) {
      i++;
      continue;
    }
    int j = i;
    while (j + 1 < n && flags[j + 1])
      j++;
    len += (size_t)snprintf(out + len, size - len, j == i ? "%s%d" : j == i + 1 ? "%s%d,%d" : "%s%d-%d",
                            len ? "," : "", i, j);
    i = j + 1;
  }
}

int comm_restrict(const unsigned char *members, int n_members)
{
  free(allowed);
  allowed = NULL;
  allowed_text[0] = 0;
  if (!members)
    return 0;
  if (!ctx.initialized || n_members != ctx.size)
    return -1;
  allowed = malloc((size_t)ctx.size);
  if (!allowed)
    return -1;
  memcpy(allowed, members, (size_t)ctx.size);
  comm_format_ranks(allowed, ctx.size, allowed_text, sizeof allowed_text);
  return 0;
}

int comm_restricted_check(const struct comm_group *g, const char *what, char *err, size_t n)
{
  if (!allowed || !g)
    return 0;
  unsigned char *outside = calloc((size_t)ctx.size, 1);
  int any = 0;
  for (int i = 0; i < g->size; i++)
    if (!allowed[g->ranks[i]]) {
      any = 1;
      if (outside)
        outside[g->ranks[i]] = 1;
    }
  if (!any) {
    free(outside);
    return 0;
  }
  char out_text[256] = "";
  if (outside)
    comm_format_ranks(outside, ctx.size, out_text, sizeof out_text);
  free(outside);
  snprintf(err, n, "%s on group %s needs ranks %s, which this chunk does not run on (it runs on %s): "
           "a collective reached by part of its group would wait forever, so it is refused; run it on "
           "every rank of the group", what, g->name, out_text, allowed_text);
  return -1;
}

/* ---- the REPL's control plane ---- */

/* Waits for r without spinning: MPI's own wait polls a core flat out for as long as the user
 * takes to type. Tested, then slept for 50 us doubling up to 20 ms: a chunk starts at most a
 * tick late, and an idle rank wakes 50 times a second. */
static int wait_sleeping(MPI_Request *r)
{
  long ns = 50000;
  for (;;) {
    int done = 0;
    int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done)
      return rc;
    struct timespec ts = { 0, ns };
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
    ns = ns * 2 > 20000000L ? 20000000L : ns * 2;
  }
}

static int control_bcast(struct comm_group *g, void *buf, size_t n_bytes, int root, const char *what, int timed,
                         char *err, size_t n)
{
  if (!ctx.initialized || !g || !g->state)
    return snprintf(err, n, "comm_control_bcast: no group"), -1;
  if (n_bytes > (size_t)INT32_MAX)
    return snprintf(err, n, "comm_control_bcast: %zu bytes is more than one message takes", n_bytes), -1;
  /* a REPL wait between chunks lasts as long as another rank's chunk or the user: named, never
   * timed (a rank stuck in a timed wait is diagnosed, and its diagnosis names this one) */
  if (timed)
    comm_control_begin_on(what, g);
  else
    comm_control_begin_untimed(what ? what : "the REPL, waiting for the next chunk", g);
  int rc;
  if (what) {
    rc = MPI_Bcast(buf, (int)n_bytes, MPI_BYTE, root, g->state->ctl);
  } else {
    MPI_Request r = MPI_REQUEST_NULL;
    rc = MPI_Ibcast(buf, (int)n_bytes, MPI_BYTE, root, g->state->ctl, &r);
    if (rc == MPI_SUCCESS)
      rc = wait_sleeping(&r);
  }
  comm_control_end();
  return rc == MPI_SUCCESS ? 0 : comm_mpi_fail(rc, what ? "MPI_Bcast" : "MPI_Ibcast", __FILE__, __LINE__, err, n);
}

int comm_control_bcast(struct comm_group *g, void *buf, size_t n_bytes, int root, const char *what,
                       char *err, size_t n)
{
  return control_bcast(g, buf, n_bytes, root, what, 0, err, n);
}

int comm_control_bcast_timed(struct comm_group *g, void *buf, size_t n_bytes, int root, const char *what,
                             char *err, size_t n)
{
  return control_bcast(g, buf, n_bytes, root, what ? what : "a control broadcast", 1, err, n);
}

int comm_control_gather(struct comm_group *g, const void *send, size_t n_bytes, int root, char **per_rank,
                        size_t *counts, const char *what, char *err, size_t n)
{
  enum { CHUNK = 1 << 16, TAG = 7 };
  if (!ctx.initialized || !g || !g->state)
    return snprintf(err, n, "comm_control_gather: no group"), -1;
  if (n_bytes > (size_t)INT32_MAX)
    return snprintf(err, n, "comm_control_gather: %zu bytes is more than one message takes", n_bytes), -1;
  const int size = g->size, me = g->rank;
  int mine = (int)n_bytes;
  int *sizes = me == root ? calloc((size_t)size, sizeof *sizes) : NULL;
  static int sizes_spare[1]; /* a root without room for the sizes still takes part */
  /* the wait is as long as the slowest rank's chunk: named, never timed */
  comm_control_begin_untimed(what ? what : "the REPL's end-of-chunk gather (waiting for the other ranks' chunk)", g);
  int rc = MPI_Gather(&mine, 1, MPI_INT, sizes ? sizes : sizes_spare, 1, MPI_INT, root, g->state->ctl);
  /* then the bytes, rank by rank, in chunks: a root that cannot hold one rank's output still
   * receives it (into a scratch block) and reports it lost, so nobody waits */
  static char scratch[CHUNK];
  if (rc == MPI_SUCCESS && me != root) {
    for (int at = 0; at < mine && rc == MPI_SUCCESS; at += CHUNK)
      rc = MPI_Send((const char *)send + at, mine - at < CHUNK ? mine - at : CHUNK, MPI_BYTE, root, TAG,
                    g->state->ctl);
  } else if (rc == MPI_SUCCESS) {
    for (int r = 0; r < size && rc == MPI_SUCCESS; r++) {
      const int bytes = r == me ? mine : sizes ? sizes[r] : 0;
      char *b = malloc((size_t)bytes + 1);
      if (r == me) {
        if (b)
          memcpy(b, send, (size_t)bytes);
      } else {
        for (int at = 0; at < bytes && rc == MPI_SUCCESS; at += CHUNK) {
          const int k = bytes - at < CHUNK ? bytes - at : CHUNK;
          rc = MPI_Recv(b ? b + at : scratch, k, MPI_BYTE, r, TAG, g->state->ctl, MPI_STATUS_IGNORE);
        }
      }
      if (b)
        b[bytes] = 0;
      per_rank[r] = b;
      counts[r] = b ? (size_t)bytes : 0;
    }
  }
  comm_control_end();
  free(sizes);
  if (rc != MPI_SUCCESS) {
    if (me == root)
      for (int r = 0; r < size; r++) {
        free(per_rank[r]);
        per_rank[r] = NULL;
      }
    return comm_mpi_fail(rc, "MPI_Gather or MPI_Send/Recv", __FILE__, __LINE__, err, n);
  }
  return 0;
}
