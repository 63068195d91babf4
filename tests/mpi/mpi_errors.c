/* Failures that come back as messages, on 4 ranks (tp2 × dp2): the plan-hash check naming
 * which ranks hold which hash; check mode naming the first rank and field that differ (n_bytes,
 * op, root; a send and recv of different sizes) on every rank, where the collective would
 * hang or mix data; MPI's own errors returned through MPI_CHECK with rank, file:line and MPI's
 * text. After each failure the groups still work. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "mpi_check.h"

static int rank;
static struct comm_group *groups[PLAN_N_AXES];

static void test_equal_plan_hashes_pass(void)
{
  char err[512] = "";
  CHECK_MSG(comm_check_plan_hash(0x85e2607db950c265ull, err, sizeof err) == 0, "%s", err);
}

static void test_plan_hash_mismatch_names_the_ranks(void)
{
  char err[512] = "";
  CHECK(comm_check_plan_hash(rank == 3 ? 0x9f8e7d6c5b4a3921ull : 0x1a2b3c4d5e6f7081ull, err, sizeof err) == -1);
  CHECK_MSG(!strcmp(err, "plan hash differs: ranks 0-2 have 1a2b3c4d5e6f7081, rank 3 has 9f8e7d6c5b4a3921"),
            "rank %d: %s", rank, err);
  uint64_t three[4] = { 0xa, 0xb, 0xa, 0xc };
  CHECK(comm_check_plan_hash(three[rank], err, sizeof err) == -1);
  CHECK_MSG(!strcmp(err, "plan hash differs: ranks 0,2 have 000000000000000a, rank 1 has 000000000000000b, "
                         "rank 3 has 000000000000000c"), "rank %d: %s", rank, err);
}

/* comm_agree: everyone gets the lowest failing rank's status, message and world rank; on a
 * sub-group, the group's own verdict; all ok gives 0; nothing is counted. */
static void test_agreement_names_the_first_failing_rank(void)
{
  char msg[COMM_AGREE_MSG_MAX];
  int failed = 7;
  uint64_t seq = comm_group_seq(comm_world());
  snprintf(msg, sizeof msg, "%s", "all fine");
  CHECK(comm_agree(comm_world(), 0, msg, sizeof msg, &failed) == 0 && failed == -1);
  snprintf(msg, sizeof msg, "rank %d cannot open data.bin", rank);
  int status = rank >= 2 ? 1 + rank : 0; /* ranks 2 and 3 fail, with 3 and 4 */
  CHECK(comm_agree(comm_world(), status, msg, sizeof msg, &failed) == 3);
  CHECK_MSG(failed == 2 && !strcmp(msg, "rank 2 cannot open data.bin"), "rank %d: %d %s", rank, failed, msg);
  /* dp groups are {0, 2} and {1, 3}: rank 3 fails alone in its group */
  snprintf(msg, sizeof msg, "rank %d", rank);
  CHECK(comm_agree(groups[PLAN_AXIS_DP], rank == 3 ? 1 : 0, msg, sizeof msg, &failed) == (rank % 2 ? 1 : 0));
  CHECK(rank % 2 ? failed == 3 && !strcmp(msg, "rank 3") : failed == -1);
  CHECK(comm_group_seq(comm_world()) == seq);
}

/* comm_agree_err: the house's −1 (and −2, a plan error) are failures like any other status:
 * every rank gets the lowest failing rank's status and message, after "rank R: " as the caller
 * asks; a group of one keeps its status and message as they are. */
