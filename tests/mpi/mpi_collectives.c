/* Every collective, blocking and non-blocking, on the world and on the tp, dp and pp groups of
 * a mesh, against values every rank can compute for every other (rank r contributes
 * r·1000 + i at element i), plus hand-written tables for tp2×dp2 and tp2×dp2×pp2; the mesh
 * groups equal mesh_group_members; the counters hold exactly the calls and bytes issued; many
 * operations in flight at once on several groups, pipeline sends both ways included, finish;
 * COMM_REAL carries the build's type. Every value is an integer (or, for COMM_REAL, a number
 * with few significant bits), so every sum is exact in any order and the comparisons are
 * bitwise.
 *
 * Usage: mpi_collectives TP DP PP [ORDER]   (ORDER like "tp,dp,pp", fastest-varying first) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "comm/comm.h"
#include "mesh/mesh.h"
#include "mpi_check.h"

#define N 37 /* elements per rank: odd, so no power-of-two luck */

static struct plan_mesh mesh;
static struct comm_group *groups[PLAN_N_AXES];
static int rank, world, default_order;

static float value(int r, size_t i) { return (float)(r * 1000 + (int)i); }

/* Calls and bytes this test expects per group and op. */
static struct comm_counter expected[4][COMM_N_OPS];

static struct comm_group *group_at(int k) { return k == 0 ? comm_world() : groups[k - 1]; }

static void expect(int k, enum comm_op op, size_t n_bytes)
{
  expected[k][op].calls++;
  expected[k][op].n_bytes += n_bytes;
}

static void test_mesh_groups_equal_mesh_members(void)
{
  char err[512] = "";
  CHECK_MSG(comm_build_mesh_groups(&mesh, groups, err, sizeof err) == 0, "%s", err);
  int coord[PLAN_N_AXES], members[64];
  mesh_coords(&mesh, rank, coord);
  for (int a = 0; a < PLAN_N_AXES; a++) {
    struct comm_group *g = groups[a];
    CHECK(g != NULL);
    if (!g)
      continue;
    int k = mesh_group_members(&mesh, (enum plan_axis)a, rank, members);
    CHECK(g->size == k && g->rank == coord[a] && !strcmp(g->name, plan_axis_name((enum plan_axis)a)));
    for (int i = 0; i < k && i < g->size; i++)
      CHECK_MSG(g->ranks[i] == members[i], "rank %d %s member %d: %d vs %d", rank, g->name, i, g->ranks[i],
                members[i]);
  }
  /* By hand, with the default order { tp, dp, pp }: rank = tp + 2·dp + 4·pp. */
  static const int tp8[8][2] = { { 0, 1 }, { 0, 1 }, { 2, 3 }, { 2, 3 }, { 4, 5 }, { 4, 5 }, { 6, 7 }, { 6, 7 } };
  static const int dp8[8][2] = { { 0, 2 }, { 1, 3 }, { 0, 2 }, { 1, 3 }, { 4, 6 }, { 5, 7 }, { 4, 6 }, { 5, 7 } };
  static const int pp8[8][2] = { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 }, { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 } };
  if (default_order && mesh.tp == 2 && mesh.dp == 2 && groups[0] && groups[1] && groups[2]) {
    CHECK(groups[0]->ranks[0] == tp8[rank][0] && groups[0]->ranks[1] == tp8[rank][1]);
    CHECK(groups[1]->ranks[0] == dp8[rank][0] && groups[1]->ranks[1] == dp8[rank][1]);
    if (mesh.pp == 2)
      CHECK(groups[2]->ranks[0] == pp8[rank][0] && groups[2]->ranks[1] == pp8[rank][1]);
    else
      CHECK(groups[2]->size == 1 && groups[2]->ranks[0] == rank);
  }
  comm_counters_reset();
  memset(expected, 0, sizeof expected);
}

/* Rank r contributes r + 1; the sums and maxima below were worked out on paper. */
/* The hand tables below are for tp2 × dp2 and tp2 × dp2 × pp2 in the default order. */
static int has_hand_table(void)
{
  return default_order && mesh.tp == 2 && mesh.dp == 2 && (world == 4 || world == 8);
}

