/* The three generators over a sweep of shapes: every schedule is complete and free of
 * deadlock, its bubble equals the textbook figure under equal stage costs (forward 1, backward
 * 2, no communication), and it holds the activations the textbook says it holds. Times are sums
 * of small integers and halves in double, exact or a few roundings of 1.1e-16 off: bounds of
 * 1e-12 (1e-9 for the sums over many slots) say "equal", and a slot out of place moves a time
 * by ≥ 0.5. */
#include <stdlib.h>

#include "check.h"
#include "sched/sched.h"

/* Builds and simulates; on failure reports which shape and why, and returns nonzero. */
static int build_and_simulate(enum plan_schedule kind, int pp, int m, int v, const uint8_t *recompute,
                              struct sched *s, struct sched_sim *r)
{
  char err[1024] = "";
  int rc = sched_build(s, kind, pp, m, v, recompute, err, sizeof err);
  CHECK_MSG(rc == 0, "%s pp %d m %d v %d: build: %s", plan_schedule_name(kind), pp, m, v, err);
  if (rc)
    return rc;
  rc = sched_simulate(s, r, err, sizeof err);
  CHECK_MSG(rc == 0, "%s pp %d m %d v %d: simulate: %s", plan_schedule_name(kind), pp, m, v, err);
  return rc;
}

/* GPipe and 1F1B, pp 1..8, m 1..16: bubble fraction = idle / (pp · makespan) = (p−1)/(m+p−1)
 * exactly, makespan = 3(m+p−1), every rank busy 3m. */
static void test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(void)
{
  enum plan_schedule kinds[] = { PLAN_SCHED_GPIPE, PLAN_SCHED_1F1B };
  for (int k = 0; k < 2; k++)
    for (int pp = 1; pp <= 8; pp++)
      for (int m = 1; m <= 16; m++) {
        struct sched s;
        struct sched_sim r;
        if (build_and_simulate(kinds[k], pp, m, 1, NULL, &s, &r) == 0) {
          CHECK_NEAR(r.makespan, 3.0 * (m + pp - 1), 1e-12);
          CHECK_NEAR(r.bubble_fraction, (double)(pp - 1) / (m + pp - 1), 1e-12);
          CHECK_NEAR(r.bubble_over_ideal, (double)(pp - 1) / m, 1e-12);
          for (int rank = 0; rank < pp; rank++)
            CHECK_NEAR(r.ranks[rank].busy, 3.0 * m, 1e-12);
        }
        sched_sim_free(&r);
        sched_free(&s);
      }
}

/* Peak in-flight micro-batches: GPipe holds all m on every rank, 1F1B min(pp − rank, m). */
static void test_peak_inflight_gpipe_m_1f1b_pp_minus_rank(void)
{
  for (int pp = 1; pp <= 8; pp++)
    for (int m = 1; m <= 16; m++) {
      struct sched s;
      struct sched_sim r;
      if (build_and_simulate(PLAN_SCHED_GPIPE, pp, m, 1, NULL, &s, &r) == 0)
        for (int rank = 0; rank < pp; rank++)
          CHECK_MSG(r.ranks[rank].peak_inflight == m, "gpipe pp %d m %d rank %d: %d", pp, m, rank,
                    r.ranks[rank].peak_inflight);
      sched_sim_free(&r);
      sched_free(&s);
      if (build_and_simulate(PLAN_SCHED_1F1B, pp, m, 1, NULL, &s, &r) == 0)
        for (int rank = 0; rank < pp; rank++) {
          int want = pp - rank < m ? pp - rank : m;
          CHECK_MSG(r.ranks[rank].peak_inflight == want, "1f1b pp %d m %d rank %d: %d, want %d", pp, m,
                    rank, r.ranks[rank].peak_inflight, want);
        }
      sched_sim_free(&r);
      sched_free(&s);
    }
}

/* Interleaved, pp 1..8, v 2..4, m every multiple of pp up to 16: Megatron's bubble time over
 * ideal time, idle / busy summed over ranks = (p−1)/(v·m), i.e. makespan = 3·v·m + 3·(p−1)
 * with forward 1 and backward 2 per stage (= per chunk). */
