/* Out of memory on one rank is an error every rank gets, not a dead job and not a rank left
 * waiting alone. Two ranks train tests/plans/good/dp_small.lua with zero 3 (dp 2); then rank 1's
 * allocator is capped at what it holds (alloc_set_limit), so its share of gathering the whole
 * model (for export) cannot be allocated: both ranks return an error, with rank 1's message,
 * before any gather starts. With the cap lifted the same trainers gather, export and train on
 * (the failed call left them usable), and their losses equal a second pair's that never failed.
 * Then the same for a failure at each allocation a ZeRO 2 or 3 step makes as it runs. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "mpi_check.h"
#include "plan_fixture.h"
#include "runtime/model/alloc.h"
#include "runtime/train/train.h"

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
  CHECK_STR_CONTAINS(t.fault.msg, "rank 1: out of memory gathering the parameters");
  CHECK(full == NULL);
  CHECK_MSG(comm_now() - t0 < 5.0, "rank %d: %.1f s to fail", rank, comm_now() - t0);
  if (rank == 0)
    printf("every rank: \"%s\" after %.3f s\n", t.fault.msg, comm_now() - t0);

  /* usable again: the error state is the caller's to clear, then everything works */
  trainer_clear_error(&t);
  CHECK_MSG(dp_gather_params(&t.dp, &full) == 0, "%s", t.fault.msg);
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

/* A step under ZeRO 2 or 3 allocates as it runs (gathered units, gradient buckets, reduce-scatter
 * outputs). Rank 1's allocator is made to refuse its k-th allocation of a step, for k = 0, 1, 2,
 * ... until a step needs fewer: every such step fails on both ranks with rank 1's message before
 * any rank enters a collective alone, gives back every block it took, and moves nothing (step
 * counter, parameters, optimizer state); after trainer_clear_error the same trainer steps on to the
 * losses and norms of a pair that never failed, bit for bit. */
static void fails_at_each_allocation_of_a_step(int zero)
{
  char set[16];
  snprintf(set, sizeof set, "zero=%d", zero);
  const char *sets[] = { set };
  struct plan p;
  if (fixture_compile("tests/plans/good/dp_small.lua", comm_world()->size, sets, 1, &p))
    return;
  struct comm_group *groups[PLAN_N_AXES];
  CHECK_MSG(comm_build_mesh_groups(&p.mesh, groups, err, sizeof err) == 0, "%s", err);
  struct trainer t, ref;
  CHECK_MSG(trainer_open(&t, &p, groups, err, sizeof err) == TRAIN_OK, "%s", err);
  CHECK_MSG(trainer_open(&ref, &p, groups, err, sizeof err) == TRAIN_OK, "%s", err);
  struct train_step_stats st, want;
  CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(trainer_step(&ref, &want, err, sizeof err) == 0, "%s", err);

  int failures = 0, gathers = 0, buckets = 0, outputs = 0, rc = 1;
  for (long k = 0; k < 1000 && rc; k++) {
    const size_t live = alloc_bill()->n_live;
    const long long step = t.step;
    if (rank == 1)
      alloc_fail_after(k);
    err[0] = '\0';
    const double t0 = comm_now();
    rc = trainer_step(&t, &st, err, sizeof err);
    alloc_fail_after(-1);
    if (!rc)
      break;
    failures++;
    CHECK_MSG(strstr(err, "rank 1: out of memory for ") != NULL, "zero %d, k %ld, rank %d: \"%s\"", zero, k,
              rank, err);
    gathers += strstr(err, "gathering the parameters of unit") != NULL;
    buckets += strstr(err, "a gradient bucket") != NULL;
    outputs += strstr(err, "a reduce-scatter output") != NULL;
    CHECK_MSG(comm_now() - t0 < 10.0, "rank %d: %.1f s to fail", rank, comm_now() - t0);
    CHECK_MSG(alloc_bill()->n_live == live, "zero %d, k %ld, rank %d: %zu blocks after the failed step, "
              "%zu before", zero, k, rank, alloc_bill()->n_live, live);
    CHECK(t.step == step);
    trainer_clear_error(&t);
    CHECK(trainer_failed(&t) == NULL);
  }
  CHECK_MSG(rc == 0, "zero %d: the step still fails: %s", zero, err);
  if (rank == 0)
    printf("zero %d: %d failed steps (gathers %d, buckets %d, reduce-scatter outputs %d), then: loss %.17g\n",
           zero, failures, gathers, buckets, outputs, st.loss);
  CHECK(failures >= 3 && buckets > 0 && outputs > 0 && (zero < 3 || gathers > 0));
  CHECK_MSG(trainer_step(&ref, &want, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(memcmp(&st.loss, &want.loss, sizeof st.loss) == 0 && memcmp(&st.grad_norm, &want.grad_norm, sizeof st.grad_norm) == 0,
            "zero %d, rank %d: loss %.17g norm %.17g, without the failures %.17g %.17g", zero, rank, st.loss,
            st.grad_norm, want.loss, want.grad_norm);
  CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(trainer_step(&ref, &want, err, sizeof err) == 0, "%s", err);
  CHECK(memcmp(&st.loss, &want.loss, sizeof st.loss) == 0);
  trainer_close(&ref);
  trainer_close(&t);
  CHECK_MSG(comm_free_mesh_groups(groups, err, sizeof err) == 0, "%s", err);
  plan_free(&p);
}

static void test_a_zero3_step_fails_at_each_allocation_and_goes_on(void)
{
  fails_at_each_allocation_of_a_step(3);
}

static void test_a_zero2_step_fails_at_each_allocation_and_goes_on(void)
{
  fails_at_each_allocation_of_a_step(2);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  if (comm_world()->size != 2)
    comm_fatal("mpi_oom runs on 2 ranks");
  static const struct test_case tests[] = { TEST(test_a_gather_fails_on_every_rank_and_the_trainer_goes_on),
                                            TEST(test_a_zero3_step_fails_at_each_allocation_and_goes_on),
                                            TEST(test_a_zero2_step_fails_at_each_allocation_and_goes_on) };
  int rc = mpi_test_run_all(tests, 3);
  comm_finalize(err, sizeof err);
  return rc;
}