static void test_all_reduce_matches_hand_table(void)
{
  static const float world_sum[2] = { 10, 36 }, world_max[2] = { 4, 8 };
  static const float tp_sum[8] = { 3, 3, 7, 7, 11, 11, 15, 15 }, dp_sum[8] = { 4, 6, 4, 6, 12, 14, 12, 14 };
  static const float pp_sum[8] = { 6, 8, 10, 12, 6, 8, 10, 12 }, tp_max[8] = { 2, 2, 4, 4, 6, 6, 8, 8 };
  int w = world == 8;
  float x[3], y[3];
  for (int k = 0; k < 4; k++) {
    for (int i = 0; i < 3; i++)
      x[i] = (float)(rank + 1);
    CHECK(comm_all_reduce(group_at(k), x, y, 3, COMM_FP32, COMM_SUM, NULL) == 0);
    float want = k == 0 ? world_sum[w] : k == 1 ? tp_sum[rank] : k == 2 ? dp_sum[rank]
               : w ? pp_sum[rank] : (float)(rank + 1);
    CHECK_MSG(y[0] == want && y[2] == want, "rank %d group %d: %g, want %g", rank, k, y[0], want);
    expect(k, COMM_ALL_REDUCE, sizeof x);
  }
  CHECK(comm_all_reduce(comm_world(), x, y, 3, COMM_FP32, COMM_MAX, NULL) == 0 && y[1] == world_max[w]);
  CHECK(comm_all_reduce(groups[PLAN_AXIS_TP], x, y, 3, COMM_FP32, COMM_MAX, NULL) == 0 && y[1] == tp_max[rank]);
  expect(0, COMM_ALL_REDUCE, sizeof x);
  expect(1, COMM_ALL_REDUCE, sizeof x);
}

static int all_equal(const float *got, const float *want, size_t n, const char *what, const struct comm_group *g)
{
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "rank %d: %s on %s: element %zu is %g, want %g\n", rank, what, g->name, i, got[i], want[i]);
      return 0;
    }
  return 1;
}

