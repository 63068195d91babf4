/* A process closes one plan and opens another on the same world (docs/design.md, "The runtime is a
 * library"). On 2 ranks: plan A (tests/plans/good/dp_small.lua with tp 2) opens a trainer on mesh
 * groups of its own (trainer_open_on_world), trains 3 steps and saves a checkpoint; closing the
 * trainer frees its groups. Plan B (the same model with dp 2 and zero 3) opens the same way, loads
 * the checkpoint and trains 3 more. Then:
 *   - B's losses for steps 3-5 equal those of rank 0 training the model alone for 6 steps,
 *     within the bound of this build (tests/mpi/mpi_dp_equiv.c argues it: 1e-5 relative in
 *     fp32, 1e-10 in float64);
 *   - nothing is left: after each close the allocator holds no block, the comm layer no group
 *     but the world, and the process has as many threads as before A was opened. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "mpi_check.h"
#include "plan_fixture.h"
#include "runtime/model/alloc.h"
#include "runtime/state/ckpt.h"
#include "runtime/train/train.h"

#if REAL_IS_DOUBLE
static const double loss_tol = 1e-10;
#else
static const double loss_tol = 1e-5;
#endif

static int rank, world;
static char err[4096], dir[256];

static int compile(struct plan *p, int n_world, const char *const *sets, int n_sets)
{
  return fixture_compile("tests/plans/good/dp_small.lua", n_world, sets, n_sets, p);
}

static int threads_now(void)
{
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n;
}

/* Opens plan `sets` on mesh groups of its own, loads `load` when given, trains `steps` steps
 * (losses into out), saves to dir when asked, and closes it (groups included). */
static void open_train_close(const char *const *sets, int n_sets, const char *load, int steps, int save,
                             double *out)
{
  struct plan p;
  if (compile(&p, world, sets, n_sets))
    return;
  struct trainer t;
  if (trainer_open_on_world(&t, &p, err, sizeof err) != TRAIN_OK) { /* its own mesh groups */
    CHECK_MSG(0, "%s", err);
    return;
  }
  CHECK(comm_groups_held() == 1 + PLAN_N_AXES);
  plan_free(&p); /* the trainer keeps its own copy */
  if (load)
    CHECK_MSG(ckpt_load(&t, load, err, sizeof err) == 0, "%s", err);
  for (int s = 0; s < steps; s++) {
    struct train_step_stats st;
    CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
    out[s] = st.loss;
  }
  if (save)
    CHECK_MSG(ckpt_save(&t, dir, t.step, 1, err, sizeof err) == 0, "%s", err);
  trainer_close(&t); /* and its groups */
}

static void test_close_a_open_b_same_world(void)
{
  const int threads = threads_now();
  const size_t live = alloc_bill()->n_live;
  double a[3], b[3];
  const char *plan_a[] = { "mesh.tp=2", "train.eval_every=0" };
  const char *plan_b[] = { "zero=3", "train.eval_every=0" };
  open_train_close(plan_a, 2, NULL, 3, 1, a);
  CHECK_MSG(alloc_bill()->n_live == live && comm_groups_held() == 1 && threads_now() == threads,
            "rank %d after plan A: %zu blocks (%zu before), %d groups, %d threads (%d before)", rank,
            alloc_bill()->n_live, live, comm_groups_held(), threads_now(), threads);
  char path[512];
  snprintf(path, sizeof path, "%s/step_00000003", dir);
  open_train_close(plan_b, 2, path, 3, 0, b);
  CHECK_MSG(alloc_bill()->n_live == live && comm_groups_held() == 1 && threads_now() == threads,
            "rank %d after plan B: %zu blocks (%zu before), %d groups, %d threads (%d before)", rank,
            alloc_bill()->n_live, live, comm_groups_held(), threads_now(), threads);
  if (rank != 0)
    return;
  /* the reference: one rank, the whole run */
  struct plan p;
  const char *serial[] = { "train.eval_every=0" };
  if (compile(&p, 1, serial, 1))
    return;
  struct trainer t;
  if (trainer_open(&t, &p, NULL, err, sizeof err) != TRAIN_OK) {
    CHECK_MSG(0, "%s", err);
    return;
  }
  double worst = 0;
  for (int s = 0; s < 6; s++) {
    struct train_step_stats st;
    CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
    const double got = s < 3 ? a[s] : b[s - 3], e = fabs(got - st.loss) / st.loss;
    worst = e > worst ? e : worst;
    CHECK_MSG(e <= loss_tol, "step %d: loss %.17g through the reopen, %.17g alone", s, got, st.loss);
  }
  printf("tp 2, closed after 3 steps, then dp 2 zero 3 from its checkpoint: losses of 6 steps within "
         "%.3g of one rank's (%s)\n", worst, REAL_NAME);
  trainer_close(&t);
  plan_free(&p);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  world = comm_world()->size;
  if (world != 2)
    comm_fatal("mpi_reopen runs on 2 ranks");
  /* one folder for the job: rank 0 names it, everyone uses it */
  if (rank == 0) {
    snprintf(dir, sizeof dir, "/tmp/tycho-reopen-XXXXXX");
    if (!mkdtemp(dir))
      comm_fatal("mkdtemp failed");
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  static const struct test_case tests[] = { TEST(test_close_a_open_b_same_world) };
  int rc = mpi_test_run_all(tests, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
      fprintf(stderr, "could not remove %s\n", dir);
  }
  comm_finalize(err, sizeof err);
  return rc;
}
