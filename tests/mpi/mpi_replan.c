/* trainer_replan (train.h): a live trainer moved to another layout of the same model in memory.
 * On 4 ranks, tests/plans/good/dp_small.lua (2 layers of dim 32, dropout 0.1), every layout on
 * the whole world:
 *   - for each pair of layouts below, 3 steps on the first, a replan, 3 steps on the second.
 *     The 6 losses and gradient norms must equal, bit for bit, those of a run that trains 3 steps
 *     on the first layout, saves a checkpoint (ckpt_save), closes, opens the second layout
 *     (trainer_open_on_world), loads it (ckpt_load) and trains 3 more; and the losses must equal
 *     the uninterrupted serial run's (rank 0 alone) within this build's bound (1e-5 relative in
 *     fp32, 1e-10 in float64: tests/mpi/mpi_dp_equiv.c argues them). The replan's broadcasts
 *     (counted, world group) carry exactly the state: 3 × sizeof(real) bytes per parameter; after
 *     it the trainer holds the new plan's 3 mesh groups and no others; after the close, no block
 *     and no group is left;
 *   - refusals leave the old trainer usable: another model (model.dim), the exchange over the
 *     bound (TYCHO_REPLAN_LIMIT_MB), one rank out of memory for the buffer (alloc_fail_after on
 *     rank 2: every rank gets rank 2's message); a plan whose open fails after the old trainer
 *     closed (a data file that does not exist) brings the trainer back on its old layout. The
 *     run's 6 losses equal bit for bit those of the same layout without the attempts;
 *   - a replan whose new and old opens both fail (rank 1 out of memory from the open on) leaves
 *     the trainer closed on every rank, with no block and no group left, and the job goes on;
 *   - a trainer without a world (rank 0 alone, no groups) replans locally. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define STEPS 6 /* 3 before, 3 after */
#define MAX_SETS 8

static int rank, world;
static char err[4096], dir[256];
static double serial[STEPS];
static size_t live0; /* the allocator's live blocks with no trainer open */

struct layout {
  const char *name;
  const char *sets[MAX_SETS];
};

static int n_sets(const struct layout *l)
{
  int n = 0;
  while (n < MAX_SETS && l->sets[n])
    n++;
  return n;
}

/* dp_small for `ranks` ranks with l's overrides and no evaluation. */
static int compile(struct plan *p, int ranks, const struct layout *l)
{
  const char *sets[MAX_SETS + 1] = { "train.eval_every=0" };
  int n = 1;
  for (int i = 0; l && i < n_sets(l); i++)
    sets[n++] = l->sets[i];
  return fixture_compile("tests/plans/good/dp_small.lua", ranks, sets, n, p);
}

static int open_on_world(struct trainer *t, const struct layout *l)
{
  struct plan p;
  if (compile(&p, world, l))
    return -1;
  int rc = trainer_open_on_world(t, &p, err, sizeof err);
  plan_free(&p);
  CHECK_MSG(rc == TRAIN_OK, "opening %s: %s", l->name, err);
  return rc == TRAIN_OK ? 0 : -1;
}

static int steps(struct trainer *t, int n, double *loss, double *norm)
{
  for (int s = 0; s < n; s++) {
    struct train_step_stats st;
    if (trainer_step(t, &st, err, sizeof err)) {
      CHECK_MSG(0, "step %lld: %s", t->step, err);
      return -1;
    }
    loss[s] = st.loss;
    if (norm)
      norm[s] = st.grad_norm;
  }
  return 0;
}

static long long n_params(const struct trainer *t)
{
  long long n = 0;
  for (int i = 0; i < t->model.n_params; i++) {
    const struct model_param *p = &t->model.params[i];
    n += (long long)p->shape[0] * (p->n_dims == 2 ? p->shape[1] : 1);
  }
  return n;
}

static void check_nothing_left(const char *what)
{
  CHECK_MSG(alloc_bill()->n_live == live0 && comm_groups_held() == 1,
            "rank %d after %s: %zu blocks (%zu before), %d groups", rank, what, alloc_bill()->n_live, live0,
            comm_groups_held());
}

static double worst_serial = 0.0;

/* The worst relative difference of the 6 losses from the serial run's (checked against the bound). */
static double check_serial(const char *what, const double *loss)
{
  double worst = 0.0;
  for (int s = 0; s < STEPS; s++) {
    const double e = fabs(loss[s] - serial[s]) / serial[s];
    worst = e > worst ? e : worst;
    CHECK_MSG(e <= loss_tol, "%s, step %d: loss %.17g, the serial run's %.17g (relative %.3g)", what, s,
              loss[s], serial[s], e);
  }
  worst_serial = worst > worst_serial ? worst : worst_serial;
  return worst;
}

