/* Context parallelism's ring attention (host/runtime/parallel/cp.c) across ranks: the world is
 * the cp group, each rank holds its chunk pair (chunks i and 2·cp − 1 − i) of every sample, and
 * its out, lse (forward) and dq, dk, dv (backward) equal the whole-sequence kernels' on its rows
 * within CP_TOL (tests/unit/cp_fixture.h argues the bound; test_attention_cp holds the same
 * blocks in one process). Grouped heads with dropout, and T not divisible by 2·cp (uneven
 * chunks, ranks holding different counts). The ring's traffic, by the comm layer's counters,
 * equals its formula: with T divisible by 2·cp each rank sends forward 2 (cp − 1) · B · (T/cp)
 * · NKV · HS reals (k and v of the pair it holds, cp − 1 hops) and backward (2 (cp − 1) + 2 cp)
 * times B · (T/cp) · NKV · HS (k and v again, and the dk, dv accumulators' cp hops home), and
 * receives as much; for any T, cp_ring_send_bytes. A sequence shorter than its 2·cp chunks is
 * refused by name, and so is a table whose memory the host cannot address. The ring runs on a
 * table that wraps the CPU's and counts the block entries: every block is a call through the
 * table it is given (none by name). Run on 2 and 4 ranks. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "mpi_check.h"
#include "cp_fixture.h"
#include "runtime/model/alloc.h"
#include "runtime/parallel/cp.h"

static int rank, cp;
static struct comm_group *group;
static char err[1024];

/* kernel_ops_cpu with the block entries counted. */
static struct kernel_ops counted;
static int n_fwd, n_merge, n_dots, n_bwd;
static void c_fwd(void *ctx, real *out, real *lse, real *scratch, const real *q, const real *k, const real *v,
                  const struct attention_dropout *drop, const struct attention_block *blk, int B, int NH, int NKV,
                  int HS)
{
  n_fwd++;
  kernel_ops_cpu.attention_cp_forward(ctx, out, lse, scratch, q, k, v, drop, blk, B, NH, NKV, HS);
}
static void c_merge(void *ctx, real *out, real *lse, const real *out_b, const real *lse_b, int B, int Tq,
                    int q_rows, int NH, int HS)
{
  n_merge++;
  kernel_ops_cpu.attention_cp_merge(ctx, out, lse, out_b, lse_b, B, Tq, q_rows, NH, HS);
}
static void c_dots(void *ctx, real *D, const real *dout, const real *out, int B, int Tq, int q_rows, int NH, int HS)
{
  n_dots++;
  kernel_ops_cpu.attention_cp_row_dots(ctx, D, dout, out, B, Tq, q_rows, NH, HS);
}
static void c_bwd(void *ctx, real *dq, real *dk, real *dv, real *scratch, const real *dout, const real *q,
                  const real *k, const real *v, const real *lse, const real *D, const struct attention_dropout *drop,
                  const struct attention_block *blk, int B, int NH, int NKV, int HS)
{
  n_bwd++;
  kernel_ops_cpu.attention_cp_backward(ctx, dq, dk, dv, scratch, dout, q, k, v, lse, D, drop, blk, B, NH, NKV, HS);
}

