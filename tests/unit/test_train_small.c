/* Training for real: tests/plans/good/train_small.lua (compiled by the plan compiler, as `tycho
 * run` does) for its 60 steps on the addition corpus. The loss falls by a stated factor; two
 * runs with the same seeds give bitwise the same metrics and weights; changing only seeds.data
 * changes the data (first loss) but not the init, and changing seeds.model the reverse; the
 * evaluation reports a validation loss and an accuracy over 256 held-out problems; a bf16 step
 * computes on the weights' bf16 copies, not on the fp32 master; what the CPU
 * build cannot run is refused as a plan error naming the field, a missing data file as a
 * runtime error naming the file. */
#include "check.h"
#include "bf16.h"
#include "plan/compile.h"
#include "runtime/train/train.h"
#include "util/devices.h"
#include "plan_fixture.h"
#include "runtime_fixture.h"

#include <stdlib.h>

static char err[2048];

enum { STEPS = 60 };

static int compile(struct plan *p, int n_sets, const char *const *sets)
{
  return fixture_compile("tests/plans/good/train_small.lua", 1, sets, n_sets, p);
}

struct run {
  struct train_step_stats stats[STEPS];
  struct model initial;      /* a copy of the parameters before step 0 */
  struct trainer t;          /* after the last step */
};

/* Opens a trainer for the plan, keeps a copy of the initial parameters, runs `steps` steps. */
static int run_steps(struct run *r, const struct plan *p, int steps)
{
  if (trainer_open(&r->t, p, NULL, err, sizeof err) != TRAIN_OK) {
    CHECK_MSG(0, "%s", err);
    return 1;
  }
  CHECK(model_create(&r->initial, &p->model, err, sizeof err) == 0);
  memcpy(r->initial.param_memory, r->t.model.param_memory, r->t.model.n_elems * sizeof(real));
  for (int s = 0; s < steps; s++)
    if (trainer_step(&r->t, &r->stats[s], err, sizeof err) != 0) {
      CHECK_MSG(0, "%s", err);
      return 1;
    }
  return 0;
}

static void run_free(struct run *r)
{
  trainer_close(&r->t);
  model_free(&r->initial);
}

static void loss_falls_and_runs_repeat_bitwise(void)
{
  struct plan p;
  if (compile(&p, 0, NULL))
    return;
  CHECK(p.train.steps == STEPS);
  static struct run a, b;
  if (run_steps(&a, &p, STEPS) || run_steps(&b, &p, STEPS))
    return;
  double first = a.stats[0].loss, last5 = 0.0;
  for (int s = STEPS - 5; s < STEPS; s++) last5 += a.stats[s].loss / 5;
  /* Measured: 4.17 → 2.36 (a factor 0.566) with seeds.global = 7, in both builds (they differ
   * by rounding, ~1e-6 of the loss in fp32). Bound 0.6: a run that does not learn stays near a
   * factor 1, and rounding moves the factor by ~1e-6, not by the 0.03 of margin. */
  printf("loss %.4f at step 0, %.4f averaged over the last 5 steps (factor %.3f)\n", first, last5,
         last5 / first);
  CHECK(first > 3.9 && first < 4.5); /* about ln 64 = 4.16 at init */
  CHECK(last5 < 0.6 * first);
  /* Bitwise: the same operations in the same order (every kernel keeps its sum order for any
   * thread count, every random number is a function of seeds and indices). */
  CHECK(memcmp(a.stats, b.stats, sizeof a.stats) == 0);
  CHECK(fixture_params_equal(&a.t.model, &b.t.model));
  CHECK(!fixture_params_equal(&a.t.model, &a.initial)); /* it did train */

  struct train_eval_stats e;
  trainer_eval(&a.t, &e);
  CHECK(e.step == STEPS);
  CHECK(e.has_val_loss && e.val_loss > 1.0 && e.val_loss < first);
  CHECK(e.has_accuracy && e.n_problems == 256 && e.accuracy >= 0.0 && e.accuracy <= 1.0);
  printf("eval: val loss %.4f, accuracy %.3f on %d problems\n", e.val_loss, e.accuracy, e.n_problems);
  run_free(&a);
  run_free(&b);
  plan_free(&p);
}