/* ---- replan against checkpoint-and-resume ---------------------------------------------------- */

static void replan_pair(const struct layout *from, const struct layout *to)
{
  double rl[STEPS], rn[STEPS], cl[STEPS], cn[STEPS];
  struct trainer t;
  /* in memory */
  if (open_on_world(&t, from) || steps(&t, 3, rl, rn))
    return;
  struct plan p;
  if (compile(&p, world, to))
    return;
  const long long params = n_params(&t);
  const int want_tp = p.mesh.tp, want_pp = p.mesh.pp, want_zero = p.zero, want_micro = p.batch.micro;
  const struct comm_counter before = comm_counter_get(comm_world(), COMM_BROADCAST);
  int rc = trainer_replan(&t, &p, err, sizeof err);
  plan_free(&p); /* the trainer has its own */
  CHECK_MSG(rc == TRAIN_OK, "replan %s -> %s: %s", from->name, to->name, err);
  if (rc != TRAIN_OK)
    return;
  const struct comm_counter after = comm_counter_get(comm_world(), COMM_BROADCAST);
  const unsigned long long moved = after.n_bytes - before.n_bytes;
  CHECK_MSG(moved == (unsigned long long)params * 3 * sizeof(real),
            "replan %s -> %s: the broadcasts carried %llu bytes, not 3 × %zu × %lld parameters", from->name,
            to->name, moved, sizeof(real), params);
  CHECK_MSG(t.step == 3 && comm_groups_held() == 1 + PLAN_N_AXES && t.plan->mesh.tp == want_tp &&
            t.plan->mesh.pp == want_pp && t.plan->zero == want_zero && t.plan->batch.micro == want_micro &&
            t.model.tp.size == want_tp && t.exec.size == want_pp && t.dp.size == 4 / (want_tp * want_pp),
            "after the replan: step %lld, %d groups held, tp %d pp %d zero %d micro %d", t.step, comm_groups_held(),
            t.plan->mesh.tp, t.plan->mesh.pp, t.plan->zero, t.plan->batch.micro);
  if (steps(&t, 3, rl + 3, rn + 3))
    return;
  trainer_close(&t);
  check_nothing_left("a replanned trainer's close");

  /* through a checkpoint */
  char ck[512], path[600];
  snprintf(ck, sizeof ck, "%s/%s", dir, from->name);
  if (open_on_world(&t, from) || steps(&t, 3, cl, cn))
    return;
  CHECK_MSG(ckpt_save(&t, ck, t.step, 1, err, sizeof err) == 0, "%s", err);
  trainer_close(&t);
  snprintf(path, sizeof path, "%s/step_00000003", ck);
  if (open_on_world(&t, to))
    return;
  CHECK_MSG(ckpt_load(&t, path, err, sizeof err) == 0, "%s", err);
  if (steps(&t, 3, cl + 3, cn + 3))
    return;
  trainer_close(&t);
  check_nothing_left("the checkpoint run");

  double worst_ckpt = 0.0;
  for (int s = 0; s < STEPS; s++) {
    const double e = fabs(rl[s] - cl[s]) / cl[s];
    worst_ckpt = e > worst_ckpt ? e : worst_ckpt;
    CHECK_MSG(rl[s] == cl[s] && rn[s] == cn[s],
              "%s -> %s, step %d: replan loss %.17g norm %.17g, checkpoint-and-resume loss %.17g norm %.17g",
              from->name, to->name, s, rl[s], rn[s], cl[s], cn[s]);
  }
  const double vs_serial = check_serial(to->name, rl);
  if (rank == 0)
    printf("%s -> %s: %llu bytes moved (%lld parameters); losses and norms of 6 steps equal to "
           "checkpoint-and-resume's (max relative difference %.3g), losses within %.3g of the serial run's\n",
           from->name, to->name, moved, params, worst_ckpt, vs_serial);
}

static const struct layout tp2_dp2 = { "tp2_dp2", { "mesh.tp=2" } };
static const struct layout dp4 = { "dp4", { NULL } };
static const struct layout dp4_zero3_micro2 = { "dp4_zero3_micro2", { "zero=3", "batch.micro=2" } };
static const struct layout tp2_pp2 = { "tp2_pp2", { "mesh.tp=2", "mesh.pp=2" } };
static const struct layout dp4_zero1 = { "dp4_zero1", { "zero=1" } };
static const struct layout pp2_dp2_zero1_gpipe = { "pp2_dp2_zero1_gpipe", { "mesh.pp=2", "zero=1", "schedule.kind=gpipe" } };
static const struct layout tp2_sp_dp2_zero3 = { "tp2_sp_dp2_zero3", { "mesh.tp=2", "sequence_parallel=true", "zero=3" } };

