/* Micro-batch accumulation gives the full batch's loss and gradients: a global batch of 8
 * windows as one micro-batch of 8 and as 4 micro-batches of 2 (relative L2 ≤ 168 · REAL_U,
 * 1e-5 in fp32), with and without dropout (masks follow the window, not the row of the
 * micro-batch). */
#include "check.h"
#include "runtime/train/train.h"
#include "runtime_fixture.h"

#include <math.h>

static char err[512];

static void compare_micro(double dropout)
{
  struct plan whole, split;
  struct fixture_shape s = { 2, 32, 4, 2, 64, 64, 24, 8, 8 };
  fixture_plan(&whole, s);
  s.micro = 2;
  fixture_plan(&split, s);
  whole.model.dropout = split.model.dropout = dropout;
  struct trainer a, b;
  CHECK_MSG(trainer_open(&a, &whole, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  CHECK_MSG(trainer_open(&b, &split, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  CHECK(whole.batch.microbatches == 1 && split.batch.microbatches == 4);
  CHECK(fixture_params_equal(&a.model, &b.model)); /* init: the same seed and names, bitwise */
  a.step = b.step = 5; /* any step: windows 40..47 */
  double la = trainer_forward_backward(&a), lb = trainer_forward_backward(&b);
  /* The two differ only in how sums are grouped: a gemm over 48 rows instead of 192 (its
   * blocking may change a row's sums), and weight gradients as 4 partial 48-row sums added
   * instead of one 192-row sum. Loss: a mean of 192 token losses, each a few roundings off:
   * relative 16 · REAL_U (1e-6 in fp32). Gradients: re-associated 192-term sums, ~2 sqrt(192)
   * ≈ 28 units as a random walk, times the cancellation Σ|terms| / |Σ| (a few): relative L2
   * per tensor 168 · REAL_U (1e-5 in fp32). Seen: 5 units in both builds. A micro-batch left
   * out or counted twice is off by ≥ 1/4 (and another step's gradients by > 1e-2, below). */
  CHECK_NEAR(lb, la, 16 * REAL_U * la);
  CHECK(la > 3.0 && la < 5.0); /* near ln 64 at init */
  double worst = 0.0;
  for (int i = 0; i < a.model.n_params; i++) {
    const struct model_param *p = &a.model.params[i], *q = &b.model.params[i];
    double rel = fixture_rel_l2(q->grad, p->grad, p->n_elems);
    worst = rel > worst ? rel : worst;
    CHECK_MSG(rel <= 168 * REAL_U, "dropout %g: %s: relative L2 %.3g", dropout, p->name, rel);
  }
  printf("dropout %g: loss %.9f vs %.9f, worst gradient relative L2 %.3g (%.3g units)\n", dropout,
         la, lb, worst, worst / REAL_U);
  /* And it is a real comparison: another step's gradients differ. */
  b.step = 6;
  trainer_forward_backward(&b);
  CHECK(fixture_rel_l2(b.model.params[1].grad, a.model.params[1].grad, a.model.params[1].n_elems) > 1e-2);
  trainer_close(&a);
  trainer_close(&b);
}

static void micro_2_accumulates_to_micro_8_without_dropout(void)
{
  compare_micro(0.0);
}

static void micro_2_accumulates_to_micro_8_with_dropout(void)
{
  compare_micro(0.1);
}

TEST_MAIN(TEST(micro_2_accumulates_to_micro_8_without_dropout),
          TEST(micro_2_accumulates_to_micro_8_with_dropout))