/* One group, one mode: every operation against the formula. */
static void every_op(int k, int blocking)
{
  struct comm_group *g = group_at(k);
  size_t P = (size_t)g->size, b = N * sizeof(float);
  float *send = malloc(P * N * sizeof *send), *recv = malloc(P * N * sizeof *recv), *want = malloc(P * N * sizeof *want);
  struct comm_request *req = NULL, **rp = blocking ? NULL : &req;
  const char *mode = blocking ? "blocking" : "non-blocking";

  for (size_t i = 0; i < N; i++) {
    send[i] = value(rank, i);
    want[i] = 0;
    for (size_t j = 0; j < P; j++)
      want[i] += value(g->ranks[j], i);
  }
  CHECK_MSG(comm_all_reduce(g, send, recv, N, COMM_FP32, COMM_SUM, rp) == 0 && comm_wait(&req) == 0, "%s", comm_error());
  CHECK_MSG(all_equal(recv, want, N, "all-reduce sum", g), "%s", mode);
  memcpy(recv, send, b); /* in place */
  CHECK(comm_all_reduce(g, recv, recv, N, COMM_FP32, COMM_SUM, rp) == 0 && comm_wait(&req) == 0);
  CHECK_MSG(all_equal(recv, want, N, "all-reduce sum in place", g), "%s", mode);
  int top = 0;
  for (size_t j = 0; j < P; j++)
    top = g->ranks[j] > top ? g->ranks[j] : top;
  for (size_t i = 0; i < N; i++)
    want[i] = value(top, i);
  CHECK(comm_all_reduce(g, send, recv, N, COMM_FP32, COMM_MAX, rp) == 0 && comm_wait(&req) == 0);
  CHECK_MSG(all_equal(recv, want, N, "all-reduce max", g), "%s", mode);
  for (int i = 0; i < 3; i++)
    expect(k, COMM_ALL_REDUCE, b);

  for (size_t j = 0; j < P; j++)
    for (size_t i = 0; i < N; i++)
      want[j * N + i] = value(g->ranks[j], i);
  CHECK(comm_all_gather(g, send, recv, N, COMM_FP32, rp) == 0 && comm_wait(&req) == 0);
  CHECK_MSG(all_equal(recv, want, P * N, "all-gather", g), "%s", mode);
  memset(recv, 0, P * b);
  memcpy(recv + (size_t)g->rank * N, send, b);
  CHECK(comm_all_gather(g, recv + (size_t)g->rank * N, recv, N, COMM_FP32, rp) == 0 && comm_wait(&req) == 0);
  CHECK_MSG(all_equal(recv, want, P * N, "all-gather in place", g), "%s", mode);
  expect(k, COMM_ALL_GATHER, P * b);
  expect(k, COMM_ALL_GATHER, P * b);

  for (size_t i = 0; i < P * N; i++)
    send[i] = value(rank, i);
  for (size_t i = 0; i < N; i++) {
    want[i] = 0;
    for (size_t j = 0; j < P; j++)
      want[i] += value(g->ranks[j], (size_t)g->rank * N + i);
  }
  CHECK(comm_reduce_scatter(g, send, recv, N, COMM_FP32, COMM_SUM, rp) == 0 && comm_wait(&req) == 0);
  CHECK_MSG(all_equal(recv, want, N, "reduce-scatter", g), "%s", mode);
  expect(k, COMM_REDUCE_SCATTER, P * b);

  for (int root = 0; root < g->size; root++) {
    for (size_t i = 0; i < N; i++) {
      recv[i] = g->rank == root ? value(rank, i) : -1;
      want[i] = value(g->ranks[root], i);
    }
    CHECK(comm_broadcast(g, recv, N, COMM_FP32, root, rp) == 0 && comm_wait(&req) == 0);
    CHECK_MSG(all_equal(recv, want, N, "broadcast", g), "%s from %d", mode, root);
    expect(k, COMM_BROADCAST, b);
  }

  for (size_t j = 0; j < P; j++) /* block j goes to group rank j */
    for (size_t i = 0; i < N; i++) {
      send[j * N + i] = (float)(rank * 1000 + (int)j * 100 + (int)i);
      want[j * N + i] = (float)(g->ranks[j] * 1000 + g->rank * 100 + (int)i);
    }
  CHECK(comm_all_to_all(g, send, recv, N, COMM_FP32, rp) == 0 && comm_wait(&req) == 0);
  CHECK_MSG(all_equal(recv, want, P * N, "all-to-all", g), "%s", mode);
  expect(k, COMM_ALL_TO_ALL, P * b);

  /* A ring: each rank sends to the next and receives from the previous. Blocking, even ranks
   * send first and odd ranks receive first; a group of one talks to itself non-blocking only. */
  int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
  for (size_t i = 0; i < N; i++) {
    send[i] = value(rank, i);
    want[i] = value(g->ranks[prev], i);
  }
  memset(recv, 0, b);
  if (!blocking || g->size == 1) {
    struct comm_request *two[2] = { NULL, NULL };
    CHECK(comm_recv(g, recv, N, COMM_FP32, prev, &two[0]) == 0);
    CHECK(comm_send(g, send, N, COMM_FP32, next, &two[1]) == 0);
    CHECK_MSG(comm_wait_all(two, 2) == 0, "%s", comm_error());
  } else if (g->rank % 2 == 0) {
    CHECK(comm_send(g, send, N, COMM_FP32, next, NULL) == 0);
    CHECK(comm_recv(g, recv, N, COMM_FP32, prev, NULL) == 0);
  } else {
    CHECK(comm_recv(g, recv, N, COMM_FP32, prev, NULL) == 0);
    CHECK(comm_send(g, send, N, COMM_FP32, next, NULL) == 0);
  }
  CHECK_MSG(all_equal(recv, want, N, "send/recv ring", g), "%s", mode);
  expect(k, COMM_SEND, b);
  expect(k, COMM_RECV, b);

  /* Other dtypes: integer sums, bytes broadcast, bf16 moved as bits. */
  int32_t i32 = rank + 1, i32_sum = 0;
  int64_t i64 = (int64_t)rank << 33, i64_sum = 0, i64_want = 0;
  for (size_t j = 0; j < P; j++)
    i64_want += (int64_t)g->ranks[j] << 33;
  CHECK(comm_all_reduce(g, &i32, &i32_sum, 1, COMM_INT32, COMM_SUM, rp) == 0 && comm_wait(&req) == 0);
  CHECK(comm_all_reduce(g, &i64, &i64_sum, 1, COMM_INT64, COMM_SUM, rp) == 0 && comm_wait(&req) == 0);
  CHECK(i64_sum == i64_want);
  int32_t i32_want = 0;
  for (size_t j = 0; j < P; j++)
    i32_want += g->ranks[j] + 1;
  CHECK(i32_sum == i32_want);
  expect(k, COMM_ALL_REDUCE, sizeof i32);
  expect(k, COMM_ALL_REDUCE, sizeof i64);
  uint8_t bytes[5];
  for (int i = 0; i < 5; i++)
    bytes[i] = g->rank == 0 ? (uint8_t)(200 + i) : 0;
  CHECK(comm_broadcast(g, bytes, 5, COMM_UINT8, 0, rp) == 0 && comm_wait(&req) == 0);
  CHECK(bytes[0] == 200 && bytes[4] == 204);
  expect(k, COMM_BROADCAST, 5);
  uint16_t half = (uint16_t)(0x3f80 + rank), halves[64];
  CHECK(comm_all_gather(g, &half, halves, 1, COMM_BF16, rp) == 0 && comm_wait(&req) == 0);
  for (size_t j = 0; j < P; j++)
    CHECK(halves[j] == (uint16_t)(0x3f80 + g->ranks[j]));
  expect(k, COMM_ALL_GATHER, 2 * P);

  free(send);
  free(recv);
  free(want);
}

