/* The comm layer in a world of one, run without mpirun (MPI starts as a singleton): the same
 * code path as a big job, with groups of size 1 whose collectives are copies or nothing but are
 * still counted and recorded; argument errors come back as messages; the trace is written. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm/comm.h"
#include "mesh/mesh.h"

#define N 64

static struct comm_group *mesh_groups[PLAN_N_AXES];

static void fill(float *x, size_t n, float base)
{
  for (size_t i = 0; i < n; i++)
    x[i] = base + (float)i;
}

static int equals(const float *x, size_t n, float base)
{
  for (size_t i = 0; i < n; i++)
    if (x[i] != base + (float)i)
      return 0;
  return 1;
}

static void test_init_gives_a_world_of_one(void)
{
  char err[512] = "";
  int rc = comm_init(NULL, NULL, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (rc) {
    printf("comm_init failed: %s\n", err);
    exit(1);
  }
  struct comm_group *w = comm_world();
  CHECK(w && w->size == 1 && w->rank == 0 && w->ranks[0] == 0);
  CHECK(!strcmp(w->name, "world"));
  CHECK(comm_local_rank() == 0 && comm_local_size() == 1);
  CHECK(!strcmp(comm_backend_name(), "mpi"));
  CHECK(comm_init(NULL, NULL, err, sizeof err) == -1);
  CHECK_STR_CONTAINS(err, "already initialized");
}

static void test_mesh_groups_of_size_one(void)
{
  struct plan_mesh m = { .world = 1, .tp = 1, .pp = 1, .dp = 1, .order = { PLAN_AXIS_TP, PLAN_AXIS_DP, PLAN_AXIS_PP, PLAN_AXIS_CP } };
  char err[512] = "";
  CHECK_MSG(comm_build_mesh_groups(&m, mesh_groups, err, sizeof err) == 0, "%s", err);
  for (int a = 0; a < PLAN_N_AXES; a++) {
    CHECK(mesh_groups[a] && mesh_groups[a]->size == 1 && mesh_groups[a]->rank == 0);
    CHECK(mesh_groups[a] && !strcmp(mesh_groups[a]->name, plan_axis_name((enum plan_axis)a)));
  }
  struct plan_mesh two = { .world = 2, .tp = 2, .pp = 1, .dp = 1, .order = { PLAN_AXIS_TP, PLAN_AXIS_DP, PLAN_AXIS_PP, PLAN_AXIS_CP } };
  struct comm_group *g[PLAN_N_AXES];
  CHECK(comm_build_mesh_groups(&two, g, err, sizeof err) == -1);
  CHECK_STR_CONTAINS(err, "the plan's mesh is tp 2 × dp 1 × pp 1 = 2 ranks, but the job has 1");
}

/* Every operation, blocking and not, on the world and each mesh group: the result is the
 * input, and each call is counted with its bytes and recorded with its sequence number. */
