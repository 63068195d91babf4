/* The run's view of its sparse layers (host/runtime/train/train_moe.h): the busiest expert's share, the
 * imbalance warning over a window of TRAIN_MOE_WINDOW steps (raised above TRAIN_MOE_IMBALANCE ×
 * the fair share, and only then), the totals and the metrics' "moe" object. */
#include "check.h"
#include "runtime/train/train_moe.h"

#include <stdlib.h>

static void the_busiest_experts_share_against_the_fair_one(void)
{
  int e = -1;
  const double even[4] = { 5, 5, 5, 5 }, skew[4] = { 1, 9, 1, 1 }, none[4] = { 0, 0, 0, 0 };
  CHECK_NEAR(train_moe_imbalance(even, 4, &e), 1.0, 1e-15);
  CHECK(e == 0); /* ties: the first */
  CHECK_NEAR(train_moe_imbalance(skew, 4, &e), 9.0 * 4 / 12, 1e-15);
  CHECK(e == 1);
  CHECK(train_moe_imbalance(none, 4, &e) == 0.0);
}

/* A layer set by hand: 2 sparse layers (indices 1, 3) of 4 experts. */
static void fill(struct train_moe *m, const double routed[2][4])
{
  const int W = TRAIN_MOE_FIELDS + m->E;
  for (int i = 0; i < m->n; i++) {
    double *s = m->step + (size_t)i * W, sum = 0;
    for (int e = 0; e < m->E; e++) sum += s[TRAIN_MOE_FIELDS + e] = routed[i][e];
    s[0] = 2.0 * 8;    /* aux summed over 8 sequences: mean 2 */
    s[1] = 0.5 * 256;  /* z over 256 tokens: mean 0.5 */
    s[2] = 8;
    s[3] = 256;
    s[4] = sum;
    s[5] = sum / 4;    /* a quarter dropped */
  }
}

static void the_warning_comes_once_a_window_and_names_the_expert(void)
{
  struct train_moe m = { 0 };
  m.n = 2;
  m.E = 4;
  int layers[2] = { 1, 3 };
  m.layer = layers;
  m.step = calloc((size_t)2 * (TRAIN_MOE_FIELDS + 4), sizeof *m.step);
  m.window = calloc((size_t)2 * 5, sizeof *m.window);
  const double balanced[2][4] = { { 128, 128, 128, 128 }, { 100, 156, 128, 128 } };
  const double skewed[2][4] = { { 128, 128, 128, 128 }, { 40, 380, 46, 46 } };
  char buf[1024];
  int warned = 0;
  /* a window of balanced steps, then one where layer 3's expert 1 takes 380/512 of them */
  for (long long s = 0; s < TRAIN_MOE_WINDOW; s++) {
    fill(&m, balanced);
    warned += train_moe_window(&m, s, 0, buf, sizeof buf);
  }
  CHECK(warned == 0);
  for (long long s = TRAIN_MOE_WINDOW; s < 2 * TRAIN_MOE_WINDOW - 1; s++) {
    fill(&m, skewed);
    CHECK(train_moe_window(&m, s, 0, buf, sizeof buf) == 0); /* not before the window ends */
  }
  fill(&m, skewed);
  CHECK(train_moe_window(&m, 2 * TRAIN_MOE_WINDOW - 1, 0, buf, sizeof buf) == 1);
  CHECK_STR_CONTAINS(buf, "warning: layer 3: expert 1 took 3.0× its share of the tokens (74.2% of 51200 "
                          "assignments, 1/4 fair) over steps 101-200");
  /* the last step closes a short window */
  fill(&m, skewed);
  CHECK(train_moe_window(&m, 2 * TRAIN_MOE_WINDOW, 1, buf, sizeof buf) == 1);
  CHECK_STR_CONTAINS(buf, "over steps 201-201");

  double aux, z, dropped;
  train_moe_totals(&m, &aux, &z, &dropped);
  CHECK_NEAR(aux, 4.0, 1e-15); /* two layers of mean 2 */
  CHECK_NEAR(z, 1.0, 1e-15);
  CHECK_NEAR(dropped, 0.25, 1e-15);
  char json[1024];
  train_moe_json(&m, json, sizeof json);
  CHECK_STR_CONTAINS(json, ", \"moe\": {\"aux\": 4, \"z\": 1, \"dropped\": 0.25, \"layers\": [{\"layer\": 1, "
                           "\"aux\": 2, \"dropped\": 0.25, \"tokens\": [128, 128, 128, 128]}, {\"layer\": 3, "
                           "\"aux\": 2, \"dropped\": 0.25, \"tokens\": [40, 380, 46, 46]}]}");
  train_moe_progress(&m, buf, sizeof buf);
  CHECK_STR_CONTAINS(buf, " | moe aux 4.000 drop 25.0%");
  free(m.step);
  free(m.window);
}

TEST_MAIN(TEST(the_busiest_experts_share_against_the_fair_one),
          TEST(the_warning_comes_once_a_window_and_names_the_expert))
