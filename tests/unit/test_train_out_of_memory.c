/* Running out of memory is an error the caller gets, not the end of the process (docs/design.md,
 * "The runtime is a library"). With the allocator capped (alloc_set_limit) at fractions of what
 * tests/plans/good/dp_small.lua needs to open, trainer_open returns TRAIN_RUNTIME_ERROR with a
 * message that names what it was allocating, and leaves nothing behind (the allocator's live blocks
 * and bytes back where they were). Then the same process, cap lifted, opens a smaller plan and
 * trains it, and opens the first plan again and trains it to the same losses as a trainer that
 * never saw a failure. */
#include "check.h"
#include "plan_fixture.h"
#include "runtime/model/alloc.h"
#include "layout/bill.h"
#include "runtime/train/train.h"

#include <stdlib.h>

static char err[2048];

static int compile(struct plan *p, int n_sets, const char *const *sets)
{
  return fixture_compile("tests/plans/good/dp_small.lua", 1, sets, n_sets, p);
}

/* Opens, trains `steps` steps (losses into out), closes. 0 ok. */
static int train(const struct plan *p, int steps, double *out)
{
  struct trainer t;
  if (trainer_open(&t, p, NULL, err, sizeof err) != TRAIN_OK) {
    CHECK_MSG(0, "%s", err);
    return 1;
  }
  for (int s = 0; s < steps; s++) {
    struct train_step_stats st;
    CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
    out[s] = st.loss;
  }
  trainer_close(&t);
  return 0;
}

static void open_fails_cleanly_and_the_process_goes_on(void)
{
  struct plan p, small;
  const char *smaller[] = { "model.n_layers=1", "model.dim=16", "model.ffn_dim=32", "batch.micro=2" };
  if (compile(&p, 0, NULL) || compile(&small, 4, smaller))
    return;
  double reference[3];
  if (train(&p, 3, reference))
    return;
  const struct alloc_bill *b = alloc_bill();
  const size_t live = b->n_live, in_use = b->total_bytes;
  /* what the open needs at its peak */
  struct trainer t;
  alloc_reset_peaks();
  CHECK(trainer_open(&t, &p, NULL, err, sizeof err) == TRAIN_OK);
  const size_t need = b->total_peak_bytes - in_use;
  trainer_close(&t);
  int failures = 0;
  for (int k = 1; k <= 9; k++) {
    const size_t cap = in_use + need * (size_t)k / 10;
    alloc_set_limit(cap);
    err[0] = 0;
    const int rc = trainer_open(&t, &p, NULL, err, sizeof err);
    alloc_set_limit(0);
    CHECK_MSG(rc == TRAIN_RUNTIME_ERROR, "open under a cap of %d/10 of what it needs: %d", k, rc);
    CHECK_STR_CONTAINS(err, "out of memory for ");
    CHECK_MSG(b->n_live == live && b->total_bytes == in_use, "cap %d/10: %zu blocks and %zu bytes left, "
              "%zu and %zu before", k, b->n_live, b->total_bytes, live, in_use);
    failures += rc == TRAIN_RUNTIME_ERROR;
    if (k == 1 || k == 9)
      printf("cap at %d0%% of the open's %zu bytes: \"%s\"\n", k, need, err);
  }
  CHECK(failures == 9);
  double small_losses[3], again[3];
  if (train(&small, 3, small_losses) == 0)
    CHECK(isfinite(small_losses[2]) && small_losses[2] < small_losses[0] + 1.0);
  if (train(&p, 3, again) == 0)
    for (int s = 0; s < 3; s++)
      CHECK_MSG(again[s] == reference[s], "step %d: loss %.17g after the failures, %.17g before", s, again[s],
                reference[s]); /* the same operations on the same data: bitwise */
  CHECK(b->n_live == live && b->total_bytes == in_use);
  plan_free(&p);
  plan_free(&small);
}

/* Under ZeRO-3 a step gathers each unit's parameters as it runs: memory the open does not hold.
 * The trainer reserves its memory bill at open, so a cap between what the open holds and the
 * bill is refused there, naming the category, instead of failing at the step's first gather;
 * under a cap of exactly the bill the plan trains (the bill is the run's peak). */
static void a_step_that_cannot_fit_is_refused_at_open(void)
{
  const char *sets[] = { "zero=3" };
  struct plan p;
  if (compile(&p, 1, sets))
    return;
  struct bill bill;
  CHECK_MSG(bill_predict(&p, 0, &bill, err, sizeof err) == 0, "%s", err);
  const struct alloc_bill *b = alloc_bill();
  const size_t live = b->n_live, in_use = b->total_bytes;
  struct trainer t;
  CHECK_MSG(trainer_open(&t, &p, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  const size_t held = b->total_bytes - in_use; /* what the open allocated */
  trainer_close(&t);
  CHECK_MSG((double)held < bill.total, "the open holds %zu bytes, the bill %.0f", held, bill.total);
  const size_t total = (size_t)bill.total;
  alloc_set_limit(in_use + held + (total - held) / 2);
  err[0] = 0;
  const int rc = trainer_open(&t, &p, NULL, err, sizeof err);
  alloc_set_limit(0);
  CHECK_MSG(rc == TRAIN_RUNTIME_ERROR, "open under a cap below the bill: %d", rc);
  CHECK_STR_CONTAINS(err, "out of memory for the step's params");
  CHECK(b->n_live == live && b->total_bytes == in_use);
  printf("cap between the open's %zu bytes and the bill's %zu: \"%s\"\n", held, total, err);
  /* a cap of the bill exactly: opens, and two steps stay under it */
  alloc_set_limit(in_use + total);
  alloc_reset_peaks();
  if (trainer_open(&t, &p, NULL, err, sizeof err) == TRAIN_OK) {
    for (int s = 0; s < 2; s++) {
      struct train_step_stats st;
      CHECK_MSG(trainer_step(&t, &st, err, sizeof err) == 0, "%s", err);
      CHECK(isfinite(st.loss));
    }
    CHECK_MSG(b->total_peak_bytes <= in_use + total, "peak %zu over the cap %zu", b->total_peak_bytes,
              in_use + total);
    trainer_close(&t);
  } else {
    CHECK_MSG(0, "under a cap of the bill: %s", err);
  }
  alloc_set_limit(0);
  CHECK(b->n_live == live && b->total_bytes == in_use);
  plan_free(&p);
}

TEST_MAIN(TEST(open_fails_cleanly_and_the_process_goes_on),
          TEST(a_step_that_cannot_fit_is_refused_at_open))
