/* From the mesh to process groups (docs/design.md, "The mesh"), the start-of-run plan-hash check,
 * and the status agreement. All are collective; all end with every rank holding the same verdict,
 * so a failure on one rank cannot leave the others waiting in a later collective. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "mesh/mesh.h"

#define ctx comm_ctx

static void format_ranks(const int *ranks, int n, char *out, size_t size)
{
  size_t len = 0;
  out[0] = 0;
  for (int i = 0; i < n && len < size; i++)
    len += (size_t)snprintf(out + len, size - len, "%s%d", i ? " " : "", ranks[i]);
}

/* Splits the world along axis a and compares the members with the mesh's. */
static int build_axis(const struct plan_mesh *m, enum plan_axis a, int *members, struct comm_group **out,
                      char *err, size_t n)
{
  int coord[PLAN_N_AXES];
  mesh_coords(m, ctx.rank, coord);
  if (comm_group_split(ctx.world, mesh_group_index(m, a, ctx.rank), coord[a], plan_axis_name(a), out, err, n))
    return -1;
  if (!members)
    return snprintf(err, n, "rank %d: out of memory", ctx.rank), -1;
  int k = mesh_group_members(m, a, ctx.rank, members);
  if (k == (*out)->size && !memcmp(members, (*out)->ranks, (size_t)k * sizeof *members))
    return 0;
  char got[256], want[256];
  format_ranks((*out)->ranks, (*out)->size, got, sizeof got);
  format_ranks(members, k, want, sizeof want);
  return snprintf(err, n, "rank %d: the %s group from MPI_Comm_split holds ranks %s, the mesh says %s",
                  ctx.rank, plan_axis_name(a), got, want), -1;
}

int comm_build_mesh_groups(const struct plan_mesh *m, struct comm_group *groups[PLAN_N_AXES], char *err, size_t n)
{
  for (int a = 0; a < PLAN_N_AXES; a++)
    groups[a] = NULL;
  if (!ctx.initialized)
    return snprintf(err, n, "comm_build_mesh_groups: comm_init has not run"), -1;
  if (!m || m->tp < 1 || m->dp < 1 || m->pp < 1 || (long long)m->tp * m->dp * m->pp != m->world)
    return snprintf(err, n, "comm_build_mesh_groups: the mesh is not tp × dp × pp = world"), -1;
  if (m->world != ctx.size)
    return snprintf(err, n, "the plan's mesh is tp %d × dp %d × pp %d = %d ranks, but the job has %d",
                    m->tp, m->dp, m->pp, m->world, ctx.size), -1;
  /* Every axis in the same order on every rank, even after a local failure: MPI_Comm_split is
   * collective. The first failure's message is kept. */
  int *members = malloc((size_t)m->world * sizeof *members), status = 0;
  char later[COMM_ERR_MAX];
  for (int a = 0; a < PLAN_N_AXES; a++)
    status |= build_axis(m, (enum plan_axis)a, members, &groups[a], status ? later : err,
                         status ? sizeof later : n);
  free(members);

  int first_failed = status ? ctx.rank : INT_MAX, any;
  comm_control_begin("mesh groups verdict");
  int rc = MPI_Allreduce(&first_failed, &any, 1, MPI_INT, MPI_MIN, ctx.world->state->ctl);
  comm_control_end();
  if (rc != MPI_SUCCESS)
    return comm_mpi_fail(rc, "MPI_Allreduce", __FILE__, __LINE__, err, n);
  if (any != INT_MAX && !status)
    snprintf(err, n, "building the mesh groups failed on rank %d (see its message)", any);
  if (any == INT_MAX)
    return 0;
  for (int a = 0; a < PLAN_N_AXES; a++)
    groups[a] = NULL; /* still held in the context; freed by comm_finalize */
  return -1;
}

/* "0-2 5 7-9" */
int comm_free_mesh_groups(struct comm_group *groups[PLAN_N_AXES], char *err, size_t n)
{
  int status = 0;
  char why[COMM_ERR_MAX];
  for (int a = 0; a < PLAN_N_AXES; a++) { /* the same order on every rank */
    if (comm_group_free(groups[a], why, sizeof why) && !status)
      status = (snprintf(err, n, "%s", why), -1);
    else
      groups[a] = NULL;
  }
  return status;
}

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

int comm_agree_err(struct comm_group *g, int status, char *err, size_t err_size, int name_rank)
{
  if (!g || g->size == 1)
    return status;
  char msg[COMM_AGREE_MSG_MAX];
  snprintf(msg, sizeof msg, "%s", status ? err : "");
  int failed_rank, agreed = comm_agree(g, status, msg, sizeof msg, &failed_rank);
  if (agreed < 0) {
    snprintf(err, err_size, "%s", msg);
    return -1;
  }
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
  comm_control_begin("status agreement");
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