static void ring_case(int B, int T, int NH, int NKV, int HS, float p, uint32_t seed)
{
  struct cp_case c;
  cp_case_make(&c, B, T, NH, NKV, HS, p, seed);
  const struct attention_dropout *drop = p > 0 ? &c.d : NULL;
  struct cp_ring ring;
  CHECK_MSG(cp_ring_init(&ring, &counted, NULL, ALLOC_HOST, group, B, T, NH, NKV, HS, err, sizeof err) == 0, "%s", err);
  n_fwd = n_merge = n_dots = n_bwd = 0;
  const int Tl = ring.Tl, C = NH * HS, CK = NKV * HS;
  const size_t nq = (size_t)B * Tl * C, nkv = (size_t)B * Tl * CK, nl = (size_t)B * NH * Tl;
  real *q = malloc(nq * sizeof(real)), *dout = malloc(nq * sizeof(real));
  real *k = malloc(nkv * sizeof(real)), *v = malloc(nkv * sizeof(real));
  cp_gather_rows(q, c.q, B, T, C, cp, rank), cp_gather_rows(dout, c.dout, B, T, C, cp, rank);
  cp_gather_rows(k, c.k, B, T, CK, cp, rank), cp_gather_rows(v, c.v, B, T, CK, cp, rank);
  real *out = malloc(nq * sizeof(real)), *lse = malloc(nl * sizeof(real));
  real *dq = malloc(nq * sizeof(real)), *dk = malloc(nkv * sizeof(real)), *dv = malloc(nkv * sizeof(real));

  comm_counters_reset();
  CHECK_MSG(cp_ring_forward(&ring, out, lse, q, k, v, drop, err, sizeof err) == 0, "%s", err);
  const struct comm_counter fs = comm_counter_get(group, COMM_SEND), fr = comm_counter_get(group, COMM_RECV);
  comm_counters_reset();
  CHECK_MSG(cp_ring_backward(&ring, dq, dk, dv, dout, q, k, v, out, lse, drop, err, sizeof err) == 0, "%s", err);
  const struct comm_counter bs = comm_counter_get(group, COMM_SEND), br = comm_counter_get(group, COMM_RECV);
  /* 2·cp + 1 blocks a rank (three at step 0, two at each later one), each chunk's first
   * assigning and every later one merged: 2·cp − 1 merges; D once */
  CHECK_MSG(n_fwd == 2 * cp + 1 && n_merge == 2 * cp - 1 && n_dots == 1 && n_bwd == 2 * cp + 1,
            "rank %d: the table saw %d forward blocks, %d merges, %d row dots, %d backward blocks", rank, n_fwd,
            n_merge, n_dots, n_bwd);

  CHECK_MSG(fs.n_bytes == cp_ring_send_bytes(&ring, 0) && bs.n_bytes == cp_ring_send_bytes(&ring, 1),
            "rank %d T %d: sent %llu forward, %llu backward; the formula says %zu, %zu", rank, T,
            (unsigned long long)fs.n_bytes, (unsigned long long)bs.n_bytes, cp_ring_send_bytes(&ring, 0),
            cp_ring_send_bytes(&ring, 1));
  if (T % (2 * cp) == 0) {
    const uint64_t share = (uint64_t)B * (T / cp) * NKV * HS * sizeof(real);
    const uint64_t fwd = 2 * (uint64_t)(cp - 1) * share, bwd = (2 * (uint64_t)(cp - 1) + 2 * (uint64_t)cp) * share;
    CHECK_MSG(fs.n_bytes == fwd && fr.n_bytes == fwd && bs.n_bytes == bwd && br.n_bytes == bwd,
              "rank %d T %d: forward sent %llu received %llu, backward sent %llu received %llu; expected %llu, %llu",
              rank, T, (unsigned long long)fs.n_bytes, (unsigned long long)fr.n_bytes,
              (unsigned long long)bs.n_bytes, (unsigned long long)br.n_bytes, (unsigned long long)fwd,
              (unsigned long long)bwd);
  }

  real *want = malloc(nq * sizeof(real));
  const real *got[5] = { out, lse, dq, dk, dv }, *whole[5] = { c.out, c.lse, c.dq, c.dk, c.dv };
  const size_t n[5] = { nq, nl, nq, nkv, nkv };
  const int X[5] = { C, 1, C, CK, CK };
  const char *name[5] = { "out", "lse", "dq", "dk", "dv" };
  for (int o = 0; o < 5; o++) {
    if (o == 1)
      cp_gather_lse(want, c.lse, B, T, NH, cp, rank);
    else
      cp_gather_rows(want, whole[o], B, T, X[o], cp, rank);
    const double e = cp_err(got[o], want, n[o]);
    CHECK_MSG(e <= CP_TOL, "rank %d of %d, T %d, p %g: %s off by %.3g of its largest (bound %.3g)", rank, cp, T,
              (double)p, name[o], e, (double)CP_TOL);
  }
  free(want), free(q), free(dout), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv);
  cp_ring_free(&ring);
  cp_case_free(&c);
}

static void ring_with_grouped_heads_and_dropout_matches_the_whole_sequence(void)
{
  ring_case(2, 1024, 8, 2, 16, 0.1f, 41);
}

static void ring_over_uneven_chunks_matches_the_whole_sequence(void)
{
  ring_case(1, 1003, 4, 4, 32, 0.0f, 42);
  ring_case(2, 2 * cp + 1, 4, 1, 16, 0.2f, 43); /* chunks of one and two tokens */
}

static void short_sequence_is_refused(void)
{
  struct cp_ring ring;
  const int T = 2 * cp - 1;
  CHECK(cp_ring_init(&ring, &kernel_ops_cpu, NULL, ALLOC_HOST, group, 1, T, 2, 1, 16, err, sizeof err) == -1);
  char want[64];
  snprintf(want, sizeof want, "(T = %d) is shorter than its 2 · cp = %d chunks", T, 2 * cp);
  CHECK_STR_CONTAINS(err, want);
}

static void device_memory_table_is_refused(void)
{
  struct cp_ring ring;
  struct kernel_ops dev = kernel_ops_cpu;
  dev.name = "gpu-like", dev.host_visible = 0;
  CHECK(cp_ring_init(&ring, &dev, NULL, ALLOC_HOST, group, 1, 4 * cp, 2, 1, 16, err, sizeof err) == -1);
  CHECK_STR_CONTAINS(err, "the ring on the gpu-like kernel table (device memory) is not supported yet");
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  kernels_init_cpu(1);
  counted = kernel_ops_cpu;
  counted.attention_cp_forward = c_fwd, counted.attention_cp_merge = c_merge;
  counted.attention_cp_row_dots = c_dots, counted.attention_cp_backward = c_bwd;
  rank = comm_world()->rank;
  cp = comm_world()->size;
  if (comm_group_split(comm_world(), 0, rank, "cp", &group, err, sizeof err))
    comm_fatal("%s", err);
  const struct test_case tests[] = {
    TEST(ring_with_grouped_heads_and_dropout_matches_the_whole_sequence),
    TEST(ring_over_uneven_chunks_matches_the_whole_sequence),
    TEST(short_sequence_is_refused),
    TEST(device_memory_table_is_refused),
  };
  int status = mpi_test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  if (comm_group_free(group, err, sizeof err))
    comm_fatal("%s", err);
  if (comm_finalize(err, sizeof err))
    comm_fatal("%s", err);
  return status;
}
