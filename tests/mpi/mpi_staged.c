/* Staged comm on memory the host cannot touch reproduces the direct run bit for bit. Every rank
 * trains PLAN (with the --set overrides) twice on the job's mesh groups: first on the CPU's kernel
 * table with comm "auto" (direct MPI on host memory), then on the untouchable table
 * (tests/unit/untouchable.h: the CPU's kernels on an arena the host faults on) with comm "auto",
 * which is staged there: every collective, send and receive the trainer issues on model memory
 * goes through host staging buffers. The same kernels run underneath, so on every rank:
 *   - every step's loss and gradient norm, and the evaluation, bitwise equal;
 *   - the rank's parameters after training (its whole flat memory; under ZeRO-3 its shard) and the
 *     whole model gathered on rank 0 (dp_gather_whole: the export's path), bitwise equal;
 *   - the comm layer's counters over the run (calls and bytes of every op on every group)
 *     equal: staging moves the same operations;
 *   - no entry of the untouchable table was handed a host pointer, and the host never touched
 *     the arena (a touch ends the rank with the address and a backtrace);
 *   - staging buffers were used (billed to the host's "comm" memory) and given back at close.
 * Then the refusals on the untouchable table: comm = "mpi" (names why and what to use instead)
 * and comm = "nccl" (its memory is not a CUDA device's), both as plan errors.
 * usage: mpi_staged PLAN [--set path=value]... */
#define _GNU_SOURCE
#include <string.h>

#include "untouchable.h"

#include "comm/comm.h"
#include "drive/rehearse.h"
#include "mesh/mesh.h"
#include "mpi_check.h"
#include "plan/compile.h"
#include "runtime/model/alloc.h"
#include "runtime/model/hostview.h"
#include "runtime/parallel/dcomm.h"
#include "runtime/train/train.h"

#define MAX_STEPS 16
#define MAX_SETS 16

static const char *plan_path;
static const char *sets[MAX_SETS + 1];
static int n_sets, rank, world;
static char err[4096];
static struct comm_group *groups[PLAN_N_AXES];

/* What one run leaves to compare. */
struct run {
  struct train_step_stats steps[MAX_STEPS];
  struct train_eval_stats eval;
  unsigned char *params; /* this rank's flat parameters (or ZeRO-3 shard), host copy */
  size_t n_params_bytes;
  unsigned char *whole;  /* rank 0: the gathered model's parameters, packed */
  size_t n_whole_bytes;
  struct comm_counter traffic[TRAFFIC_N_GROUPS][COMM_N_OPS];
  size_t comm_peak;      /* the host's "comm" peak during the run */
};

static struct run direct, staged;
static long steps;

static void compile(struct plan *p, const char *extra)
{
  const char *all[MAX_SETS + 1];
  int n = 0;
  for (int i = 0; i < n_sets; i++) all[n++] = sets[i];
  if (extra)
    all[n++] = extra;
  struct plan_compile_options opt = { world, 0, 0, 0, n, all };
  plan_init(p);
  if (plan_compile(plan_path, &opt, p, err, sizeof err))
    comm_fatal("the plan does not compile: %s", err);
}

/* n_bytes at p (memory of t's table) into a new host block. */
static unsigned char *read_back(const struct model *m, void *p, size_t n_bytes)
{
  unsigned char *out = malloc(n_bytes ? n_bytes : 1);
  CHECK(out != NULL);
  if (!out || !n_bytes)
    return out;
  const void *view = hostview_open(m->k, m->kctx, p, n_bytes, 1);
  CHECK(view != NULL);
  if (view) {
    memcpy(out, view, n_bytes);
    hostview_close(m->k, m->kctx, p, (void *)view, n_bytes, 0);
  }
  return out;
}

/* Trains the plan on the table selected now; fills r. */
static void train(struct run *r)
{
  struct plan p;
  compile(&p, NULL);
  CHECK(p.train.steps <= MAX_STEPS);
  steps = p.train.steps;
  struct trainer t;
  const int device = alloc_current_device();
  alloc_use_device(ALLOC_HOST);
  alloc_reset_peaks();
  alloc_use_device(device);
  if (trainer_open(&t, &p, groups, err, sizeof err) != TRAIN_OK)
    comm_fatal("%s", err);
  alloc_use_device(t.model.device); /* the gather below makes its blocks on the model's device */
  struct comm_counter before[TRAFFIC_N_GROUPS][COMM_N_OPS];
  rehearse_counters(groups, &t, before);
  for (long s = 0; s < steps; s++)
    CHECK_MSG(trainer_step(&t, &r->steps[s], err, sizeof err) == 0, "step %ld: %s", s, err);
  trainer_eval(&t, &r->eval);
  rehearse_counters(groups, &t, r->traffic);
  for (int g = 0; g < TRAFFIC_N_GROUPS; g++)
    for (int o = 0; o < COMM_N_OPS; o++) {
      r->traffic[g][o].calls -= before[g][o].calls;
      r->traffic[g][o].n_bytes -= before[g][o].n_bytes;
    }
  const int sharded = dp_master_sharded(&t.dp); /* zero 3; a bf16 model's master from zero 1 */
  real *mine = sharded ? t.dp.shard_params : t.model.param_memory;
  r->n_params_bytes = (sharded ? t.dp.layout.n_shard : t.dp.layout.n_elems) * sizeof(real);
  r->params = read_back(&t.model, mine, r->n_params_bytes);
  struct model whole;
  int have = 0;
  CHECK_MSG(dp_gather_whole(&t.dp, &whole, &have, err, sizeof err) == 0, "%s", err);
  if (have) {
    for (int i = 0; i < whole.n_params; i++) r->n_whole_bytes += whole.params[i].n_elems * sizeof(real);
    r->whole = malloc(r->n_whole_bytes ? r->n_whole_bytes : 1);
    size_t at = 0;
    for (int i = 0; r->whole && i < whole.n_params; i++) {
      const size_t n = whole.params[i].n_elems * sizeof(real);
      unsigned char *b = read_back(&whole, whole.params[i].data, n);
      if (b)
        memcpy(r->whole + at, b, n);
      free(b);
      at += n;
    }
    model_free(&whole);
  }
  r->comm_peak = alloc_device_bill(ALLOC_HOST)->peak_bytes[ALLOC_COMM];
  trainer_close(&t);
  alloc_use_device(device);
  plan_free(&p);
}

