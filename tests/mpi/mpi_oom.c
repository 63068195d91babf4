/* Out of memory on one rank is an error every rank gets, not a dead job and not a rank left
 * waiting alone. Two ranks train tests/plans/good/dp_small.lua with zero 3 (dp 2); then rank 1's
 * allocator is capped at what it holds (alloc_set_limit), so its share of gathering the whole
 * model (for export) cannot be allocated: both ranks return an error, with rank 1's message,
 * before any gather starts. With the cap lifted the same trainers gather, export and train on
 * (the failed call left them usable), and their losses equal a second pair's that never failed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mpi_check.h"
#include "plan_fixture.h"
#include "runtime/alloc.h"
#include "runtime/train.h"

static int rank;
static char err[2048];

static void test_a_gather_fails_on_every_rank_and_the_trainer_goes_on(void)
{
  const char *sets[] = { "zero=3" };
  struct plan p;
  if (fixture_compile("tests/plans/good/dp_small.lua", comm_world()->size, sets, 1, &p))
    return;
  struct comm_group *groups[PLAN_N_AXES];
  CHECK_MSG(comm_build_mesh_groups(&p.mesh, groups, err, sizeof err) == 0, "%s", err);
  struct trainer t, fresh;
  CHECK_MSG(trainer_open(&t, &p, groups, err, sizeof err) == TRAIN_OK, "%s", err);
  struct train_step_stats st, want;
  CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);

  if (rank == 1)
    alloc_set_limit(alloc_bill()->total_bytes);
  real *full = NULL;
  const double t0 = comm_now();
  const int rc = dp_gather_params(&t.dp, &full);
  alloc_set_limit(0);
  CHECK_MSG(rc == -1, "rank %d: the gather returned %d with rank 1 out of memory", rank, rc);
  CHECK_STR_CONTAINS(t.dp.err, "rank 1: out of memory gathering the parameters");
  CHECK(full == NULL);
  CHECK_MSG(comm_now() - t0 < 5.0, "rank %d: %.1f s to fail", rank, comm_now() - t0);
  if (rank == 0)
    printf("every rank: \"%s\" after %.3f s\n", t.dp.err, comm_now() - t0);

  /* usable again: the error state is the caller's to clear, then everything works */
  t.dp.failed = 0;
  t.dp.err[0] = 0;
  CHECK_MSG(dp_gather_params(&t.dp, &full) == 0, "%s", t.dp.err);
  CHECK((rank == 0) == (full != NULL));
  dp_gather_params_free(&t.dp, full);
  CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(trainer_open(&fresh, &p, groups, err, sizeof err) == TRAIN_OK, "%s", err);
  for (int s = 0; s < 2; s++)
    CHECK_MSG(trainer_step(&fresh, &want, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(st.loss == want.loss && st.grad_norm == want.grad_norm, "rank %d: step 1 loss %.17g, %.17g "
            "without the failure", rank, st.loss, want.loss);
  trainer_close(&fresh);
  trainer_close(&t);
  CHECK_MSG(comm_free_mesh_groups(groups, err, sizeof err) == 0, "%s", err);
  plan_free(&p);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  if (comm_world()->size != 2)
    comm_fatal("mpi_oom runs on 2 ranks");
  static const struct test_case tests[] = { TEST(test_a_gather_fails_on_every_rank_and_the_trainer_goes_on) };
  int rc = mpi_test_run_all(tests, 1);
  comm_finalize(err, sizeof err);
  return rc;
}
