/* The zero-bubble schedule ZB-H1 and the split backward (BWD_B, BWD_W) it runs: over pp 2..8
 * and m pp..4pp every list is complete and free of deadlock, its idle time per rank is the
 * paper's (pp − 1)(F + B − W) under equal stages (forward 1, B 1, W 1), below 1F1B's; every
 * rank holds pp micro-batches until their W, 1F1B's rank-0 peak; uneven stages and recompute
 * still simulate below 1F1B; shapes it cannot serve and misplaced halves are refused by name.
 * Times are sums of small integers: bounds of 1e-9 say "equal". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sched/sched.h"

static int find(const struct sched *s, int rank, int op, int stage, int mb)
{
  const struct sched_list *l = &s->ranks[rank];
  for (int i = 0; i < l->n; i++)
    if (l->instr[i].op == op && l->instr[i].stage == stage && l->instr[i].mb == mb)
      return i;
  return -1;
}

static void move(struct sched *s, int rank, int from, int to)
{
  struct sched_list *l = &s->ranks[rank];
  struct sched_instr in = l->instr[from];
  if (from < to)
    memmove(&l->instr[from], &l->instr[from + 1], (size_t)(to - from) * sizeof in);
  else
    memmove(&l->instr[to + 1], &l->instr[to], (size_t)(from - to) * sizeof in);
  l->instr[to] = in;
}

/* Equal stages: makespan 3m + pp − 1, idle pp − 1 = (pp − 1)(F + B − W) on every rank, each
 * rank busy 3m; 1F1B's idle is 3(pp − 1); peak in-flight pp on every rank. */
static void test_zb_h1_bubble_is_the_papers_formula(void)
{
  for (int pp = 2; pp <= 8; pp++)
    for (int m = pp; m <= 4 * pp; m++) {
      char err[1024] = "";
      struct sched s, o;
      struct sched_sim r, ro;
      int rc = sched_zb_h1(&s, pp, m, 1, NULL, err, sizeof err);
      CHECK_MSG(rc == 0, "pp %d m %d: %s", pp, m, err);
      if (rc == 0) {
        CHECK_MSG(sched_check(&s, err, sizeof err) == 0, "pp %d m %d: %s", pp, m, err);
        rc = sched_simulate(&s, &r, err, sizeof err);
        CHECK_MSG(rc == 0, "pp %d m %d: %s", pp, m, err);
      }
      CHECK(sched_1f1b(&o, pp, m, 1, NULL, err, sizeof err) == 0);
      CHECK(sched_simulate(&o, &ro, err, sizeof err) == 0);
      if (rc == 0) {
        const double F = 1, B = 1, W = 1;
        CHECK_NEAR(r.makespan, 3.0 * m + pp - 1, 1e-9);
        CHECK_NEAR(r.idle, pp * (pp - 1) * (F + B - W), 1e-9);
        CHECK_NEAR(ro.idle, pp * (pp - 1) * (F + B + W), 1e-9);
        CHECK_MSG(r.idle < ro.idle && r.bubble_fraction < ro.bubble_fraction, "pp %d m %d: zb %g, 1f1b %g", pp,
                  m, r.idle, ro.idle);
        for (int rank = 0; rank < pp; rank++) {
          CHECK_NEAR(r.ranks[rank].busy, 3.0 * m, 1e-9);
          CHECK_MSG(r.ranks[rank].peak_inflight == pp, "pp %d m %d rank %d: peak %d", pp, m, rank,
                    r.ranks[rank].peak_inflight);
          CHECK(r.ranks[rank].peak_inflight <= ro.ranks[0].peak_inflight);
        }
        sched_sim_free(&r);
      }
      sched_sim_free(&ro);
      sched_free(&o);
      sched_free(&s);
    }
}

/* Uneven stages (stage 2 three times as slow), uneven W shares and recompute on every other
 * stage: complete, free of deadlock, every rank's busy time the sum of its costs, and idle
 * below 1F1B's under the same costs. */
