/* The start-of-run plan-hash check, the status agreement and the world's first-failure verdict.
 * All are collective; all end with every rank holding the same verdict, so a failure on one rank
 * cannot leave the others waiting in a later collective. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

#define ctx comm_ctx

int comm_world_first_failed(int status, const char *what, int *first, char *err, size_t n)
{
  int mine = status ? ctx.rank : INT_MAX;
  *first = INT_MAX;
  comm_control_begin(what);
  int rc = MPI_Allreduce(&mine, first, 1, MPI_INT, MPI_MIN, ctx.world->state->ctl);
  comm_control_end();
  if (rc != MPI_SUCCESS)
    return comm_mpi_fail(rc, "MPI_Allreduce", __FILE__, __LINE__, err, n);
  return 0;
}

/* "0-2 5 7-9" */
static size_t format_rank_ranges(const uint64_t *all, int size, uint64_t hash, int *count, char *out, size_t n)
{
  size_t len = 0;
  *count = 0;
  out[0] = 0;
  for (int i = 0; i < size; i++) {
    if (all[i] != hash)
      continue;
    int j = i;
    while (j + 1 < size && all[j + 1] == hash)
      j++;
    *count += j - i + 1;
    if (len < n)
      len += (size_t)(j > i ? snprintf(out + len, n - len, "%s%d-%d", len ? "," : "", i, j)
                            : snprintf(out + len, n - len, "%s%d", len ? "," : "", i));
    i = j;
  }
  return len;
}

int comm_check_plan_hash(uint64_t hash, char *err, size_t n)
{
  if (!ctx.initialized)
    return snprintf(err, n, "comm_check_plan_hash: comm_init has not run"), -1;
  if (comm_restricted_check(ctx.world, "the plan-hash check", err, n))
    return -1;
  uint64_t *all = malloc((size_t)ctx.size * sizeof *all);
  if (!all)
    return snprintf(err, n, "rank %d: out of memory", ctx.rank), -1;
  comm_control_begin("plan-hash check");
  int rc = MPI_Allgather(&hash, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, ctx.world->state->ctl);
  comm_control_end();
  if (rc != MPI_SUCCESS) {
    free(all);
    return comm_mpi_fail(rc, "MPI_Allgather", __FILE__, __LINE__, err, n);
  }
  int differ = 0;
  for (int i = 1; i < ctx.size; i++)
    differ |= all[i] != all[0];
  if (!differ) {
    free(all);
    return 0;
  }
  /* Each distinct hash once, in the order of its first rank; at most four, then a count. */
  size_t len = (size_t)snprintf(err, n, "plan hash differs:");
  int shown = 0, distinct = 0;
  for (int i = 0; i < ctx.size; i++) {
    int seen = 0;
    for (int j = 0; j < i && !seen; j++)
      seen = all[j] == all[i];
    if (seen)
      continue;
    distinct++;
    if (shown == 4 || len >= n)
      continue;
    char ranks[256];
    int count;
    format_rank_ranges(all, ctx.size, all[i], &count, ranks, sizeof ranks);
    len += (size_t)snprintf(err + len, n - len, "%s %s %s %s %016" PRIx64, shown ? "," : "",
                            count > 1 ? "ranks" : "rank", ranks, count > 1 ? "have" : "has", all[i]);
    shown++;
  }
  if (distinct > shown && len < n)
    snprintf(err + len, n - len, ", and %d other hashes", distinct - shown);
  free(all);
  return -1;
}

int comm_agree_err(struct comm_group *g, int status, char *err, size_t err_size, enum comm_agree_naming naming)
{
  if (!g || g->size == 1)
    return status;
  char msg[COMM_AGREE_MSG_MAX];
  snprintf(msg, sizeof msg, "%s", status ? err : "");
  int failed_rank, agreed = comm_agree(g, status, msg, sizeof msg, &failed_rank);
  if (agreed && failed_rank < 0) { /* the agreement itself failed (a status may be negative too) */
    snprintf(err, err_size, "%s", msg);
    return -1;
  }
  const int name_rank = naming == COMM_AGREE_NAME_RANK ||
                        (naming == COMM_AGREE_NAME_RANK_UNLESS_PLAN && agreed != COMM_AGREE_PLAN_ERROR);
  if (agreed && name_rank && failed_rank >= 0)
    snprintf(err, err_size, "rank %d: %.*s", failed_rank, (int)(err_size > 16 ? err_size - 16 : 0), msg);
  else if (agreed)
    snprintf(err, err_size, "%s", msg);
  return agreed;
}

int comm_agree(struct comm_group *g, int status, char *msg, size_t msg_size, int *failed_rank)
{
  *failed_rank = -1;
  if (!ctx.initialized || !g || !g->state)
    return snprintf(msg, msg_size, "comm_agree: %s", ctx.initialized ? "no group" : "comm_init has not run"), -1;
  if (comm_restricted_check(g, "an agreement", msg, msg_size))
    return -1;
  int mine = status ? g->rank : INT_MAX, first = INT_MAX;
  comm_control_begin_on("status agreement", g); /* on g: a timeout asks g's others where they are */
  int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, g->state->ctl);
  if (rc == MPI_SUCCESS && first != INT_MAX) {
    struct { int status; char msg[COMM_AGREE_MSG_MAX]; } verdict = { status, "" };
    if (first == g->rank)
      snprintf(verdict.msg, sizeof verdict.msg, "%s", msg);
    rc = MPI_Bcast(&verdict, (int)sizeof verdict, MPI_BYTE, first, g->state->ctl);
    if (rc == MPI_SUCCESS) {
      snprintf(msg, msg_size, "%s", verdict.msg);
      status = verdict.status;
      *failed_rank = g->ranks[first];
    }
  }
  comm_control_end();
  if (rc != MPI_SUCCESS)
    return comm_mpi_fail(rc, "MPI_Allreduce or MPI_Bcast", __FILE__, __LINE__, msg, msg_size);
  return first == INT_MAX ? 0 : status;
}