static void test_agree_err_takes_negative_statuses(void)
{
  char err[COMM_AGREE_MSG_MAX];
  snprintf(err, sizeof err, "rank %d: data.bin: no such file", rank);
  int status = rank == 1 || rank == 3 ? -1 : 0;
  CHECK(comm_agree_err(comm_world(), status, err, sizeof err, COMM_AGREE_NAME_RANK) == -1);
  CHECK_MSG(!strcmp(err, "rank 1: rank 1: data.bin: no such file"), "rank %d: %s", rank, err);
  snprintf(err, sizeof err, "plan.lua:3: mesh.dp = 4 (rank %d)", rank);
  status = rank >= 2 ? COMM_AGREE_PLAN_ERROR : 0;
  CHECK(comm_agree_err(comm_world(), status, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN) == -2);
  CHECK_MSG(!strcmp(err, "plan.lua:3: mesh.dp = 4 (rank 2)"), "rank %d: %s", rank, err);
  snprintf(err, sizeof err, "export (rank %d)", rank);
  status = rank == 3 ? -1 : 0;
  CHECK(comm_agree_err(comm_world(), status, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN) == -1);
  CHECK_MSG(!strcmp(err, "rank 3: export (rank 3)"), "rank %d: %s", rank, err);
  snprintf(err, sizeof err, "bad script (rank %d)", rank);
  status = rank == 0 ? -1 : 0;
  CHECK(comm_agree_err(comm_world(), status, err, sizeof err, COMM_AGREE_PLAIN) == -1);
  CHECK_MSG(!strcmp(err, "bad script (rank 0)"), "rank %d: %s", rank, err);
  snprintf(err, sizeof err, "all fine");
  CHECK(comm_agree_err(comm_world(), 0, err, sizeof err, COMM_AGREE_NAME_RANK) == 0);
  snprintf(err, sizeof err, "alone");
  CHECK(comm_agree_err(NULL, -1, err, sizeof err, COMM_AGREE_NAME_RANK) == -1 && !strcmp(err, "alone"));
}

/* A correct all-reduce on every group: the layer is still usable after a failure. */
static void still_works(void)
{
  struct comm_group *all[] = { comm_world(), groups[0], groups[1], groups[2] };
  for (int k = 0; k < 4; k++) {
    float x = 1, y = 0;
    CHECK_MSG(comm_all_reduce(all[k], &x, &y, 1, COMM_FP32, COMM_SUM, NULL) == 0, "%s", comm_error());
    CHECK(y == (float)all[k]->size);
  }
}

static void test_check_mode_names_n_bytes_mismatch(void)
{
  float x[16] = { 0 }, y[16];
  comm_set_check(1);
  uint64_t seq = comm_group_seq(comm_world());
  CHECK(comm_all_reduce(comm_world(), x, y, rank == 2 ? 8 : 16, COMM_FP32, COMM_SUM, NULL) == -1);
  char want[256];
  snprintf(want, sizeof want, "comm check on world before all-reduce seq %llu (as group rank 0 sees it): group "
           "rank 2 (world rank 2) has n_bytes 32 where group rank 0 (world rank 0) has n_bytes 64",
           (unsigned long long)seq);
  CHECK_MSG(!strcmp(comm_error(), want), "rank %d: %s", rank, comm_error());
  struct comm_record r;
  CHECK(comm_records(&r, 1) == 1 && r.status == -1 && r.t_end >= r.t_issue);
  still_works();
  comm_set_check(0);
}

static void test_check_mode_names_op_mismatch(void)
{
  /* Only tp group {0, 1} disagrees; {2, 3} agrees and goes on. */
  float x[8] = { 1, 1, 1, 1, 1, 1, 1, 1 }, y[8];
  struct comm_group *tp = groups[PLAN_AXIS_TP];
  comm_set_check(1);
  int rc = rank == 1 ? comm_all_gather(tp, x, y, 4, COMM_FP32, NULL)
                     : comm_all_reduce(tp, x, y, rank == 0 ? 8 : 4, COMM_FP32, COMM_SUM, NULL);
  if (rank < 2) {
    CHECK(rc == -1);
    CHECK_STR_CONTAINS(comm_error(), "comm check on tp before all-reduce seq");
    CHECK_STR_CONTAINS(comm_error(), "group rank 1 (world rank 1) has op all-gather where group rank 0 "
                                     "(world rank 0) has op all-reduce");
  } else {
    CHECK_MSG(rc == 0 && y[0] == 2, "%s", comm_error());
  }
  still_works();
  comm_set_check(0);
}

