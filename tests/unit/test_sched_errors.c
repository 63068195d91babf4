/* Broken schedules are refused with a message that names the rank, the place in its list and
 * the instruction: a swapped send and receive is a deadlock, a missing or misplaced
 * instruction is an incomplete list, and impossible shapes never reach a list at all. */
#include <stdlib.h>

#include "check.h"
#include "sched/sched.h"

static int find(const struct sched *s, int rank, enum sched_op op, int stage, int mb)
{
  const struct sched_list *l = &s->ranks[rank];
  for (int i = 0; i < l->n; i++)
    if (l->instr[i].op == op && l->instr[i].stage == stage && l->instr[i].mb == mb)
      return i;
  return -1;
}

/* Moves instruction `from` of the rank's list to position `to`, shifting the ones between. */
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

static void drop(struct sched *s, int rank, int at)
{
  struct sched_list *l = &s->ranks[rank];
  memmove(&l->instr[at], &l->instr[at + 1], (size_t)(l->n - at - 1) * sizeof l->instr[0]);
  l->n--;
}

/* Rank 0 of 1F1B pp 2, m 1 waits for the gradient before sending the activation the gradient
 * depends on: both ranks wait forever, and the message says on what, and where the awaited
 * send sits. */
static void test_swapped_send_and_recv_is_a_deadlock_naming_both_ranks(void)
{
  struct sched s;
  struct sched_sim r;
  char err[1024];
  CHECK(sched_1f1b(&s, 2, 1, 1, NULL, err, sizeof err) == 0);
  int send = find(&s, 0, SCHED_SEND_ACT, 0, 0), recv = find(&s, 0, SCHED_RECV_GRAD, 1, 0);
  CHECK(send == 1 && recv == 2);
  move(&s, 0, recv, send);
  CHECK(sched_check(&s, err, sizeof err) == 0); /* every piece is there, in a legal local order */
  CHECK(sched_simulate(&s, &r, err, sizeof err) == SCHED_DEADLOCK);
  CHECK_MSG(strcmp(err, "schedule 1f1b: deadlock: rank 0 waits at #1 RECV_GRAD(stage 1, mb 0) from rank 1, "
                        "sent by rank 1 only at #3, after its own wait at #0; rank 1 waits at #0 "
                        "RECV_ACT(stage 0, mb 0) from rank 0, sent by rank 0 only at #2, after its own "
                        "wait at #1") == 0, "got: %s", err);
  CHECK(r.ranks[0].stuck_at == 1 && r.ranks[1].stuck_at == 0);
  sched_sim_free(&r);
  sched_free(&s);
}

/* In a bigger pipeline a receive posted too early (rank 1 of 1F1B pp 4, m 8 asks for the
 * gradient of micro-batch 0 before it has run its forward) stalls every rank; ranks that
 * finish are not named, stuck ones are. */
static void test_receive_too_early_deadlocks_the_pipeline(void)
{
  struct sched s;
  struct sched_sim r;
  char err[2048];
  CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  move(&s, 1, find(&s, 1, SCHED_RECV_GRAD, 2, 0), 0);
  CHECK(sched_simulate(&s, &r, err, sizeof err) == SCHED_DEADLOCK);
  CHECK_STR_CONTAINS(err, "schedule 1f1b: deadlock: rank 0 waits at #");
  CHECK_STR_CONTAINS(err, "rank 1 waits at #0 RECV_GRAD(stage 2, mb 0) from rank 2, sent by rank 2 only at #");
  CHECK_STR_CONTAINS(err, "rank 2 waits at #0 RECV_ACT(stage 1, mb 0) from rank 1");
  CHECK_STR_CONTAINS(err, "rank 3 waits at #0 RECV_ACT(stage 2, mb 0) from rank 2");
  sched_sim_free(&r);
  sched_free(&s);
}

