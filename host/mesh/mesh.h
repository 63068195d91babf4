/* The mesh (docs/design.md, "The mesh"): rank ↔ (tp, cp, dp, pp) coordinates and the process groups
 * along each axis, as a pure function of the compiled plan's mesh. `mesh.order` lists the axes from
 * fastest-varying (inside a node) to slowest; with the default { tp, cp, dp, pp } the ranks of a TP
 * group are consecutive, a cp group's next (its ring's hops cross tp groups only), and pipeline
 * stages are outermost; with cp = 1 the cp axis changes no rank. Every rank computes the same groups in
 * the same order, so the comm layer can build them with MPI_Comm_split. */
#ifndef TYCHO_MESH_H
#define TYCHO_MESH_H
#include <stddef.h>

#include "plan/plan.h"

/* Coordinates of `rank`, indexed by enum plan_axis. */
void mesh_coords(const struct plan_mesh *m, int rank, int coord[PLAN_N_AXES]);
int mesh_rank(const struct plan_mesh *m, const int coord[PLAN_N_AXES]);
int mesh_axis_size(const struct plan_mesh *m, enum plan_axis a);
/* Number of groups along axis a (world / size of a). */
int mesh_group_count(const struct plan_mesh *m, enum plan_axis a);
/* Index (0 .. count-1) of the group along axis a that holds `rank`: groups are numbered by
 * their lowest rank, in increasing order. */
int mesh_group_index(const struct plan_mesh *m, enum plan_axis a, int rank);
/* Members of the group along axis a holding `rank`, in coordinate order; returns the count. */
int mesh_group_members(const struct plan_mesh *m, enum plan_axis a, int rank, int *members);
/* The rank of step `stride` along axis a: e.g. rank 0's stride in tp is 1 with the default order. */
int mesh_axis_stride(const struct plan_mesh *m, enum plan_axis a);

struct comm_group;
/* Builds this rank's tp, dp, pp and cp groups (indexed by enum plan_axis) with the comm layer's
 * comm_group_split in the same order on every rank, and checks their members against
 * mesh_group_members. The mesh's world must equal the job's. Collective over the world
 * (mesh_groups.c). 0, or -1 with a message. */
int comm_build_mesh_groups(const struct plan_mesh *m, struct comm_group *groups[PLAN_N_AXES],
                           char *err, size_t err_size);
/* comm_group_free of every axis group (NULL entries skipped), which are NULL after; the first
 * failure's message in err. Collective over the world. 0, or -1. */
int comm_free_mesh_groups(struct comm_group *groups[PLAN_N_AXES], char *err, size_t err_size);

#endif
