/* The mesh: see mesh.h. */
#include "mesh.h"

int mesh_axis_size(const struct plan_mesh *m, enum plan_axis a)
{
  if (a == PLAN_AXIS_CP) /* 0 in a mesh written before the axis: one rank */
    return m->cp > 1 ? m->cp : 1;
  return a == PLAN_AXIS_TP ? m->tp : a == PLAN_AXIS_DP ? m->dp : m->pp;
}

int mesh_axis_stride(const struct plan_mesh *m, enum plan_axis a)
{
  int stride = 1;
  for (int i = 0; i < PLAN_N_AXES && m->order[i] != a; i++)
    stride *= mesh_axis_size(m, m->order[i]);
  return stride;
}

void mesh_coords(const struct plan_mesh *m, int rank, int coord[PLAN_N_AXES])
{
  for (int i = 0; i < PLAN_N_AXES; i++) {
    int size = mesh_axis_size(m, m->order[i]);
    coord[m->order[i]] = rank % size;
    rank /= size;
  }
}

int mesh_rank(const struct plan_mesh *m, const int coord[PLAN_N_AXES])
{
  int rank = 0;
  for (int i = PLAN_N_AXES - 1; i >= 0; i--)
    rank = rank * mesh_axis_size(m, m->order[i]) + coord[m->order[i]];
  return rank;
}

int mesh_group_count(const struct plan_mesh *m, enum plan_axis a)
{
  return m->world / mesh_axis_size(m, a);
}

int mesh_group_index(const struct plan_mesh *m, enum plan_axis a, int rank)
{
  /* Drop axis a's digit from the mixed-radix rank: the groups' lowest ranks are in the same
   * order as the remaining digits. */
  int coord[PLAN_N_AXES], index = 0;
  mesh_coords(m, rank, coord);
  for (int i = PLAN_N_AXES - 1; i >= 0; i--)
    if (m->order[i] != a)
      index = index * mesh_axis_size(m, m->order[i]) + coord[m->order[i]];
  return index;
}

int mesh_group_members(const struct plan_mesh *m, enum plan_axis a, int rank, int *members)
{
  int coord[PLAN_N_AXES], size = mesh_axis_size(m, a);
  mesh_coords(m, rank, coord);
  for (int i = 0; i < size; i++) {
    coord[a] = i;
    members[i] = mesh_rank(m, coord);
  }
  return size;
}