static void test_check_mode_names_root_mismatch(void)
{
  float x[4] = { 0 };
  struct comm_group *dp = groups[PLAN_AXIS_DP];
  comm_set_check(1);
  CHECK(comm_broadcast(dp, x, 4, COMM_FP32, dp->rank == 0 ? 0 : 1, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "group rank 1 (world rank");
  CHECK_STR_CONTAINS(comm_error(), "has root 1 where group rank 0");
  CHECK_STR_CONTAINS(comm_error(), "has root 0");
  still_works();
  comm_set_check(0);
}

static void test_check_mode_names_send_recv_mismatch(void)
{
  float x[16] = { 0 };
  struct comm_group *w = comm_world();
  comm_set_check(1);
  if (rank == 0)
    CHECK_MSG(comm_send(w, x, 8, COMM_FP32, 1, NULL) == 0, "%s", comm_error());
  if (rank == 1) {
    CHECK(comm_recv(w, x, 16, COMM_FP32, 0, NULL) == -1);
    CHECK_STR_CONTAINS(comm_error(), "comm check on world: recv seq 0 from group rank 0 (world rank 0): the "
                                     "sender has n_bytes 32 where this rank (world rank 1) expects n_bytes 64");
  }
  still_works();
  comm_set_check(0);
}

static void test_mpi_errors_come_back_with_rank_and_line(void)
{
  float x[16] = { 0 };
  struct comm_group *w = comm_world();
  if (rank == 0) /* 64 bytes into a 32-byte receive: MPI says the message was truncated */
    CHECK_MSG(comm_send(w, x, 16, COMM_FP32, 1, NULL) == 0, "%s", comm_error());
  if (rank == 1) {
    CHECK(comm_recv(w, x, 8, COMM_FP32, 0, NULL) == -1);
    CHECK_STR_CONTAINS(comm_error(), "rank 1: host/comm/comm_mpi.c:");
    CHECK_STR_CONTAINS(comm_error(), ": MPI_Test failed: MPI_ERR_TRUNCATE: message truncated (world recv seq");
  }
  if (rank == 2) /* 16 bytes where 32 were expected */
    CHECK(comm_send(w, x, 4, COMM_FP32, 3, NULL) == 0);
  if (rank == 3) {
    CHECK(comm_recv(w, x, 8, COMM_FP32, 2, NULL) == -1);
    CHECK_STR_CONTAINS(comm_error(), "rank 3: received 16 bytes from group rank 2 (world rank 2), expected 32");
  }
  still_works();
}

int main(int argc, char **argv)
{
  char err[512];
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  struct plan_mesh mesh = { .world = 4, .tp = 2, .dp = 2, .pp = 1,
                            .order = { PLAN_AXIS_TP, PLAN_AXIS_DP, PLAN_AXIS_PP, PLAN_AXIS_CP } };
  if (comm_world()->size != 4)
    comm_fatal("mpi_errors runs on 4 ranks");
  if (comm_build_mesh_groups(&mesh, groups, err, sizeof err))
    comm_fatal("%s", err);
  static const struct test_case tests[] = {
    TEST(test_equal_plan_hashes_pass), TEST(test_plan_hash_mismatch_names_the_ranks),
    TEST(test_check_mode_names_n_bytes_mismatch), TEST(test_check_mode_names_op_mismatch),
    TEST(test_check_mode_names_root_mismatch), TEST(test_check_mode_names_send_recv_mismatch),
    TEST(test_mpi_errors_come_back_with_rank_and_line), TEST(test_agreement_names_the_first_failing_rank),
    TEST(test_agree_err_takes_negative_statuses),
  };
  int status = mpi_test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  if (comm_finalize(err, sizeof err))
    comm_fatal("%s", err);
  return status;
}