static void test_every_op_is_a_copy_and_counted(void)
{
  struct comm_group *groups[] = { comm_world(), mesh_groups[0], mesh_groups[1], mesh_groups[2] };
  float send[N], recv[N];
  comm_counters_reset();
  for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
    struct comm_group *g = groups[k];
    if (!g)
      continue;
    uint64_t seq0 = comm_group_seq(g);
    for (int blocking = 0; blocking < 2; blocking++) {
      struct comm_request *req = NULL, **rp = blocking ? NULL : &req;
      fill(send, N, 1);
      memset(recv, 0, sizeof recv);
      CHECK(comm_all_reduce(g, send, recv, N, COMM_FP32, COMM_SUM, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 1));
      memset(recv, 0, sizeof recv);
      CHECK(comm_all_reduce(g, send, recv, N, COMM_FP32, COMM_MAX, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 1));
      memset(recv, 0, sizeof recv);
      CHECK(comm_all_gather(g, send, recv, N, COMM_FP32, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 1));
      memset(recv, 0, sizeof recv);
      CHECK(comm_reduce_scatter(g, send, recv, N, COMM_FP32, COMM_SUM, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 1));
      fill(recv, N, 7);
      CHECK(comm_broadcast(g, recv, N, COMM_FP32, 0, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 7));
      memset(recv, 0, sizeof recv);
      CHECK(comm_all_to_all(g, send, recv, N, COMM_FP32, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 1));
      fill(recv, N, 3); /* in place */
      CHECK(comm_all_reduce(g, recv, recv, N, COMM_FP32, COMM_SUM, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 3));
      CHECK(comm_all_gather(g, recv, recv, N, COMM_FP32, rp) == 0 && comm_wait(&req) == 0);
      CHECK(equals(recv, N, 3));
    }
    /* A message to oneself: both sides started before either is waited for. */
    struct comm_request *reqs[2] = { NULL, NULL };
    fill(send, N, 5);
    memset(recv, 0, sizeof recv);
    CHECK(comm_recv(g, recv, N, COMM_FP32, 0, &reqs[0]) == 0);
    CHECK(comm_send(g, send, N, COMM_FP32, 0, &reqs[1]) == 0);
    CHECK(comm_wait_all(reqs, 2) == 0 && !reqs[0] && !reqs[1]);
    CHECK(equals(recv, N, 5));

    size_t b = N * sizeof(float);
    struct { enum comm_op op; uint64_t calls; uint64_t n_bytes; } want[] = {
      { COMM_ALL_REDUCE, 6, 6 * b }, { COMM_ALL_GATHER, 4, 4 * b }, { COMM_REDUCE_SCATTER, 2, 2 * b },
      { COMM_BROADCAST, 2, 2 * b }, { COMM_ALL_TO_ALL, 2, 2 * b }, { COMM_SEND, 1, b }, { COMM_RECV, 1, b },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      struct comm_counter c = comm_counter_get(g, want[i].op);
      CHECK_MSG(c.calls == want[i].calls && c.n_bytes == want[i].n_bytes, "%s %s: %llu calls, %llu bytes",
                g->name, comm_op_name(want[i].op), (unsigned long long)c.calls, (unsigned long long)c.n_bytes);
    }
    CHECK(comm_group_seq(g) == seq0 + 16);
  }
}

static void test_records_hold_step_mb_and_times(void)
{
  comm_set_step(42, 3);
  float x[N];
  fill(x, N, 0);
  CHECK(comm_all_reduce(mesh_groups[PLAN_AXIS_DP], x, x, N, COMM_FP32, COMM_SUM, NULL) == 0);
  struct comm_record recs[4];
  int k = comm_records(recs, 4);
  CHECK(k == 4);
  const struct comm_record *r = &recs[k - 1];
  CHECK(r->op == COMM_ALL_REDUCE && !strcmp(r->group, "dp") && r->step == 42 && r->mb == 3);
  CHECK(r->n_bytes == N * sizeof(float) && r->status == 0 && r->peer == -1);
  CHECK(r->seq == comm_group_seq(mesh_groups[PLAN_AXIS_DP]) - 1);
  CHECK(r->t_issue > 0 && r->t_issue <= r->t_start && r->t_start <= r->t_end);
  CHECK(recs[k - 2].op == COMM_SEND && recs[k - 3].op == COMM_RECV && recs[k - 2].peer == 0);
}

