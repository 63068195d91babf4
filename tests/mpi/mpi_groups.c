/* Groups have a life cycle: one process builds the mesh groups of one layout, uses them, frees
 * them, and builds another layout's on the same world, with nothing left over (the count of
 * groups held goes back to 1, the world), as a trainer that closes one plan and opens another
 * needs. Freeing is refused, with the reason, for the world and for a group with an operation
 * in flight (a receive whose send has not come), and works once that operation is done.
 * Run on 4 ranks. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "mpi_check.h"

static int rank, world;
static char err[1024];

static struct plan_mesh mesh_of(int tp, int pp)
{
  struct plan_mesh m = { 0 };
  m.world = world;
  m.tp = tp;
  m.pp = pp;
  m.dp = world / (tp * pp);
  m.order[0] = PLAN_AXIS_TP;
  m.order[1] = PLAN_AXIS_DP;
  m.order[2] = PLAN_AXIS_PP;
  m.order[3] = PLAN_AXIS_CP; /* m.cp 0: one rank */
  return m;
}

/* Σ over group g of (world rank + 1), against the members' sum. */
static void sum_is_right(struct comm_group *g)
{
  int64_t mine = rank + 1, sum = 0, want = 0;
  CHECK_MSG(comm_all_reduce(g, &mine, &sum, 1, COMM_INT64, COMM_SUM, NULL) == 0, "%s", comm_error());
  for (int i = 0; i < g->size; i++) want += g->ranks[i] + 1;
  CHECK_MSG(sum == want, "rank %d: all-reduce on %s gave %lld, expected %lld", rank, g->name, (long long)sum,
            (long long)want);
}

static void test_build_free_build_again(void)
{
  CHECK(comm_groups_held() == 1);
  struct comm_group *groups[PLAN_N_AXES];
  const int layouts[][2] = { { 2, 1 }, { 1, 2 }, { 2, 2 }, { 1, 1 } };
  for (int k = 0; k < 4; k++) {
    struct plan_mesh m = mesh_of(layouts[k][0], layouts[k][1]);
    CHECK_MSG(comm_build_mesh_groups(&m, groups, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(comm_groups_held() == 1 + PLAN_N_AXES, "rank %d: %d groups held with one mesh's", rank,
              comm_groups_held());
    for (int a = 0; a < PLAN_N_AXES; a++)
      sum_is_right(groups[a]);
    CHECK_MSG(comm_free_mesh_groups(groups, err, sizeof err) == 0, "%s", err);
    for (int a = 0; a < PLAN_N_AXES; a++)
      CHECK(groups[a] == NULL);
    CHECK_MSG(comm_groups_held() == 1, "rank %d: %d groups held after freeing the mesh's", rank,
              comm_groups_held());
  }
  if (rank == 0)
    printf("4 layouts built, used and freed in one process; 1 group (the world) held after each\n");
}

static void test_free_refuses_the_world_and_a_busy_group(void)
{
  CHECK(comm_group_free(comm_world(), err, sizeof err) == -1);
  CHECK_STR_CONTAINS(err, "the world group lives until comm_finalize");
  struct comm_group *pair;
  CHECK_MSG(comm_group_split(comm_world(), rank / 2, rank, "pair", &pair, err, sizeof err) == 0, "%s", err);
  /* rank 1 of each pair receives before rank 0 sends: its receive is in flight until the agreement
   * below lets rank 0 send */
  int64_t x = 7, got = 0;
  struct comm_request *req = NULL;
  if (pair->rank == 1) {
    CHECK(comm_recv(pair, &got, 1, COMM_INT64, 0, &req) == 0);
    CHECK(comm_group_free(pair, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "comm_group_free pair: 1 operation in flight; wait for them first");
  }
  int failed_rank;
  comm_agree(comm_world(), 0, err, sizeof err, &failed_rank);
  if (pair->rank == 0)
    CHECK(comm_send(pair, &x, 1, COMM_INT64, 1, NULL) == 0);
  CHECK(comm_wait(&req) == 0);
  CHECK(pair->rank == 0 || got == 7);
  CHECK_MSG(comm_group_free(pair, err, sizeof err) == 0, "%s", err);
  CHECK(comm_groups_held() == 1);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  world = comm_world()->size;
  if (world != 4)
    comm_fatal("mpi_groups runs on 4 ranks");
  static const struct test_case tests[] = { TEST(test_build_free_build_again),
                                            TEST(test_free_refuses_the_world_and_a_busy_group) };
  int rc = mpi_test_run_all(tests, 2);
  comm_finalize(err, sizeof err);
  return rc;
}