static void test_interleaved_bubble_is_p_minus_1_over_v_m(void)
{
  for (int pp = 1; pp <= 8; pp++)
    for (int v = 2; v <= 4; v++)
      for (int m = pp; m <= 16; m += pp) {
        struct sched s;
        struct sched_sim r;
        if (build_and_simulate(PLAN_SCHED_INTERLEAVED, pp, m, v, NULL, &s, &r) == 0) {
          CHECK_MSG(fabs(r.bubble_over_ideal - (double)(pp - 1) / (v * m)) < 1e-12,
                    "interleaved pp %d v %d m %d: bubble/ideal %.6f, want (p-1)/(vm) = %.6f (makespan %g)",
                    pp, v, m, r.bubble_over_ideal, (double)(pp - 1) / (v * m), r.makespan);
          CHECK_NEAR(r.makespan, 3.0 * v * m + 3.0 * (pp - 1), 1e-12);
          for (int rank = 0; rank < pp; rank++)
            CHECK_NEAR(r.ranks[rank].busy, 3.0 * v * m, 1e-12);
        }
        sched_sim_free(&r);
        sched_free(&s);
      }
}

/* Interleaved holds per chunk what Megatron's warm-up implies: rank r runs
 * min((pp − r − 1)·2 + (v − 1)·pp, m·v) forwards before its first backward (all m·v when
 * m = pp), so it holds one more than that at the peak, or all of them. */
static void test_interleaved_peak_inflight_is_warmup_plus_one(void)
{
  for (int pp = 1; pp <= 8; pp++)
    for (int v = 2; v <= 4; v++)
      for (int m = pp; m <= 16; m += pp) {
        struct sched s;
        struct sched_sim r;
        if (build_and_simulate(PLAN_SCHED_INTERLEAVED, pp, m, v, NULL, &s, &r) == 0)
          for (int rank = 0; rank < pp; rank++) {
            int warmup = (pp - rank - 1) * 2 + (v - 1) * pp, total = m * v;
            int want = m == pp || warmup >= total ? total : warmup + 1;
            CHECK_MSG(r.ranks[rank].peak_inflight == want, "interleaved pp %d v %d m %d rank %d: %d, want %d",
                      pp, v, m, rank, r.ranks[rank].peak_inflight, want);
          }
        sched_sim_free(&r);
        sched_free(&s);
      }
}

/* GPipe also runs virtual stages (chunk by chunk); recompute on some stages, a communication
 * cost, and costs for the reduction and the optimizer keep every shape complete and running. */
static void test_gpipe_virtual_recompute_and_comm_still_complete(void)
{
  enum plan_schedule kinds[] = { PLAN_SCHED_GPIPE, PLAN_SCHED_1F1B, PLAN_SCHED_INTERLEAVED };
  for (int k = 0; k < 3; k++)
    for (int pp = 1; pp <= 6; pp++)
      for (int v = 1; v <= 3; v++)
        for (int m = 1; m <= 12; m++) {
          if ((kinds[k] == PLAN_SCHED_1F1B && v != 1) || (kinds[k] == PLAN_SCHED_INTERLEAVED && (v < 2 || m % pp)))
            continue;
          uint8_t recompute[18];
          for (int i = 0; i < pp * v; i++)
            recompute[i] = (uint8_t)(i % 2);
          struct sched s;
          struct sched_sim r;
          char err[1024] = "";
          int rc = sched_build(&s, kinds[k], pp, m, v, recompute, err, sizeof err);
          CHECK_MSG(rc == 0, "%s", err);
          s.costs.comm = 0.25;
          s.costs.reduce_grads = 0.5;
          s.costs.optimizer = 1;
          if (rc == 0) {
            rc = sched_simulate(&s, &r, err, sizeof err);
            CHECK_MSG(rc == 0, "%s pp %d v %d m %d: %s", plan_schedule_name(kinds[k]), pp, v, m, err);
            /* every (stage, mb) on a recomputing stage gets one RECOMPUTE; the rest none */
            int want = 0, got = 0;
            for (int st = 0; st < pp * v; st++)
              want += recompute[st] * m;
            for (int rank = 0; rank < pp; rank++)
              for (int i = 0; i < s.ranks[rank].n; i++)
                got += s.ranks[rank].instr[i].op == SCHED_RECOMPUTE;
            CHECK(got == want);
            /* busy: 1 + 2 per (stage, mb), 1 per recompute, 0.5 per stage, 1 optimizer per rank */
            double busy = 0;
            for (int rank = 0; rank < pp; rank++)
              busy += r.ranks[rank].busy;
            CHECK_NEAR(busy, 3.0 * pp * v * m + want + 0.5 * pp * v + pp, 1e-9);
            CHECK(r.makespan > 0 && r.bubble_fraction >= 0 && r.bubble_fraction < 1);
          }
          sched_sim_free(&r);
          sched_free(&s);
        }
}

/* With a communication time c, 1F1B's critical path crosses pp − 1 links forward and pp − 1
 * back for the first micro-batch and the last: makespan ≥ the equal-cost one, and grows. */