/* Each way a list can be incomplete or misordered, with the message it gets. */
static void test_incomplete_lists_are_refused_with_the_place(void)
{
  struct {
    const char *what;
    int rank;
    enum sched_op op;
    int stage, mb;
    int action; /* 0 drop it; 1 move it to the front; 2 move it to the end; 3 duplicate it; 4 bad peer */
    const char *want;
  } cases[] = {
    { "missing backward", 1, SCHED_BWD, 1, 2, 0,
      "schedule 1f1b: rank 1: BWD(stage 1, mb 2) missing (every micro-batch runs backward on every stage)" },
    { "missing forward", 2, SCHED_FWD, 2, 0, 0,
      "schedule 1f1b: rank 2: FWD(stage 2, mb 0) missing (every micro-batch runs forward on every stage)" },
    { "backward before forward", 3, SCHED_BWD, 3, 1, 1,
      "schedule 1f1b: rank 3: BWD(stage 3, mb 1) at #0 must come after FWD(stage 3, mb 1) at #6" },
    { "send never received", 1, SCHED_RECV_ACT, 0, 3, 0,
      "schedule 1f1b: rank 1: RECV_ACT(stage 0, mb 3) from rank 0 missing (every send is received once)" },
    { "receive never sent", 2, SCHED_SEND_GRAD, 2, 4, 0,
      "schedule 1f1b: rank 2: SEND_GRAD(stage 2, mb 4) to rank 1 missing (the previous stage needs it)" },
    { "send before the compute", 0, SCHED_SEND_ACT, 0, 5, 1,
      "schedule 1f1b: rank 0: SEND_ACT(stage 0, mb 5) to rank 1 at #0 must come after FWD(stage 0, mb 5) at #" },
    { "receive after its use", 1, SCHED_RECV_GRAD, 2, 0, 2,
      "schedule 1f1b: rank 1: RECV_GRAD(stage 2, mb 0) from rank 2 at #" },
    { "twice", 2, SCHED_FWD, 2, 3, 3,
      "schedule 1f1b: rank 2 #" /* exact text in test_repeat_and_late_receive_messages */ },
    { "wrong peer", 0, SCHED_SEND_ACT, 0, 0, 4,
      "schedule 1f1b: rank 0 #1 SEND_ACT(stage 0, mb 0) to rank 2: wrong peer: the message goes between this "
      "rank and rank 1" },
    { "reduce before the last backward", 3, SCHED_REDUCE_GRADS, 3, -1, 1,
      "schedule 1f1b: rank 3: REDUCE_GRADS(stage 3) at #0 must come after the stage's last backward at #" },
    { "no reduce", 0, SCHED_REDUCE_GRADS, 0, -1, 0,
      "schedule 1f1b: rank 0: REDUCE_GRADS(stage 0) missing (once per step, after the stage's last backward)" },
    { "optimizer first", 2, SCHED_OPTIMIZER, -1, -1, 1,
      "schedule 1f1b: rank 2 #0 OPTIMIZER: must be the rank's last instruction" },
    { "no optimizer", 2, SCHED_OPTIMIZER, -1, -1, 0,
      "schedule 1f1b: rank 2: OPTIMIZER missing at the end of its list" },
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    struct sched s;
    struct sched_sim r;
    char err[1024] = "";
    CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
    int at = find(&s, cases[c].rank, cases[c].op, cases[c].stage, cases[c].mb);
    CHECK_MSG(at >= 0, "%s: not found", cases[c].what);
    if (at < 0) {
      sched_free(&s);
      continue;
    }
    struct sched_list *l = &s.ranks[cases[c].rank];
    switch (cases[c].action) {
    case 0: drop(&s, cases[c].rank, at); break;
    case 1: move(&s, cases[c].rank, at, 0); break;
    case 2: move(&s, cases[c].rank, at, l->n - 2); break; /* just before OPTIMIZER */
    case 3: l->instr[l->n - 1] = l->instr[at]; break;      /* over the OPTIMIZER: a repeat comes first */
    default: l->instr[at].peer = 2;
    }
    int rc = sched_simulate(&s, &r, err, sizeof err);
    CHECK_MSG(rc == SCHED_INCOMPLETE, "%s: status %d (%s)", cases[c].what, rc, err);
    CHECK_MSG(strncmp(err, cases[c].want, strlen(cases[c].want)) == 0, "%s: got \"%s\"", cases[c].what, err);
    sched_sim_free(&r);
    sched_free(&s);
  }
}

/* A duplicated instruction says where the first one was; a receive placed after the compute
 * that needs it says which compute. */
static void test_repeat_and_late_receive_messages(void)
{
  struct sched s;
  char err[512];
  CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  struct sched_list *l = &s.ranks[2];
  int first = find(&s, 2, SCHED_FWD, 2, 3);
  l->instr[l->n - 1] = l->instr[first];
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
  char want[256];
  snprintf(want, sizeof want, "schedule 1f1b: rank 2 #%d FWD(stage 2, mb 3): appears twice: first at #%d",
           l->n - 1, first);
  CHECK_MSG(strcmp(err, want) == 0, "got %s, want %s", err, want);
  sched_free(&s);

  CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  int recv = find(&s, 1, SCHED_RECV_GRAD, 2, 0), bwd = find(&s, 1, SCHED_BWD, 1, 0);
  move(&s, 1, recv, bwd);
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
  snprintf(want, sizeof want, "schedule 1f1b: rank 1: RECV_GRAD(stage 2, mb 0) from rank 2 at #%d must come "
           "before BWD(stage 1, mb 0) at #%d", bwd, bwd - 1);
  CHECK_MSG(strcmp(err, want) == 0, "got %s, want %s", err, want);
  sched_free(&s);
}

/* Instructions that cannot exist: a stage out of range, a forward on another rank's stage, a
 * message that would leave the pipeline, a recompute on a stage that does not recompute. */