static void test_bad_arguments_are_refused_with_a_message(void)
{
  struct comm_group *w = comm_world();
  float x[2 * N];
  uint16_t h[N] = { 0 };
  struct comm_counter before = comm_counter_get(w, COMM_ALL_REDUCE);
  CHECK(comm_broadcast(w, x, N, COMM_FP32, 1, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "comm broadcast on world: root 1 is not a rank of the group (size 1)");
  CHECK(comm_send(w, x, N, COMM_FP32, -1, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "peer -1 is not a rank of the group");
  CHECK(comm_all_reduce(w, x, x + 1, N, COMM_FP32, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "send and recv buffers overlap");
  CHECK(comm_reduce_scatter(w, x, x, N, COMM_FP32, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "overlap");
  CHECK(comm_all_reduce(w, h, h, N, COMM_FP16, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "does not reduce fp16");
  CHECK(comm_all_reduce(w, h, h, N, COMM_BF16, COMM_MAX, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "reduces bf16 by sum only (not max)");
  CHECK(comm_all_gather(w, h, x, N / 2, COMM_BF16, NULL) == 0); /* moving bf16 is fine */
  CHECK(comm_all_reduce(w, NULL, x, N, COMM_FP32, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "NULL buffer");
  CHECK(comm_all_reduce(w, x, x, N, (enum comm_dtype)99, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "unknown dtype 99");
  CHECK(comm_all_reduce(w, x, x, (size_t)1 << 40, COMM_FP32, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "exceeds MPI's int count");
  CHECK(comm_all_reduce(NULL, x, x, N, COMM_FP32, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "no group");
  struct comm_request *req = NULL;
  CHECK(comm_all_reduce(w, x, x + 1, N, COMM_FP32, COMM_SUM, &req) == -1 && req == NULL);
  struct comm_counter after = comm_counter_get(w, COMM_ALL_REDUCE);
  CHECK(after.calls == before.calls && after.n_bytes == before.n_bytes); /* refused calls are not traffic */
  CHECK(comm_all_reduce(w, h, h, N, COMM_BF16, COMM_SUM, NULL) == 0); /* bf16 sums (bf16 gradients) */
}

static void test_check_mode_and_plan_hash_pass_alone(void)
{
  char err[512] = "";
  float x[N];
  fill(x, N, 0);
  comm_set_check(1);
  CHECK(comm_all_reduce(comm_world(), x, x, N, COMM_FP32, COMM_SUM, NULL) == 0);
  comm_set_check(0);
  CHECK_MSG(comm_check_plan_hash(0x1234abcdull, err, sizeof err) == 0, "%s", err);
}

static void test_test_reports_done_and_frees(void)
{
  float x[N];
  fill(x, N, 0);
  struct comm_request *req = NULL;
  CHECK(comm_all_reduce(comm_world(), x, x, N, COMM_FP32, COMM_SUM, &req) == 0 && req);
  int done = 0;
  for (double until = comm_now() + 10; !done && comm_now() < until;)
    CHECK(comm_test(&req, &done) == 0);
  CHECK(done && req == NULL);
  CHECK(comm_wait(&req) == 0); /* a finished handle is NULL: waiting on it is a no-op */
}

static void test_trace_file_is_chrome_json(void)
{
  char path[] = "/tmp/tycho_comm_trace_XXXXXX", err[512] = "";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0)
    return;
  close(fd);
  double t = comm_now();
  comm_trace_span("compute", t, t + 0.001);
  CHECK_MSG(comm_trace_write(path, err, sizeof err) == 0, "%s", err);
  FILE *f = fopen(path, "r");
  char text[1 << 16] = "";
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f)
    fclose(f);
  text[n] = 0;
  CHECK(n > 0 && text[0] == '{');
  CHECK_STR_CONTAINS(text, "\"traceEvents\":[");
  CHECK_STR_CONTAINS(text, "\"name\":\"process_name\"");
  CHECK_STR_CONTAINS(text, "\"name\":\"compute\"");
  CHECK_STR_CONTAINS(text, "\"name\":\"all-reduce\",\"cat\":\"comm\",\"ph\":\"X\"");
  CHECK_STR_CONTAINS(text, "\"name\":\"comm tp\"");
  CHECK(comm_trace_write("/nonexistent-dir/trace.json", err, sizeof err) == -1);
  CHECK_STR_CONTAINS(err, "comm trace: cannot create /nonexistent-dir/trace.json.tmp: No such file or directory");
  unlink(path);
}

static void test_finalize(void)
{
  char err[512] = "";
  CHECK_MSG(comm_finalize(err, sizeof err) == 0, "%s", err);
  CHECK(comm_all_reduce(comm_world(), NULL, NULL, 0, COMM_FP32, COMM_SUM, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "comm_init has not run");
}

TEST_MAIN(TEST(test_init_gives_a_world_of_one), TEST(test_mesh_groups_of_size_one),
          TEST(test_every_op_is_a_copy_and_counted), TEST(test_records_hold_step_mb_and_times),
          TEST(test_bad_arguments_are_refused_with_a_message), TEST(test_check_mode_and_plan_hash_pass_alone),
          TEST(test_test_reports_done_and_frees), TEST(test_trace_file_is_chrome_json), TEST(test_finalize))