static void test_zb_h1_uneven_costs_and_recompute(void)
{
  for (int pp = 2; pp <= 8; pp++)
    for (int m = pp; m <= 4 * pp; m += pp) {
      uint8_t rcmp[8];
      for (int st = 0; st < pp; st++)
        rcmp[st] = st % 2 == 0;
      struct sched s[2];
      struct sched_sim r[2];
      char err[1024] = "";
      int ok = 1;
      for (int k = 0; k < 2; k++) {
        int rc = k ? sched_zb_h1(&s[k], pp, m, 1, rcmp, err, sizeof err)
                   : sched_1f1b(&s[k], pp, m, 1, rcmp, err, sizeof err);
        CHECK_MSG(rc == 0, "pp %d m %d: %s", pp, m, err);
        for (int st = 0; rc == 0 && st < pp; st++) {
          s[k].costs.fwd[st] = st == 2 ? 3 : 1 + 0.1 * st;
          s[k].costs.bwd[st] = 2 * s[k].costs.fwd[st] + 0.2;
          s[k].costs.recompute[st] = 0.5;
          s[k].costs.w_share[st] = 0.3 + 0.05 * st;
        }
        if (rc == 0) {
          rc = sched_simulate(&s[k], &r[k], err, sizeof err);
          CHECK_MSG(rc == 0, "%s pp %d m %d: %s", k ? "zb-h1" : "1f1b", pp, m, err);
        }
        ok &= rc == 0;
      }
      if (ok) {
        for (int rank = 0; rank < pp; rank++) {
          double want = m * (s[1].costs.fwd[rank] + s[1].costs.bwd[rank] + (rcmp[rank] ? 0.5 : 0));
          CHECK_NEAR(r[1].ranks[rank].busy, want, 1e-9);
        }
        CHECK_MSG(r[1].idle < r[0].idle, "pp %d m %d: zb-h1 idle %g, 1f1b %g", pp, m, r[1].idle, r[0].idle);
        CHECK(r[1].makespan < r[0].makespan);
      }
      for (int k = 0; k < 2; k++) {
        sched_sim_free(&r[k]);
        sched_free(&s[k]);
      }
    }
}

/* pp 4, m 8, as the paper draws ZB-H1: rank 0 runs a W after each B; the last rank holds
 * three W's back and runs them at the end. */