static void test_direct_run(void)
{
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  train(&direct);
  CHECK(direct.n_params_bytes > 0);
}

static void test_staged_run_is_bitwise_the_direct_one(void)
{
  CHECK(use_untouchable() == 0);
  train(&staged);
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  for (long s = 0; s < steps; s++)
    CHECK_MSG(memcmp(&direct.steps[s].loss, &staged.steps[s].loss, sizeof(double)) == 0 &&
              memcmp(&direct.steps[s].grad_norm, &staged.steps[s].grad_norm, sizeof(double)) == 0,
              "step %ld: loss %.17g / %.17g, norm %.17g / %.17g", s, direct.steps[s].loss, staged.steps[s].loss,
              direct.steps[s].grad_norm, staged.steps[s].grad_norm);
  CHECK_MSG(memcmp(&direct.eval, &staged.eval, sizeof direct.eval) == 0, "the evaluation differs: %.17g / %.17g",
            direct.eval.val_loss, staged.eval.val_loss);
  CHECK(staged.n_params_bytes == direct.n_params_bytes);
  CHECK_MSG(memcmp(direct.params, staged.params, direct.n_params_bytes) == 0, "this rank's parameters differ");
  CHECK(staged.n_whole_bytes == direct.n_whole_bytes);
  CHECK_MSG(!direct.whole || (staged.whole && memcmp(direct.whole, staged.whole, direct.n_whole_bytes) == 0),
            "the gathered model differs");
  CHECK_MSG(memcmp(direct.traffic, staged.traffic, sizeof direct.traffic) == 0,
            "the comm layer's counters differ between the direct and the staged run");
  CHECK_MSG(host_pointer_report() == 0, "the untouchable table was handed host pointers (above)");
  CHECK_MSG(staged.comm_peak > 0, "no staging buffer was billed to the host's comm memory");
  CHECK_MSG(dcomm_staging_bytes() == 0, "%zu bytes of staging buffers left after close", dcomm_staging_bytes());
  CHECK(alloc_device_bill(ALLOC_HOST)->n_bytes[ALLOC_COMM] == 0);
}

static void refused(const char *set, const char *expect)
{
  struct plan p;
  compile(&p, set);
  CHECK(use_untouchable() == 0);
  struct trainer t;
  err[0] = '\0';
  const int rc = trainer_open(&t, &p, groups, err, sizeof err);
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK_MSG(rc == TRAIN_PLAN_ERROR, "%s: trainer_open gave %d (%s)", set, rc, err);
  if (rc == TRAIN_OK)
    trainer_close(&t);
  CHECK_STR_CONTAINS(err, expect);
  plan_free(&p);
}

static void test_refusals(void)
{
  refused("comm=mpi", "--set comm=mpi: comm = \"mpi\": the untouchable backend's memory is not host memory, and "
          "MPI carries host buffers only; use comm = \"staged\" (or \"auto\")");
  refused("comm=nccl", "--set comm=nccl: comm = \"nccl\": NCCL carries a CUDA device's memory, and the "
          "untouchable backend's is not; use comm = \"auto\" (or \"staged\")");
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  world = comm_world()->size;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < MAX_SETS)
      sets[n_sets++] = argv[++i];
    else if (!plan_path)
      plan_path = argv[i];
    else
      comm_fatal("usage: mpi_staged PLAN [--set path=value]...");
  }
  if (!plan_path)
    comm_fatal("usage: mpi_staged PLAN [--set path=value]...");
  struct plan p;
  compile(&p, NULL);
  if (comm_build_mesh_groups(&p.mesh, groups, err, sizeof err))
    comm_fatal("%s", err);
  plan_free(&p);
  static const struct test_case tests[] = { TEST(test_direct_run), TEST(test_staged_run_is_bitwise_the_direct_one),
                                            TEST(test_refusals) };
  int rc = mpi_test_run_all(tests, 3);
  free(direct.params);
  free(direct.whole);
  free(staged.params);
  free(staged.whole);
  comm_free_mesh_groups(groups, err, sizeof err);
  comm_finalize(err, sizeof err);
  return rc;
}