static void test_every_op_on_every_group_blocking(void)
{
  for (int k = 0; k < 4; k++)
    every_op(k, 1);
}

static void test_every_op_on_every_group_non_blocking(void)
{
  for (int k = 0; k < 4; k++)
    every_op(k, 0);
}

/* Everything started before anything is waited for: an all-reduce on tp, an all-gather on dp,
 * and a pipeline exchange on pp where every rank sends forward and backward at once, with
 * messages large enough for MPI's rendezvous protocol. One comm thread running blocking calls
 * in order would deadlock here; started non-blocking operations do not. */
static void test_many_in_flight_across_groups(void)
{
  enum { BIG = 1 << 18 }; /* 1 MiB of fp32 */
  struct comm_group *tp = groups[PLAN_AXIS_TP], *dp = groups[PLAN_AXIS_DP], *pp = groups[PLAN_AXIS_PP];
  float *a = malloc(BIG * sizeof *a), *gathered = malloc((size_t)dp->size * N * sizeof *gathered);
  float *fwd_out = malloc(BIG * sizeof *a), *bwd_out = malloc(BIG * sizeof *a);
  float *fwd_in = malloc(BIG * sizeof *a), *bwd_in = malloc(BIG * sizeof *a), x[N];
  for (size_t i = 0; i < BIG; i++) {
    a[i] = (float)(rank + 1);
    fwd_out[i] = value(rank, i % 1000);
    bwd_out[i] = -value(rank, i % 1000);
    fwd_in[i] = bwd_in[i] = 0;
  }
  for (size_t i = 0; i < N; i++)
    x[i] = value(rank, i);
  struct comm_request *reqs[6] = { NULL };
  int n = 0, up = pp->rank + 1, down = pp->rank - 1;
  comm_set_step(7, 2);
  CHECK(comm_all_reduce(tp, a, a, BIG, COMM_FP32, COMM_SUM, &reqs[n++]) == 0);
  CHECK(comm_all_gather(dp, x, gathered, N, COMM_FP32, &reqs[n++]) == 0);
  expect(1, COMM_ALL_REDUCE, BIG * sizeof(float));
  expect(2, COMM_ALL_GATHER, (size_t)dp->size * sizeof x);
  if (up < pp->size) { /* activations forward, gradients back */
    CHECK(comm_send(pp, fwd_out, BIG, COMM_FP32, up, &reqs[n++]) == 0);
    CHECK(comm_recv(pp, bwd_in, BIG, COMM_FP32, up, &reqs[n++]) == 0);
    expect(3, COMM_SEND, BIG * sizeof(float));
    expect(3, COMM_RECV, BIG * sizeof(float));
  }
  if (down >= 0) {
    CHECK(comm_send(pp, bwd_out, BIG, COMM_FP32, down, &reqs[n++]) == 0);
    CHECK(comm_recv(pp, fwd_in, BIG, COMM_FP32, down, &reqs[n++]) == 0);
    expect(3, COMM_SEND, BIG * sizeof(float));
    expect(3, COMM_RECV, BIG * sizeof(float));
  }
  CHECK_MSG(comm_wait_all(reqs, n) == 0, "%s", comm_error());
  float tp_sum = 0;
  for (int j = 0; j < tp->size; j++)
    tp_sum += (float)(tp->ranks[j] + 1);
  CHECK(a[0] == tp_sum && a[BIG - 1] == tp_sum);
  for (int j = 0; j < dp->size; j++)
    CHECK(gathered[(size_t)j * N + 5] == value(dp->ranks[j], 5));
  if (up < pp->size)
    CHECK(bwd_in[12345] == -value(pp->ranks[up], 12345 % 1000));
  if (down >= 0)
    CHECK(fwd_in[12345] == value(pp->ranks[down], 12345 % 1000));
  struct comm_record last[6];
  int k = comm_records(last, n);
  for (int i = 0; i < k; i++)
    CHECK(last[i].step == 7 && last[i].mb == 2 && last[i].t_end >= last[i].t_start && last[i].status == 0);
  comm_set_step(0, 0);
  free(a);
  free(gathered);
  free(fwd_out);
  free(bwd_out);
  free(fwd_in);
  free(bwd_in);
}