static void test_zb_h1_order_matches_the_paper(void)
{
  struct sched s;
  char err[256];
  CHECK(sched_zb_h1(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  const char *want[4] = {
    "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7 ",
    "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7 ",
    "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7 ",
    "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7 ",
  };
  for (int rank = 0; rank < 4; rank++) {
    char got[256] = "";
    size_t len = 0;
    for (int i = 0; i < s.ranks[rank].n; i++) {
      const struct sched_instr *in = &s.ranks[rank].instr[i];
      CHECK(in->op != SCHED_BWD);
      if (in->op == SCHED_FWD || in->op == SCHED_BWD_B || in->op == SCHED_BWD_W)
        len += (size_t)snprintf(got + len, sizeof got - len, "%c%d ",
                                in->op == SCHED_FWD ? 'F' : in->op == SCHED_BWD_B ? 'B' : 'W', in->mb);
    }
    CHECK_MSG(strcmp(got, want[rank]) == 0, "rank %d got %s", rank, got);
  }
  sched_free(&s);
}

/* The split costs B = bwd · (1 − share), W = bwd · share: with share 1/4 (B 1.5, W 0.5) each
 * rank's idle time is (pp − 1)(F + B − W) = 3 · 2 for pp 4, twice the equal split's. */
static void test_w_share_splits_the_backward(void)
{
  struct sched s;
  struct sched_sim r;
  char err[256];
  CHECK(sched_zb_h1(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  for (int st = 0; st < 4; st++)
    s.costs.w_share[st] = 0.25;
  CHECK(sched_simulate(&s, &r, err, sizeof err) == 0);
  int b = find(&s, 2, SCHED_BWD_B, 2, 3), w = find(&s, 2, SCHED_BWD_W, 2, 3);
  CHECK(b >= 0 && w > b);
  if (b >= 0 && w >= 0) {
    CHECK_NEAR(r.ranks[2].end[b] - r.ranks[2].start[b], 1.5, 1e-12);
    CHECK_NEAR(r.ranks[2].end[w] - r.ranks[2].start[w], 0.5, 1e-12);
  }
  CHECK_NEAR(r.idle, 4 * 3 * (1 + 1.5 - 0.5), 1e-9);
  sched_sim_free(&r);
  sched_free(&s);
}

/* Merged back into whole backwards (what the memory bill walks), ZB-H1's list is 1F1B's,
 * instruction for instruction, messages and reductions included. */
static void test_merged_zb_h1_is_1f1b(void)
{
  for (int pp = 1; pp <= 6; pp++)
    for (int m = pp; m <= 3 * pp; m++) {
      struct sched z, o;
      char err[512] = "";
      uint8_t rcmp[6] = { 1, 0, 1, 0, 1, 0 };
      CHECK(sched_zb_h1(&z, pp, m, 1, rcmp, err, sizeof err) == 0);
      CHECK(sched_1f1b(&o, pp, m, 1, rcmp, err, sizeof err) == 0);
      CHECK_MSG(sched_merge_split(&z, err, sizeof err) == 0, "pp %d m %d: %s", pp, m, err);
      CHECK(z.split == 0);
      for (int r = 0; r < pp; r++) {
        int same = z.ranks[r].n == o.ranks[r].n;
        for (int i = 0; same && i < o.ranks[r].n; i++) {
          const struct sched_instr *a = &z.ranks[r].instr[i], *b = &o.ranks[r].instr[i];
          same = a->op == b->op && a->stage == b->stage && a->mb == b->mb && a->peer == b->peer;
        }
        CHECK_MSG(same, "pp %d m %d rank %d: the merged list differs from 1F1B's", pp, m, r);
      }
      sched_free(&z);
      sched_free(&o);
    }
}

/* Shapes ZB-H1 cannot serve, and misplaced halves, are refused with the reason. */
static void test_refusals_name_the_cause(void)
{
  struct sched s;
  struct sched_sim r;
  char err[512] = "";
  CHECK(sched_zb_h1(&s, 4, 3, 1, NULL, err, sizeof err) == SCHED_INVALID);
  CHECK_MSG(strstr(err, "schedule zb-h1: 3 micro-batches for pp = 4: ZB-H1 needs at least pp micro-batches"), "%s",
            err);
  sched_free(&s);
  CHECK(sched_zb_h1(&s, 2, 4, 2, NULL, err, sizeof err) == SCHED_INVALID);
  CHECK_MSG(strstr(err, "schedule zb-h1: virtual stages = 2"), "%s", err);
  sched_free(&s);
  CHECK(sched_build(&s, PLAN_SCHED_ZB_H1, 2, 4, 1, NULL, err, sizeof err) == 0);
  sched_free(&s);

  /* W before its B */
  CHECK(sched_zb_h1(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  move(&s, 3, find(&s, 3, SCHED_BWD_W, 3, 2), 0);
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
  CHECK_MSG(strstr(err, "schedule zb-h1: rank 3: BWD_W(stage 3, mb 2) at #0 must come after BWD_B(stage 3, mb 2) at #"),
            "%s", err);
  sched_free(&s);
  /* REDUCE_GRADS before the stage's last W (after its last B: the weights are not done) */
  CHECK(sched_zb_h1(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  int red = find(&s, 3, SCHED_REDUCE_GRADS, 3, -1);
  move(&s, 3, red, find(&s, 3, SCHED_BWD_B, 3, 7) + 1);
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
  CHECK_MSG(strstr(err, "schedule zb-h1: rank 3: REDUCE_GRADS(stage 3) at #"), "%s", err);
  sched_free(&s);
  /* a whole backward in a split list, a split one in a whole list */
  CHECK(sched_zb_h1(&s, 2, 2, 1, NULL, err, sizeof err) == 0);
  s.ranks[1].instr[find(&s, 1, SCHED_BWD_B, 1, 0)].op = SCHED_BWD;
  CHECK(sched_simulate(&s, &r, err, sizeof err) == SCHED_INCOMPLETE);
  CHECK_MSG(strstr(err, "BWD(stage 1, mb 0): a whole backward in a split (zero-bubble) list"), "%s", err);
  sched_sim_free(&r);
  sched_free(&s);
  CHECK(sched_1f1b(&s, 2, 2, 1, NULL, err, sizeof err) == 0);
  s.ranks[1].instr[find(&s, 1, SCHED_BWD, 1, 0)].op = SCHED_BWD_B;
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
  CHECK_MSG(strstr(err, "BWD_B(stage 1, mb 0): a split backward in a list of whole backwards"), "%s", err);
  sched_free(&s);
}

TEST_MAIN(TEST(test_zb_h1_bubble_is_the_papers_formula),
          TEST(test_zb_h1_uneven_costs_and_recompute),
          TEST(test_zb_h1_order_matches_the_paper),
          TEST(test_w_share_splits_the_backward),
          TEST(test_merged_zb_h1_is_1f1b),
          TEST(test_refusals_name_the_cause))
