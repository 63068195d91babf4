/* A rank that never arrives. Four ranks run two all-reduces on the world; then rank 1, by
 * `mode`, sleeps for 30 s ("sleep"), leaves through comm_finalize ("finalize": it waits there for
 * the others), freezes with SIGSTOP ("stopped": its watchdog cannot answer) or dies without a
 * word ("exit"), while the others start a third all-reduce. With TYCHO_COMM_TIMEOUT=3 the job
 * must end in seconds, not hang: by the watchdog's diagnosis and MPI_Abort, or (exit) by mpirun
 * noticing the dead rank. watchdog.sh checks what is printed. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"

int main(int argc, char **argv)
{
  char err[512];
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  const char *mode = argc > 1 ? argv[1] : "sleep";
  struct comm_group *w = comm_world();
  float x[1024];
  for (int i = 0; i < 1024; i++)
    x[i] = 1;
  comm_set_step(5, 0);
  for (int mb = 0; mb < 2; mb++) {
    comm_set_step(5, mb);
    if (comm_all_reduce(w, x, x, 1024, COMM_FP32, COMM_SUM, NULL))
      comm_fatal("%s", comm_error());
  }
  if (w->rank == 1) {
    if (!strcmp(mode, "exit"))
      _exit(3);
    if (!strcmp(mode, "stopped"))
      raise(SIGSTOP);
    if (!strcmp(mode, "finalize")) {
      if (comm_finalize(err, sizeof err))
        comm_fatal("%s", err);
      return 0;
    }
    sleep(30);
  }
  comm_set_step(5, 2);
  if (comm_all_reduce(w, x, x, 1024, COMM_FP32, COMM_SUM, NULL))
    comm_fatal("%s", comm_error());
  fprintf(stderr, "rank %d: the third all-reduce finished: the watchdog did not fire\n", w->rank);
  comm_finalize(err, sizeof err);
  return 0;
}