/* COMM_REAL, the type the runtime sends (fp32, or fp64 in the float64 build), on every group:
 * rank r contributes 1 + i + r·2^-40 (2^-12 in fp32), which an fp32 message could not carry in
 * the float64 build. Every sum has ≤ 49 significant bits (≤ 21 in fp32), so it is exact in any
 * order and the comparisons are bitwise. */
static void test_real_all_reduce_and_all_gather_carry_the_build_type(void)
{
  const real eps = REAL_IS_DOUBLE ? (real)0x1p-40 : (real)0x1p-12;
  for (int k = 0; k < 4; k++) {
    struct comm_group *g = group_at(k);
    real x[N], y[N], *all = malloc((size_t)g->size * N * sizeof *all);
    for (int i = 0; i < N; i++) x[i] = (real)(1 + i) + (real)rank * eps;
    CHECK(comm_all_reduce(g, x, y, N, COMM_REAL, COMM_SUM, NULL) == 0);
    CHECK(comm_all_gather(g, x, all, N, COMM_REAL, NULL) == 0);
    expect(k, COMM_ALL_REDUCE, sizeof x);
    expect(k, COMM_ALL_GATHER, (size_t)g->size * sizeof x);
    int bad = 0;
    for (int i = 0; i < N; i++) {
      real want = 0;
      for (int j = 0; j < g->size; j++) {
        real mine = (real)(1 + i) + (real)g->ranks[j] * eps;
        want += mine;
        bad += all[(size_t)j * N + i] != mine;
      }
      bad += y[i] != want;
    }
    CHECK_MSG(bad == 0, "rank %d %s: %d %s elements differ", rank, g->name, bad, REAL_NAME);
    free(all);
  }
}

/* bf16 sums (precision.grads = "bf16"'s reductions), 2 bytes an element on every group: small
 * integers, whose sums are exact in bf16 in any order, so the comparisons are bitwise; and on a
 * group of two the one rounding of a tie, to even: 1 + 2^-8 gives 1, 1 + 3·2^-8 gives 1 + 2^-6. */
static void test_bf16_all_reduce_and_reduce_scatter_sum(void)
{
  for (int k = 0; k < 4; k++) {
    struct comm_group *g = group_at(k);
    const size_t n = (size_t)g->size * N;
    bf16 *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), share[N];
    for (size_t i = 0; i < n; i++) x[i] = bf16_from_float((float)(i % 16 + (size_t)g->rank));
    CHECK(comm_all_reduce(g, x, y, n, COMM_BF16, COMM_SUM, NULL) == 0);
    CHECK(comm_reduce_scatter(g, x, share, N, COMM_BF16, COMM_SUM, NULL) == 0);
    expect(k, COMM_ALL_REDUCE, n * sizeof(bf16));
    expect(k, COMM_REDUCE_SCATTER, n * sizeof(bf16));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int j = 0; j < g->size; j++) want += (float)(i % 16 + (size_t)j);
      bad += bf16_to_float(y[i]) != want;
      if (i / N == (size_t)g->rank)
        bad += bf16_to_float(share[i % N]) != want;
    }
    CHECK_MSG(bad == 0, "rank %d %s: %d bf16 sums differ", rank, g->name, bad);
    if (g->size == 2) {
      bf16 tie[2] = { bf16_from_float(g->rank ? 0x1p-8f : 1.0f), bf16_from_float(g->rank ? 0x3p-8f : 1.0f) }, got[2];
      CHECK(comm_all_reduce(g, tie, got, 2, COMM_BF16, COMM_SUM, NULL) == 0);
      expect(k, COMM_ALL_REDUCE, sizeof tie);
      CHECK(bf16_to_float(got[0]) == 1.0f && bf16_to_float(got[1]) == 1.015625f);
    }
    free(x);
    free(y);
  }
}