static void test_strangers_are_refused(void)
{
  struct { struct sched_instr in; int rank; const char *want; } cases[] = {
    { { SCHED_FWD, 9, 0, -1 }, 1,
      "schedule 1f1b: rank 1 #0 FWD(stage 9, mb 0): no such stage: the stages are 0 .. S-1, S = 4 (pp 4 × virtual stages 1)" },
    { { SCHED_FWD, 1, 8, -1 }, 1,
      "schedule 1f1b: rank 1 #0 FWD(stage 1, mb 8): no such micro-batch: the step has 8 micro-batches" },
    { { SCHED_FWD, 2, 0, -1 }, 1,
      "schedule 1f1b: rank 1 #0 FWD(stage 2, mb 0): runs on the wrong rank: it belongs to rank 2" },
    { { SCHED_SEND_ACT, 3, 0, 0 }, 3,
      "schedule 1f1b: rank 3 #0 SEND_ACT(stage 3, mb 0) to rank 0: no such message: it would leave the pipeline "
      "or stay on its rank" },
    { { SCHED_RECOMPUTE, 1, 0, -1 }, 1,
      "schedule 1f1b: rank 1 #0 RECOMPUTE(stage 1, mb 0): the stage does not recompute" },
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    struct sched s;
    char err[512];
    CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
    s.ranks[cases[c].rank].instr[0] = cases[c].in;
    CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
    CHECK_MSG(strcmp(err, cases[c].want) == 0, "got \"%s\"", err);
    sched_free(&s);
  }
}

/* Shapes the generators refuse, with what would be valid. */
static void test_invalid_shapes_are_refused(void)
{
  struct sched s;
  char err[512];
  CHECK(sched_interleaved(&s, 4, 6, 2, NULL, err, sizeof err) == SCHED_INVALID);
  CHECK_STR_CONTAINS(err, "schedule interleaved: 6 micro-batches is not a multiple of pp = 4");
  sched_free(&s);
  CHECK(sched_interleaved(&s, 4, 8, 1, NULL, err, sizeof err) == SCHED_INVALID);
  CHECK_STR_CONTAINS(err, "virtual stages = 1: needs at least 2; use 1f1b");
  sched_free(&s);
  CHECK(sched_1f1b(&s, 4, 8, 2, NULL, err, sizeof err) == SCHED_INVALID);
  CHECK_STR_CONTAINS(err, "use the interleaved schedule for virtual stages");
  sched_free(&s);
  CHECK(sched_gpipe(&s, 0, 8, 1, NULL, err, sizeof err) == SCHED_INVALID);
  CHECK_STR_CONTAINS(err, "schedule gpipe: pp = 0, micro-batches = 8, virtual stages = 1: each must be at least 1");
  sched_free(&s);
  CHECK(sched_build(&s, PLAN_SCHED_1F1B, 4, 0, 1, NULL, err, sizeof err) == SCHED_INVALID);
  sched_free(&s);
  CHECK(sched_1f1b(&s, 1 << 16, 1 << 16, 1, NULL, err, sizeof err) == SCHED_INVALID);
  CHECK_STR_CONTAINS(err, "too large");
  sched_free(&s);
  /* an empty schedule is refused by the check, not crashed on */
  memset(&s, 0, sizeof s);
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INVALID);
}

/* Recompute on a stage is required once per micro-batch between its forward and backward. */
static void test_recompute_must_sit_between_forward_and_backward(void)
{
  uint8_t rc[4] = { 0, 1, 0, 0 };
  struct sched s;
  char err[512];
  CHECK(sched_1f1b(&s, 4, 8, 1, rc, err, sizeof err) == 0);
  CHECK(sched_check(&s, err, sizeof err) == 0);
  int at = find(&s, 1, SCHED_RECOMPUTE, 1, 4);
  drop(&s, 1, at);
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
  CHECK_STR_CONTAINS(err, "rank 1: RECOMPUTE(stage 1, mb 4) missing (the stage recomputes)");
  sched_free(&s);
  CHECK(sched_1f1b(&s, 4, 8, 1, rc, err, sizeof err) == 0);
  move(&s, 1, find(&s, 1, SCHED_RECOMPUTE, 1, 4), 0);
  CHECK(sched_check(&s, err, sizeof err) == SCHED_INCOMPLETE);
  CHECK_STR_CONTAINS(err, "rank 1: RECOMPUTE(stage 1, mb 4) at #0 must come after FWD(stage 1, mb 4)");
  sched_free(&s);
}

TEST_MAIN(TEST(test_swapped_send_and_recv_is_a_deadlock_naming_both_ranks),
          TEST(test_receive_too_early_deadlocks_the_pipeline),
          TEST(test_incomplete_lists_are_refused_with_the_place),
          TEST(test_repeat_and_late_receive_messages),
          TEST(test_strangers_are_refused),
          TEST(test_invalid_shapes_are_refused),
          TEST(test_recompute_must_sit_between_forward_and_backward))
