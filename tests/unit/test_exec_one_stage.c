/* The executor on a one-stage plan (mesh.pp = 1): the same executor as with pipeline stages,
 * running the schedule's list as written. 1F1B alternates forward and backward and holds one
 * micro-batch's activations; GPipe runs every forward first and holds all m. Both train the same
 * model: the losses agree (the micro-batches' gradients are summed in the same order, backward
 * by backward), and the memory bill predicts each one's slots and activations exactly. */
#include "check.h"
#include "runtime/model/alloc.h"
#include "layout/bill.h"
#include "runtime/train/train.h"
#include "runtime_fixture.h"

static char err[512];

struct run {
  double loss[3];
  int n_slots, peak_slots;
  size_t activations;      /* measured peak of the activations category */
  struct bill bill;
  int ops[64], n_ops;      /* this rank's list */
};

static void run_schedule(enum plan_schedule kind, struct run *out)
{
  struct plan p;
  struct fixture_shape s = { 2, 32, 4, 2, 64, 64, 24, 8, 2 }; /* micro 2: 4 micro-batches */
  fixture_plan(&p, s);
  p.schedule = kind;
  p.model.dropout = 0.1;
  memset(out, 0, sizeof *out);
  CHECK_MSG(bill_predict(&p, 0, &out->bill, err, sizeof err) == 0, "%s", err);
  alloc_reset_peaks();
  struct trainer t;
  CHECK_MSG(trainer_open(&t, &p, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  const struct sched_list *list = &t.exec.sched.ranks[0];
  out->n_ops = list->n < 64 ? list->n : 64;
  for (int i = 0; i < out->n_ops; i++) out->ops[i] = list->instr[i].op;
  for (int k = 0; k < 3; k++) {
    struct train_step_stats st;
    CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
    out->loss[k] = st.loss;
  }
  out->n_slots = t.exec.n_slots;
  out->peak_slots = t.exec.peak_slots;
  out->activations = alloc_bill()->peak_bytes[ALLOC_ACTIVATIONS];
  trainer_close(&t);
  plan_free(&p);
}

static void one_f_one_b_alternates_and_holds_one_slot(void)
{
  struct run r;
  run_schedule(PLAN_SCHED_1F1B, &r);
  /* F B F B F B F B, REDUCE_GRADS, OPTIMIZER: the list the executor ran */
  static const int want[] = { SCHED_FWD, SCHED_BWD, SCHED_FWD, SCHED_BWD, SCHED_FWD, SCHED_BWD,
                              SCHED_FWD, SCHED_BWD, SCHED_REDUCE_GRADS, SCHED_OPTIMIZER };
  CHECK_MSG(r.n_ops == 10, "%d instructions", r.n_ops);
  for (int i = 0; i < 10 && i < r.n_ops; i++)
    CHECK_MSG(r.ops[i] == want[i], "instruction %d is %s, expected %s", i, sched_op_name(r.ops[i]),
              sched_op_name(want[i]));
  CHECK(r.n_slots == 1 && r.peak_slots == 1);
  CHECK(r.bill.n_slots == 1);
  CHECK_MSG((double)r.activations == r.bill.bytes[ALLOC_ACTIVATIONS], "activations %zu, billed %.0f",
            r.activations, r.bill.bytes[ALLOC_ACTIVATIONS]);
}

static void gpipe_holds_every_micro_batch_and_trains_the_same(void)
{
  struct run g, f;
  run_schedule(PLAN_SCHED_GPIPE, &g);
  run_schedule(PLAN_SCHED_1F1B, &f);
  CHECK_MSG(g.n_ops == 10 && g.ops[0] == SCHED_FWD && g.ops[3] == SCHED_FWD && g.ops[4] == SCHED_BWD,
            "GPipe's list does not start with 4 forwards");
  CHECK_MSG(g.n_slots == 4 && g.peak_slots == 4, "GPipe: %d slots, %d in use at most", g.n_slots, g.peak_slots);
  CHECK(g.bill.n_slots == 4);
  CHECK_MSG((double)g.activations == g.bill.bytes[ALLOC_ACTIVATIONS], "activations %zu, billed %.0f",
            g.activations, g.bill.bytes[ALLOC_ACTIVATIONS]);
  /* four slots of the whole model's activations against one: more than three times the bytes */
  CHECK_MSG(g.activations > 3 * f.activations, "GPipe %zu bytes of activations, 1F1B %zu", g.activations,
            f.activations);
  /* The same windows, masks and kernels; only which slot holds a micro-batch differs, and the
   * backwards run in the same order (0 .. m−1), so the gradients are summed alike: bitwise. */
  for (int k = 0; k < 3; k++)
    CHECK_MSG(g.loss[k] == f.loss[k], "step %d: GPipe %.17g, 1F1B %.17g", k, g.loss[k], f.loss[k]);
  printf("one stage, 4 micro-batches: activations GPipe %zu B (4 slots), 1F1B %zu B (1 slot); losses "
         "%.9f %.9f %.9f both\n", g.activations, f.activations, f.loss[0], f.loss[1], f.loss[2]);
}

TEST_MAIN(TEST(one_f_one_b_alternates_and_holds_one_slot),
          TEST(gpipe_holds_every_micro_batch_and_trains_the_same))