static void test_counters_are_exact(void)
{
  for (int k = 0; k < 4; k++)
    for (int op = 0; op < COMM_N_OPS; op++) {
      struct comm_counter c = comm_counter_get(group_at(k), (enum comm_op)op);
      CHECK_MSG(c.calls == expected[k][op].calls && c.n_bytes == expected[k][op].n_bytes,
                "rank %d %s %s: %llu calls %llu bytes, expected %llu calls %llu bytes", rank, group_at(k)->name,
                comm_op_name((enum comm_op)op), (unsigned long long)c.calls, (unsigned long long)c.n_bytes,
                (unsigned long long)expected[k][op].calls, (unsigned long long)expected[k][op].n_bytes);
    }
  /* Sequence numbers count collectives only. */
  for (int k = 0; k < 4; k++) {
    uint64_t collectives = 0;
    for (int op = 0; op < COMM_N_OPS; op++)
      if (op != COMM_SEND && op != COMM_RECV)
        collectives += expected[k][op].calls;
    CHECK(comm_group_seq(group_at(k)) == collectives);
  }
}

static int parse_order(const char *s, enum plan_axis order[PLAN_N_AXES])
{
  int n = 0;
  char buf[32];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *t = strtok(buf, ","); t && n < PLAN_N_AXES; t = strtok(NULL, ","))
    order[n++] = !strcmp(t, "tp") ? PLAN_AXIS_TP : !strcmp(t, "dp") ? PLAN_AXIS_DP
               : !strcmp(t, "cp") ? PLAN_AXIS_CP : PLAN_AXIS_PP;
  if (n == PLAN_N_AXES - 1)
    order[n++] = PLAN_AXIS_CP; /* cp of one rank, anywhere */
  return n == PLAN_N_AXES ? 0 : -1;
}

int main(int argc, char **argv)
{
  char err[512];
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  world = comm_world()->size;
  mesh.tp = argc > 1 ? atoi(argv[1]) : 1;
  mesh.dp = argc > 2 ? atoi(argv[2]) : world;
  mesh.pp = argc > 3 ? atoi(argv[3]) : 1;
  mesh.world = mesh.tp * mesh.dp * mesh.pp;
  enum plan_axis order[PLAN_N_AXES] = { PLAN_AXIS_TP, PLAN_AXIS_DP, PLAN_AXIS_PP, PLAN_AXIS_CP };
  if (argc > 4 && parse_order(argv[4], order))
    comm_fatal("bad order %s", argv[4]);
  memcpy(mesh.order, order, sizeof order);
  default_order = order[0] == PLAN_AXIS_TP && order[1] == PLAN_AXIS_DP;
  if (mesh.world != world)
    comm_fatal("mesh tp %d dp %d pp %d is not the world of %d", mesh.tp, mesh.dp, mesh.pp, world);
  /* the hand table only where there is one (a test that checks nothing fails) */
  const struct test_case all[] = {
    TEST(test_mesh_groups_equal_mesh_members), TEST(test_all_reduce_matches_hand_table),
    TEST(test_every_op_on_every_group_blocking), TEST(test_every_op_on_every_group_non_blocking),
    TEST(test_many_in_flight_across_groups), TEST(test_real_all_reduce_and_all_gather_carry_the_build_type),
    TEST(test_bf16_all_reduce_and_reduce_scatter_sum), TEST(test_counters_are_exact),
  };
  struct test_case tests[sizeof all / sizeof all[0]];
  int n = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i].fn != test_all_reduce_matches_hand_table || has_hand_table())
      tests[n++] = all[i];
  int status = mpi_test_run_all(tests, n);
  if (comm_finalize(err, sizeof err))
    comm_fatal("%s", err);
  return status;
}