static void test_tp2_dp2_to_dp4_zero3(void) { replan_pair(&tp2_dp2, &dp4_zero3_micro2); }
static void test_dp4_to_tp2_pp2(void) { replan_pair(&dp4, &tp2_pp2); }
static void test_tp2_pp2_to_dp4_zero1(void) { replan_pair(&tp2_pp2, &dp4_zero1); }
static void test_pp2_dp2_to_tp2_sp_dp2_zero3(void) { replan_pair(&pp2_dp2_zero1_gpipe, &tp2_sp_dp2_zero3); }

/* ---- refusals and failures ------------------------------------------------------------------- */

static void test_refused_replans_leave_the_trainer(void)
{
  double clean[STEPS], got[STEPS];
  struct trainer t;
  if (open_on_world(&t, &tp2_dp2) || steps(&t, STEPS, clean, NULL))
    return;
  trainer_close(&t);
  if (open_on_world(&t, &tp2_dp2) || steps(&t, 3, got, NULL))
    return;
  struct plan p;

  /* another model */
  const struct layout other_model = { "dim48", { "mesh.tp=2", "model.dim=48" } };
  if (compile(&p, world, &other_model))
    return;
  int rc = trainer_replan(&t, &p, err, sizeof err);
  plan_free(&p);
  CHECK_MSG(rc == TRAIN_PLAN_ERROR && strstr(err, "model.dim = 48") && strstr(err, "dim = 32"),
            "another model: rc %d: %s", rc, err);
  if (rank == 0)
    printf("another model: %s\n", err);
  CHECK(t.plan && t.step == 3 && comm_groups_held() == 1 + PLAN_N_AXES);

  /* over the bound: the state of dp_small is ~0.26 MiB in fp32, the bound 0.01 MiB */
  if (compile(&p, world, &dp4_zero3_micro2))
    return;
  setenv("TYCHO_REPLAN_LIMIT_MB", "0.01", 1);
  rc = trainer_replan(&t, &p, err, sizeof err);
  unsetenv("TYCHO_REPLAN_LIMIT_MB");
  CHECK_MSG(rc == TRAIN_RUNTIME_ERROR && strstr(err, "bytes") && strstr(err, "more than the bound of 10485 bytes"),
            "over the bound: rc %d: %s", rc, err);
  if (rank == 0)
    printf("over the bound: %s\n", err);
  CHECK(t.plan && t.step == 3 && comm_groups_held() == 1 + PLAN_N_AXES);

  /* rank 2 cannot allocate the buffer */
  if (rank == 2)
    alloc_fail_after(0);
  rc = trainer_replan(&t, &p, err, sizeof err);
  alloc_fail_after(-1);
  CHECK_MSG(rc == TRAIN_RUNTIME_ERROR && strstr(err, "rank 2: replan: out of memory: the allocator cannot give"),
            "rank 2 out of memory: rc %d: %s", rc, err);
  if (rank == 0)
    printf("one rank out of memory: %s\n", err);
  CHECK(t.plan && t.step == 3 && comm_groups_held() == 1 + PLAN_N_AXES);
  plan_free(&p);
  if (steps(&t, 1, got + 3, NULL))
    return;

  /* the new plan cannot open (its data file is missing), after the old trainer was closed */
  const struct layout no_data = { "no_data", { "data.synthetic=nil", "data.train=/nonexistent/tokens.bin" } };
  if (compile(&p, world, &no_data))
    return;
  rc = trainer_replan(&t, &p, err, sizeof err);
  plan_free(&p);
  CHECK_MSG(rc != TRAIN_OK && strstr(err, "/nonexistent/tokens.bin") &&
            strstr(err, "the trainer is back on its old layout, at step 4"), "a plan that cannot open: rc %d: %s", rc, err);
  if (rank == 0)
    printf("a plan that cannot open: %s\n", err);
  CHECK_MSG(t.plan && t.step == 4 && t.plan->mesh.tp == 2 && comm_groups_held() == 1 + PLAN_N_AXES,
            "after the failed open: open %d, step %lld, %d groups", t.plan != NULL, t.step, comm_groups_held());
  if (!t.plan || steps(&t, 2, got + 4, NULL))
    return;
  trainer_close(&t);
  check_nothing_left("the refused replans");
  for (int s = 0; s < STEPS; s++)
    CHECK_MSG(got[s] == clean[s], "step %d: loss %.17g with the refused replans, %.17g without", s, got[s], clean[s]);
  check_serial("tp2_dp2 with refused replans", got);
  if (rank == 0)
    printf("tp2_dp2 with 4 refused replans: losses of 6 steps equal to the run without them, bit for bit\n");
}