static void data_seed_changes_data_not_init_and_model_seed_the_reverse(void)
{
  struct plan p, pd, pm;
  const char *data[] = { "seeds.data=99" }, *model[] = { "seeds.model=99" };
  if (compile(&p, 0, NULL) || compile(&pd, 1, data) || compile(&pm, 1, model))
    return;
  static struct run a, d, m;
  if (run_steps(&a, &p, 1) || run_steps(&d, &pd, 1) || run_steps(&m, &pm, 1))
    return;
  CHECK(fixture_params_equal(&a.initial, &d.initial));
  CHECK(a.stats[0].loss != d.stats[0].loss);
  CHECK(!fixture_params_equal(&a.initial, &m.initial));
  /* Same data: the batch is identical, so only the init moved the loss. */
  int inputs[8 * 32];
  memcpy(inputs, a.t.inputs, sizeof inputs);
  CHECK(memcmp(inputs, m.t.inputs, sizeof inputs) == 0);
  CHECK(memcmp(inputs, d.t.inputs, sizeof inputs) != 0);
  run_free(&a);
  run_free(&d);
  run_free(&m);
  plan_free(&p);
  plan_free(&pd);
  plan_free(&pm);
}

static void unsupported_plans_and_missing_data_are_refused(void)
{
  struct plan p;
  struct trainer t;
  /* what the CPU runs of precision and device, and what it refuses by name */
  const struct { const char *sets[2]; const char *where, *says; } refused[] = {
    { { "precision.compute=fp16", "precision.grads=fp32" }, "--set precision.compute=fp16: ",
      "the CPU backend computes in fp32 or bf16" },
    { { "precision.compute=bf16", "precision.grads=fp16" }, "--set precision.grads=fp16: ",
      "gradients are kept in fp32 or bf16" },
    { { "device=cuda", "precision.grads=fp32" }, "--set device=cuda: ",
      devices_cuda_built() ? "no CUDA device visible" : "no CUDA backend" },
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    if (strstr(refused[i].sets[0], "cuda") && devices_cuda_count() > 0)
      continue; /* a device is visible: the plan runs */
    CHECK(compile(&p, 2, refused[i].sets) == 0);
    CHECK(trainer_open(&t, &p, NULL, err, sizeof err) == TRAIN_PLAN_ERROR);
    /* no bf16 kernels at all (float64): refused at precision.compute, before the finer reasons
     * (a CPU without bf16 products runs them widened) */
    if (REAL_IS_DOUBLE && strstr(refused[i].sets[0], "bf16")) {
      CHECK_STR_CONTAINS(err, "--set precision.compute=bf16: ");
      CHECK_STR_CONTAINS(err, "no bf16 compute");
      plan_free(&p);
      continue;
    }
    CHECK_STR_CONTAINS(err, refused[i].where); /* where it was written */
    CHECK_STR_CONTAINS(err, refused[i].says);
    plan_free(&p);
  }
  struct plan q;
  fixture_plan(&q, (struct fixture_shape){ 1, 16, 2, 2, 32, 64, 8, 2, 2 });
  q.data.synthetic[0] = '\0';
  snprintf(q.data.train, sizeof q.data.train, "/nonexistent/tokens.bin");
  CHECK(trainer_open(&t, &q, NULL, err, sizeof err) == TRAIN_RUNTIME_ERROR);
  CHECK_STR_CONTAINS(err, "/nonexistent/tokens.bin");
  q.data.train[0] = '\0';
  CHECK(trainer_open(&t, &q, NULL, err, sizeof err) == TRAIN_PLAN_ERROR);
  CHECK_STR_CONTAINS(err, "data.synthetic");
  snprintf(q.data.synthetic, sizeof q.data.synthetic, "addition");
  q.mesh.dp = q.mesh.world = 2; /* and no group of two to run it on */
  CHECK(trainer_open(&t, &q, NULL, err, sizeof err) == TRAIN_PLAN_ERROR);
  CHECK_STR_CONTAINS(err, "mesh.dp = 2, but the data-parallel group has 1 rank");
  q.mesh.dp = 1;
  q.mesh.tp = 2;
  CHECK(trainer_open(&t, &q, NULL, err, sizeof err) == TRAIN_PLAN_ERROR);
  CHECK_STR_CONTAINS(err, "mesh.tp = 2, but the tensor-parallel group has 1 rank");
  q.mesh.tp = 1;
  q.mesh.pp = 2;
  CHECK(trainer_open(&t, &q, NULL, err, sizeof err) == TRAIN_PLAN_ERROR);
  CHECK_STR_CONTAINS(err, "mesh.pp = 2, but the pipeline group has 1 rank");
  plan_free(&q);
}

