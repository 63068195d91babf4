/* Proof that a non-blocking collective progresses while the caller computes: each round starts
 * an all-reduce of 32 MiB, then computes in ~1 ms chunks, never entering MPI, until the
 * all-reduce is done. Between chunks it asks comm_test, which only reads a flag the comm thread
 * sets: the caller never moves the data itself, and never waits. The records' timestamps must
 * show the all-reduce ending inside the compute window; the round fails if it has not ended
 * after 15 s of compute. Without the comm thread Open MPI would move the data only inside an
 * MPI call, so the all-reduce would never end here. The window is open-ended rather than
 * fixed because ranks sharing busy cores may take seconds instead of the ~0.1 s an idle
 * 2-core machine needs. The trace file (argv[1]) shows it in Perfetto: a "compute" slice on
 * each rank's caller track, the all-reduce on its "comm world" track inside it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mpi_check.h"

#define ROUNDS 3
#define N_ELEMS (8u << 20) /* 32 MiB of fp32 */
#define COMPUTE_LIMIT_SECONDS 15.0

static const char *trace_path = "mpi_overlap_trace.json";
static int rank, world;

/* About a millisecond of arithmetic on a private array; never calls MPI. */
static double compute_chunk(void)
{
  enum { M = 1 << 14 };
  static float a[M];
  double sum = 0;
  for (int k = 0; k < 20; k++)
    for (int i = 0; i < M; i++) {
      a[i] = a[i] * 0.999f + 1.0f;
      sum += a[i];
    }
  return sum;
}

static void test_all_reduce_progresses_during_compute(void)
{
  float *x = malloc(N_ELEMS * sizeof *x);
  float want = (float)(world * (world + 1) / 2);
  for (int round = 0; round < ROUNDS; round++) {
    for (size_t i = 0; i < N_ELEMS; i++)
      x[i] = (float)(rank + 1);
    comm_set_step(round, 0);
    struct comm_request *req = NULL;
    CHECK(comm_all_reduce(comm_world(), x, x, N_ELEMS, COMM_FP32, COMM_SUM, &req) == 0);
    double c0 = comm_now(), c1 = c0;
    volatile double sink = 0;
    int done = 0, chunks = 0;
    while (!done && c1 - c0 < COMPUTE_LIMIT_SECONDS) {
      sink += compute_chunk();
      chunks++;
      CHECK(comm_test(&req, &done) == 0); /* reads a flag; on done, frees the handle */
      c1 = comm_now();
    }
    comm_trace_span("compute", c0, c1);
    CHECK_MSG(done && req == NULL, "rank %d round %d: the all-reduce did not finish during %.1f s of compute",
              rank, round, c1 - c0);
    CHECK(comm_wait(&req) == 0); /* only if it did not finish: the test has failed already */

    struct comm_record r;
    CHECK(comm_records(&r, 1) == 1 && r.op == COMM_ALL_REDUCE && r.step == round);
    CHECK(x[0] == want && x[N_ELEMS - 1] == want);
    /* The evidence: issued before the compute began, ended after it began and before it ended. */
    CHECK_MSG(r.t_issue <= c0 && r.t_end > c0 && r.t_end <= c1, "rank %d round %d: all-reduce issued %.4f s, "
              "ended %.4f s, compute window %.4f-%.4f s", rank, round, r.t_issue, r.t_end, c0, c1);
    printf("rank %d round %d: all-reduce %u MiB issued %.4f s, ran %.4f-%.4f s (%.1f ms); compute %.4f-%.4f s "
           "(%d chunks), no wait\n", rank, round, (unsigned)(N_ELEMS * sizeof(float) >> 20), r.t_issue, r.t_start,
           r.t_end, 1e3 * (r.t_end - r.t_start), c0, c1, chunks);
    (void)sink;
  }
  fflush(stdout);
  free(x);
}

static void test_trace_shows_the_overlap(void)
{
  char err[512] = "";
  CHECK_MSG(comm_trace_write(trace_path, err, sizeof err) == 0, "%s", err);
  if (rank != 0)
    return;
  FILE *f = fopen(trace_path, "r");
  CHECK(f != NULL);
  if (!f)
    return;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *text = malloc((size_t)n + 1);
  size_t got = fread(text, 1, (size_t)n, f);
  text[got] = 0;
  fclose(f);
  CHECK_STR_CONTAINS(text, "\"traceEvents\":[");
  CHECK_STR_CONTAINS(text, "\"args\":{\"name\":\"rank 1\"}");
  CHECK_STR_CONTAINS(text, "\"name\":\"compute\",\"cat\":\"caller\",\"ph\":\"X\",\"pid\":1,\"tid\":0");
  CHECK_STR_CONTAINS(text, "\"name\":\"all-reduce\",\"cat\":\"comm\",\"ph\":\"X\",\"pid\":1,\"tid\":1");
  CHECK_STR_CONTAINS(text, "\"n_bytes\":33554432");
  printf("trace written to %s (%ld bytes)\n", trace_path, n);
  free(text);
}

int main(int argc, char **argv)
{
  char err[512];
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  if (argc > 1)
    trace_path = argv[1];
  rank = comm_world()->rank;
  world = comm_world()->size;
  static const struct test_case tests[] = {
    TEST(test_all_reduce_progresses_during_compute), TEST(test_trace_shows_the_overlap),
  };
  int status = mpi_test_run_all(tests, 2);
  if (comm_finalize(err, sizeof err))
    comm_fatal("%s", err);
  return status;
}
