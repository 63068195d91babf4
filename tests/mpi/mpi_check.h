/* The unit-test harness (tests/unit/check.h) across ranks: every rank runs each test, then
 * the ranks agree on the verdict, so rank 0's "ok" means every rank passed (and that some rank
 * ran a CHECK: a test that checks nothing anywhere fails). CHECK failures print on the rank
 * that saw them (stderr), with its world rank in front. */
#ifndef TYCHO_MPI_CHECK_H
#define TYCHO_MPI_CHECK_H
#include <mpi.h>

#include "check.h"

static inline int mpi_test_run_all(const struct test_case *tests, int n)
{
  int rank = 0, failed = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int i = 0; i < n; i++) {
    int before = check_failures, ran = check_count, mine, any = 0, checks = 0;
    tests[i].fn();
    mine = check_failures != before;
    if (mine)
      fprintf(stderr, "rank %d: FAIL %s\n", rank, tests[i].name);
    int my_checks = check_count - ran;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&my_checks, &checks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    any |= checks == 0; /* no rank checked anything: the test proves nothing */
    failed += any;
    if (rank == 0)
      printf("%s %s%s\n", any ? "FAIL" : "ok  ", tests[i].name, checks == 0 ? " (no rank ran a CHECK)" : "");
  }
  if (rank == 0)
    printf("%d passed, %d failed\n", n - failed, failed);
  fflush(stdout);
  return failed ? 1 : 0;
}
#endif
