/* Proof that a non-blocking collective progresses while the caller computes: each round starts
 * an all-reduce of 32 MiB, computes for 0.4 s without entering MPI, then waits. The records'
 * timestamps must show the all-reduce ending inside the compute window (after it began, before
 * it ended) and the wait returning at once. Without the comm thread Open MPI would move the
 * data only inside comm_wait, after the compute. The trace file (argv[1]) shows the same in
 * Perfetto: a "compute" slice on each rank's caller track, the all-reduce on its "comm world"
 * track inside it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mpi_check.h"

#define ROUNDS 3
#define N_ELEMS (8u << 20) /* 32 MiB of fp32 */
#define COMPUTE_SECONDS 0.4

static const char *trace_path = "mpi_overlap_trace.json";
static int rank, world;

/* Arithmetic on a private array for `seconds`, never calling MPI. */
static double compute_for(double seconds)
{
  enum { M = 1 << 16 };
  static float a[M];
  double t_end = comm_now() + seconds, sum = 0;
  while (comm_now() < t_end)
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
    double c0 = comm_now();
    volatile double sink = compute_for(COMPUTE_SECONDS);
    (void)sink;
    double c1 = comm_now();
    CHECK(comm_wait(&req) == 0);
    double w1 = comm_now();
    comm_trace_span("compute", c0, c1);
    comm_trace_span("wait", c1, w1);

    struct comm_record r;
    CHECK(comm_records(&r, 1) == 1 && r.op == COMM_ALL_REDUCE && r.step == round);
    CHECK(x[0] == want && x[N_ELEMS - 1] == want);
    /* The evidence: it ended after the compute began and before it ended; the wait was free. */
    CHECK_MSG(r.t_end > c0 && r.t_end < c1, "rank %d round %d: all-reduce ended at %.4f s, compute "
              "window %.4f-%.4f s", rank, round, r.t_end, c0, c1);
    CHECK_MSG(w1 - c1 < 0.05, "rank %d round %d: wait took %.4f s", rank, round, w1 - c1);
    printf("rank %d round %d: all-reduce %u MiB issued %.4f s, ran %.4f-%.4f s (%.1f ms); compute "
           "%.4f-%.4f s; wait %.3f ms\n", rank, round, (unsigned)(N_ELEMS * sizeof(float) >> 20), r.t_issue,
           r.t_start, r.t_end, 1e3 * (r.t_end - r.t_start), c0, c1, 1e3 * (w1 - c1));
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