static void test_both_opens_fail_closes_the_trainer(void)
{
  struct trainer t;
  double loss[1];
  if (open_on_world(&t, &tp2_dp2) || steps(&t, 1, loss, NULL))
    return;
  struct plan p;
  if (compile(&p, world, &dp4_zero3_micro2))
    return;
  if (rank == 1)
    alloc_fail_after(1); /* the exchange's buffer, then nothing: the new open and the old fail */
  int rc = trainer_replan(&t, &p, err, sizeof err);
  alloc_fail_after(-1);
  plan_free(&p);
  CHECK_MSG(rc == TRAIN_RUNTIME_ERROR && strstr(err, "rank 1: ") && strstr(err, "the trainer is closed"),
            "both opens fail: rc %d: %s", rc, err);
  if (rank == 0)
    printf("both opens fail: %s\n", err);
  CHECK_MSG(t.plan == NULL, "rank %d: the trainer is still open", rank);
  trainer_close(&t); /* a no-op on a closed trainer */
  check_nothing_left("a replan that closed the trainer");
  /* the job goes on */
  if (open_on_world(&t, &dp4) || steps(&t, 1, loss, NULL))
    return;
  CHECK(loss[0] == loss[0]);
  trainer_close(&t);
  check_nothing_left("the trainer after");
}

/* A trainer without a world (one rank, no comm layer) replans locally: micro-batches of 2 with
 * full recompute after 3 steps of micro-batches of 4. */
static void test_replan_without_a_world(void)
{
  if (rank != 0)
    return;
  struct plan p, q;
  struct trainer t;
  double loss[STEPS];
  const struct layout micro2 = { "serial_micro2_recompute", { "batch.micro=2", "recompute=full" } };
  if (compile(&p, 1, NULL) || compile(&q, 1, &micro2))
    return;
  if (trainer_open(&t, &p, NULL, err, sizeof err) != TRAIN_OK) {
    CHECK_MSG(0, "%s", err);
    return;
  }
  if (!steps(&t, 3, loss, NULL)) {
    CHECK_MSG(trainer_replan(&t, &q, err, sizeof err) == TRAIN_OK, "%s", err);
    CHECK(t.plan && t.step == 3 && t.plan->batch.micro == 2 && t.world == NULL);
    if (t.plan && !steps(&t, 3, loss + 3, NULL))
      printf("serial, no comm layer, micro 4 -> micro 2 with full recompute: losses within %.3g of the serial run's\n",
             check_serial("serial micro 2", loss));
  }
  trainer_close(&t);
  plan_free(&p);
  plan_free(&q);
  CHECK(alloc_bill()->n_live == live0);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  world = comm_world()->size;
  if (world != 4)
    comm_fatal("mpi_replan runs on 4 ranks");
  if (rank == 0) {
    snprintf(dir, sizeof dir, "/tmp/tycho-replan-XXXXXX");
    if (!mkdtemp(dir))
      comm_fatal("mkdtemp failed");
    /* the reference: one rank, the whole run */
    struct plan p;
    struct trainer t;
    if (compile(&p, 1, NULL) || trainer_open(&t, &p, NULL, err, sizeof err) != TRAIN_OK)
      comm_fatal("the serial run: %s", err);
    if (steps(&t, STEPS, serial, NULL))
      comm_fatal("the serial run: %s", err);
    trainer_close(&t);
    plan_free(&p);
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Bcast(serial, STEPS, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  live0 = alloc_bill()->n_live;
  static const struct test_case tests[] = {
    TEST(test_tp2_dp2_to_dp4_zero3), TEST(test_dp4_to_tp2_pp2), TEST(test_tp2_pp2_to_dp4_zero1),
    TEST(test_pp2_dp2_to_tp2_sp_dp2_zero3), TEST(test_refused_replans_leave_the_trainer),
    TEST(test_both_opens_fail_closes_the_trainer), TEST(test_replan_without_a_world),
  };
  int rc = mpi_test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  if (rank == 0)
    printf("worst relative loss difference from the serial run: %.3g (bound %g, %s)\n", worst_serial, loss_tol,
           REAL_NAME);
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