/* A bf16 step reads every weight from its bf16 copy: the fp32 master moved below bf16's
 * resolution (each element x set to bf16(x)·(1 + 2^-12), which rounds back to bf16(x)) in the
 * norms' gains and the embedding gives the same loss and gradient norm bit for bit; moved above
 * it (the gains to 1 + 2^-6), the loss changes, so the copies are rounded again from the master. */
static void bf16_step_reads_the_copies_not_the_master(void)
{
  struct plan p;
  const char *sets[] = { "precision.compute=bf16" };
  if (compile(&p, 1, sets))
    return;
  if (REAL_IS_DOUBLE) { /* no bf16 compute in this build: refused as a plan error */
    struct trainer t;
    CHECK(trainer_open(&t, &p, NULL, err, sizeof err) == TRAIN_PLAN_ERROR);
    CHECK_STR_CONTAINS(err, "no bf16 compute");
    plan_free(&p);
    return;
  }
  struct train_step_stats st[3];
  for (int run = 0; run < 3; run++) { /* as initialized; moved below bf16's resolution; above */
    struct trainer t;
    if (trainer_open(&t, &p, NULL, err, sizeof err) != TRAIN_OK) {
      CHECK_MSG(0, "%s", err);
      break;
    }
    for (int i = 0; run > 0 && i < t.model.n_params; i++) {
      struct model_param *q = &t.model.params[i];
      const int gain = q->kind == MODEL_ATTN_NORM || q->kind == MODEL_MLP_NORM || q->kind == MODEL_FINAL_NORM;
      if (!q->data || !(gain || q->kind == MODEL_EMBED))
        continue;
      for (size_t e = 0; e < q->n_elems; e++)
        q->data[e] = run == 2 && gain ? 1.0f + 0x1p-6f : bf16_to_float(bf16_from_float(q->data[e])) * (1.0f + 0x1p-12f);
    }
    t.model.bf16_fresh = 0; /* the copies rounded again from the master before the forward */
    CHECK_MSG(trainer_step(&t, &st[run], err, sizeof err) == 0, "%s", err);
    trainer_close(&t);
  }
  printf("bf16 step 1: loss %.9g, moved below bf16: %.9g, above: %.9g\n", st[0].loss, st[1].loss, st[2].loss);
  CHECK(st[1].loss == st[0].loss && st[1].grad_norm == st[0].grad_norm);
  CHECK(st[2].loss != st[0].loss);
  plan_free(&p);
}

TEST_MAIN(TEST(loss_falls_and_runs_repeat_bitwise),
          TEST(bf16_step_reads_the_copies_not_the_master),
          TEST(data_seed_changes_data_not_init_and_model_seed_the_reverse),
          TEST(unsupported_plans_and_missing_data_are_refused))
