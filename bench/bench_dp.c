/* Data-parallel step time: a full training step (forward and backward of this rank's
 * micro-batches, the bucket reductions, norm, clipping, AdamW and the ZeRO gathers) of a plan
 * (default plans/tiny.lua) on every rank of the job, through the trainer `tycho run` uses, with
 * dp = the number of ranks. Prints, on rank 0, one line: ranks, zero, threads per rank, ms per
 * step (the slowest rank's mean), global tokens/s, the speed-up over one rank when --base-ms is
 * given, the bytes each rank sends through the dp collectives per step (nccl-tests' "size"),
 * and rank 0's memory peaks. Run with mpirun like `tycho run`; bench/bench_dp.sh runs 1, 2 and
 * 4 ranks for each stage.
 * usage: bench_dp [--plan PLAN] [--zero Z] [--seconds S] [--base-ms MS] [--set path=value]... */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "kernels.h"
#include "plan/compile.h"
#include "runtime/model/alloc.h"
#include "runtime/train/threads.h"
#include "runtime/train/train.h"

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define MAX_SETS 16

int main(int argc, char **argv)
{
  threads_exec_with_settings(argv);
  char err[2048];
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  kernels_init_cpu(threads_per_rank(comm_local_size()));
  struct comm_group *world = comm_world();
  const char *plan_path = TYCHO_PLANS_DIR "/tiny.lua";
  const char *sets[MAX_SETS + 2];
  char zero_set[32] = "zero=0";
  int n_sets = 0;
  double seconds = 5.0, base_ms = 0.0;
  for (int i = 1; i < argc; i++) {
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--plan") && next)
      plan_path = argv[++i];
    else if (!strcmp(argv[i], "--zero") && next)
      snprintf(zero_set, sizeof zero_set, "zero=%s", argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && next)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--base-ms") && next)
      base_ms = atof(argv[++i]);
    else if (!strcmp(argv[i], "--set") && next && n_sets < MAX_SETS)
      sets[n_sets++] = argv[++i];
    else
      comm_fatal("usage: bench_dp [--plan PLAN] [--zero Z] [--seconds S] [--base-ms MS] [--set path=value]...");
  }
  sets[n_sets++] = zero_set;
  sets[n_sets++] = "train.eval_batches=0";
  struct plan p;
  plan_init(&p);
  struct plan_compile_options opt = { world->size, 0, 0, 0, n_sets, sets };
  if (plan_compile(plan_path, &opt, &p, err, sizeof err))
    comm_fatal("%s", err);
  struct comm_group *groups[PLAN_N_AXES];
  if (comm_build_mesh_groups(&p.mesh, groups, err, sizeof err))
    comm_fatal("%s", err);
  struct trainer t;
  if (trainer_open(&t, &p, groups, err, sizeof err) != TRAIN_OK)
    comm_fatal("%s", err);

  struct train_step_stats st;
  for (int s = 0; s < 2; s++) /* warm-up: thread pools, page faults */
    if (trainer_step(&t, &st, err, sizeof err))
      comm_fatal("%s", err);
  comm_counters_reset();
  /* Every rank runs the same number of steps: rank 0 decides when to stop. */
  int steps = 0, more = 1;
  double start = now_seconds();
  while (more) {
    if (trainer_step(&t, &st, err, sizeof err))
      comm_fatal("%s", err);
    steps++;
    more = steps < 5 || now_seconds() - start < seconds;
    if (comm_broadcast(world, &more, 1, COMM_INT32, 0, NULL))
      comm_fatal("%s", comm_error());
  }
  real elapsed = (real)(now_seconds() - start), slowest;
  if (comm_all_reduce(world, &elapsed, &slowest, 1, COMM_REAL, COMM_MAX, NULL))
    comm_fatal("%s", comm_error());
  const enum comm_op ops[] = { COMM_ALL_REDUCE, COMM_REDUCE_SCATTER, COMM_ALL_GATHER };
  double dp_bytes = 0.0;
  for (int i = 0; i < 3; i++)
    dp_bytes += (double)comm_counter_get(groups[PLAN_AXIS_DP], ops[i]).n_bytes;
  if (world->rank == 0) {
    const double ms = 1e3 * slowest / steps;
    const double tokens = (double)p.batch.global * p.batch.seq;
    const struct alloc_bill *b = alloc_bill();
    printf("dp %d zero %d: %d thread%s/rank, %3d steps, %8.1f ms/step, %8.0f tok/s", world->size,
           p.zero, omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s", steps, ms,
           tokens / (ms * 1e-3));
    if (base_ms > 0.0)
      printf(", speed-up %.2f", base_ms / ms);
    printf(", dp collectives %.2f MiB/step/rank, peaks: params %.2f grads %.2f optimizer %.2f comm %.2f MiB\n",
           dp_bytes / steps / 1048576.0, b->peak_bytes[ALLOC_PARAMS] / 1048576.0,
           b->peak_bytes[ALLOC_GRADS] / 1048576.0, b->peak_bytes[ALLOC_OPTIMIZER] / 1048576.0,
           b->peak_bytes[ALLOC_COMM] / 1048576.0);
    fflush(stdout);
  }
  trainer_close(&t);
  plan_free(&p);
  if (comm_finalize(err, sizeof err))
    comm_fatal("%s", err);
  return 0;
}