static void test_comm_time_lengthens_the_step(void)
{
  struct sched s;
  struct sched_sim r0, r1;
  char err[256];
  CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  CHECK(sched_simulate(&s, &r0, err, sizeof err) == 0);
  s.costs.comm = 0.5;
  CHECK(sched_simulate(&s, &r1, err, sizeof err) == 0);
  CHECK(r1.makespan >= r0.makespan + 2 * 3 * 0.5 - 1e-12);
  CHECK(r1.bubble_fraction > r0.bubble_fraction);
  sched_sim_free(&r0);
  sched_sim_free(&r1);
  sched_free(&s);
}

/* Uneven stages: the slowest stage sets the pace. 1F1B with stage 2 three times as slow:
 * still complete, and the makespan is at least m times that stage's forward + backward. */
static void test_uneven_stage_costs_still_simulate(void)
{
  enum plan_schedule kinds[] = { PLAN_SCHED_GPIPE, PLAN_SCHED_1F1B, PLAN_SCHED_INTERLEAVED };
  for (int k = 0; k < 3; k++) {
    int v = kinds[k] == PLAN_SCHED_INTERLEAVED ? 2 : 1, pp = 4, m = 8;
    struct sched s;
    struct sched_sim r;
    char err[512];
    CHECK(sched_build(&s, kinds[k], pp, m, v, NULL, err, sizeof err) == 0);
    for (int st = 0; st < pp * v; st++) {
      s.costs.fwd[st] = 1 + 0.1 * st;
      s.costs.bwd[st] = 2.2 + 0.3 * st;
    }
    s.costs.fwd[2] = 3;
    s.costs.bwd[2] = 6;
    int rc = sched_simulate(&s, &r, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc == 0) {
      double slowest = 0;
      for (int rank = 0; rank < pp; rank++)
        if (r.ranks[rank].busy > slowest)
          slowest = r.ranks[rank].busy;
      CHECK(r.makespan >= slowest);
      CHECK(r.makespan >= 9.0 * m);
      CHECK(r.bubble_fraction > 0 && r.bubble_fraction < 1);
    }
    sched_sim_free(&r);
    sched_free(&s);
  }
}

/* 1F1B's list on each rank is warm-up, alternation, cool-down, as Megatron runs it: pp 4,
 * m 8, rank 1 runs F0 F1 then F2 B0 F3 B1 ... F7 B5, then B6 B7. */
static void test_1f1b_order_matches_megatron(void)
{
  struct sched s;
  char err[256];
  CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  const char *want = "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7 ";
  char got[256] = "";
  size_t len = 0;
  for (int i = 0; i < s.ranks[1].n; i++) {
    const struct sched_instr *in = &s.ranks[1].instr[i];
    if (in->op == SCHED_FWD || in->op == SCHED_BWD)
      len += (size_t)snprintf(got + len, sizeof got - len, "%c%d ", in->op == SCHED_FWD ? 'F' : 'B', in->mb);
  }
  CHECK_MSG(strcmp(got, want) == 0, "got %s", got);
  sched_free(&s);
}

/* Interleaved pp 2, v 2, m 4: Megatron's order of (chunk, mb): forwards in groups of
 * pp per chunk, backwards from the last chunk; warm-up (2−r−1)·2 + (2−1)·2: 4 on rank 0, 2 on
 * rank 1; then one forward, one backward. */
static void test_interleaved_order_matches_megatron(void)
{
  struct sched s;
  char err[256];
  CHECK(sched_interleaved(&s, 2, 4, 2, NULL, err, sizeof err) == 0);
  const char *want[2] = { "F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a B2b B3b B2a B3a ",
                          "F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a " };
  for (int rank = 0; rank < 2; rank++) {
    char got[256] = "";
    size_t len = 0;
    for (int i = 0; i < s.ranks[rank].n; i++) {
      const struct sched_instr *in = &s.ranks[rank].instr[i];
      if (in->op == SCHED_FWD || in->op == SCHED_BWD)
        len += (size_t)snprintf(got + len, sizeof got - len, "%c%d%c ", in->op == SCHED_FWD ? 'F' : 'B',
                                in->mb, 'a' + in->stage / 2);
    }
    CHECK_MSG(strcmp(got, want[rank]) == 0, "rank %d got %s", rank, got);
  }
  sched_free(&s);
}

TEST_MAIN(TEST(test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1),
          TEST(test_peak_inflight_gpipe_m_1f1b_pp_minus_rank),
          TEST(test_interleaved_bubble_is_p_minus_1_over_v_m),
          TEST(test_interleaved_peak_inflight_is_warmup_plus_one),
          TEST(test_gpipe_virtual_recompute_and_comm_still_complete),
          TEST(test_comm_time_lengthens_the_step),
          TEST(test_uneven_stage_costs_still_simulate),
          TEST(test_1f1b_order_matches_megatron),
          TEST(test_interleaved_order_matches_megatron))
