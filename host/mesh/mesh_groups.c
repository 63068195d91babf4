/* From the mesh to process groups (docs/design.md, "The mesh"): this rank's group along each axis,
 * split from the world by the comm layer and checked against the mesh's own arithmetic (mesh.h).
 * Here rather than in comm/ so that the comm layer knows groups, not plans. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mesh/mesh.h"

#define MESH_ERR_MAX 512

static void format_ranks(const int *ranks, int n, char *out, size_t size)
{
  size_t len = 0;
  out[0] = 0;
  for (int i = 0; i < n && len < size; i++)
    len += (size_t)snprintf(out + len, size - len, "%s%d", i ? " " : "", ranks[i]);
}

/* Splits the world along axis a and compares the members with the mesh's. */
static int build_axis(struct comm_group *world, const struct plan_mesh *m, enum plan_axis a, int *members, struct comm_group **out,
                      char *err, size_t n)
{
  int coord[PLAN_N_AXES];
  mesh_coords(m, world->rank, coord);
  if (comm_group_split(world, mesh_group_index(m, a, world->rank), coord[a], plan_axis_name(a), out, err, n))
    return -1;
  if (!members)
    return snprintf(err, n, "rank %d: out of memory", world->rank), -1;
  int k = mesh_group_members(m, a, world->rank, members);
  if (k == (*out)->size && !memcmp(members, (*out)->ranks, (size_t)k * sizeof *members))
    return 0;
  char got[256], want[256];
  format_ranks((*out)->ranks, (*out)->size, got, sizeof got);
  format_ranks(members, k, want, sizeof want);
  return snprintf(err, n, "rank %d: the %s group from MPI_Comm_split holds ranks %s, the mesh says %s",
                  world->rank, plan_axis_name(a), got, want), -1;
}

int comm_build_mesh_groups(const struct plan_mesh *m, struct comm_group *groups[PLAN_N_AXES], char *err, size_t n)
{
  for (int a = 0; a < PLAN_N_AXES; a++)
    groups[a] = NULL;
  struct comm_group *world = comm_world();
  if (!world)
    return snprintf(err, n, "comm_build_mesh_groups: comm_init has not run"), -1;
  const int cp = m ? mesh_axis_size(m, PLAN_AXIS_CP) : 1;
  if (!m || m->tp < 1 || m->dp < 1 || m->pp < 1 || (long long)m->tp * cp * m->dp * m->pp != m->world)
    return snprintf(err, n, "comm_build_mesh_groups: the mesh is not tp × cp × dp × pp = world"), -1;
  if (m->world != world->size) {
    char cps[32] = "";
    if (cp > 1)
      snprintf(cps, sizeof cps, " × cp %d", cp);
    return snprintf(err, n, "the plan's mesh is tp %d%s × dp %d × pp %d = %d ranks, but the job has %d",
                    m->tp, cps, m->dp, m->pp, m->world, world->size), -1;
  }
  /* Every axis in the same order on every rank, even after a local failure: MPI_Comm_split is
   * collective. The first failure's message is kept. */
  int *members = malloc((size_t)m->world * sizeof *members), status = 0;
  char later[MESH_ERR_MAX];
  for (int a = 0; a < PLAN_N_AXES; a++)
    status |= build_axis(world, m, (enum plan_axis)a, members, &groups[a], status ? later : err,
                         status ? sizeof later : n);
  free(members);

  int any;
  if (comm_world_first_failed(status, "mesh groups verdict", &any, err, n) != 0)
    return -1;
  if (any != INT_MAX && !status)
    snprintf(err, n, "building the mesh groups failed on rank %d (see its message)", any);
  if (any == INT_MAX)
    return 0;
  for (int a = 0; a < PLAN_N_AXES; a++)
    groups[a] = NULL; /* still held in the context; freed by comm_finalize */
  return -1;
}

int comm_free_mesh_groups(struct comm_group *groups[PLAN_N_AXES], char *err, size_t n)
{
  int status = 0;
  char why[MESH_ERR_MAX];
  for (int a = 0; a < PLAN_N_AXES; a++) { /* the same order on every rank */
    if (comm_group_free(groups[a], why, sizeof why) && !status)
      status = (snprintf(err, n, "%s", why), -1);
    else
      groups[a] = NULL;
  }
  return status;
}

