/* Bandwidth of the comm layer's all-reduce, all-gather and reduce-scatter over the world, in
 * the manner of nccl-tests: for each size, the time per call (slowest rank), algorithm
 * bandwidth (size / time) and bus bandwidth (all-reduce × 2(n−1)/n, all-gather and
 * reduce-scatter × (n−1)/n: the bytes each rank's link must carry, comparable across n), a
 * data check counting wrong elements, and a closing average bus bandwidth. "size" is nccl-tests'
 * too: the all-reduce buffer, the gathered buffer, the buffer before scattering.
 *
 *   mpirun -np 4 bench_comm [-b 4K] [-e 64M] [-f 2] [-n 10] [-w 2] [--mpi]
 *
 * --mpi times MPI's blocking calls directly on the same buffers instead, for comparison: the
 * difference is the comm layer's cost (the hand-over to its comm thread, non-blocking
 * algorithms). A benchmark, not a test: nothing here is asserted. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

enum bench_op { BENCH_ALL_REDUCE, BENCH_ALL_GATHER, BENCH_REDUCE_SCATTER, BENCH_N_OPS };
static const char *const op_names[] = { "all-reduce", "all-gather", "reduce-scatter" };

static int rank, n_ranks, raw_mpi;

static size_t parse_size(const char *s)
{
  char *end;
  double v = strtod(s, &end);
  double unit = *end == 'K' || *end == 'k' ? 1 << 10 : *end == 'M' || *end == 'm' ? 1 << 20
              : *end == 'G' || *end == 'g' ? 1 << 30 : 1;
  return (size_t)(v * unit);
}

/* Bus bandwidth factor (nccl-tests). */
static double bus_factor(enum bench_op op)
{
  double n = n_ranks;
  return op == BENCH_ALL_REDUCE ? 2 * (n - 1) / n : (n - 1) / n;
}

/* Element i of rank r's send buffer: small integers, so every sum is exact in fp32. */
static float input(int r, size_t i) { return (float)(r + 1 + (int)(i % 7)); }

/* Runs one call. count: elements per rank as the comm API counts them. in_place for
 * all-reduce (send == recv) and all-gather (send inside recv). */
static int run_op(enum bench_op op, float *send, float *recv, size_t count, int in_place)
{
  struct comm_group *w = comm_world();
  float *src = in_place ? (op == BENCH_ALL_GATHER ? recv + (size_t)rank * count : recv) : send;
  if (raw_mpi) {
    const void *s = in_place ? MPI_IN_PLACE : src;
    int c = (int)count;
    if (op == BENCH_ALL_REDUCE)
      return MPI_Allreduce(s, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
    if (op == BENCH_ALL_GATHER)
      return MPI_Allgather(s, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
    return MPI_Reduce_scatter_block(send, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
  }
  if (op == BENCH_ALL_REDUCE)
    return comm_all_reduce(w, src, recv, count, COMM_FP32, COMM_SUM, NULL);
  if (op == BENCH_ALL_GATHER)
    return comm_all_gather(w, src, recv, count, COMM_FP32, NULL);
  return comm_reduce_scatter(w, send, recv, count, COMM_FP32, COMM_SUM, NULL);
}

/* Fills the buffers for one call; in place, the input goes where the call reads it. */
static void fill(enum bench_op op, float *send, float *recv, size_t count, int in_place)
{
  size_t n_send = op == BENCH_REDUCE_SCATTER ? count * (size_t)n_ranks : count;
  size_t n_recv = op == BENCH_ALL_GATHER ? count * (size_t)n_ranks : count;
  for (size_t i = 0; i < n_recv; i++)
    recv[i] = -1;
  float *dst = in_place ? (op == BENCH_ALL_GATHER ? recv + (size_t)rank * count : recv) : send;
  for (size_t i = 0; i < n_send; i++)
    dst[i] = input(rank, i);
}

/* Wrong elements in this rank's result. */
static long long count_wrong(enum bench_op op, const float *recv, size_t count)
{
  long long wrong = 0;
  if (op == BENCH_ALL_GATHER) {
    for (int r = 0; r < n_ranks; r++)
      for (size_t i = 0; i < count; i++)
        wrong += recv[(size_t)r * count + i] != input(r, i);
    return wrong;
  }
  size_t offset = op == BENCH_REDUCE_SCATTER ? (size_t)rank * count : 0;
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < n_ranks; r++)
      want += input(r, offset + i);
    wrong += recv[i] != want;
  }
  return wrong;
}

/* Times `iters` calls after `warmup`, then checks one fresh call. Returns seconds per call
 * (the slowest rank) and the wrong elements summed over ranks. */
static double measure(enum bench_op op, float *send, float *recv, size_t count, int in_place, int warmup,
                      int iters, long long *wrong)
{
  fill(op, send, recv, count, in_place);
  for (int i = 0; i < warmup; i++)
    if (run_op(op, send, recv, count, in_place))
      comm_fatal("%s", raw_mpi ? "MPI call failed" : comm_error());
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++)
    if (run_op(op, send, recv, count, in_place))
      comm_fatal("%s", raw_mpi ? "MPI call failed" : comm_error());
  double mine = (MPI_Wtime() - t0) / iters, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  fill(op, send, recv, count, in_place);
  if (run_op(op, send, recv, count, in_place))
    comm_fatal("%s", raw_mpi ? "MPI call failed" : comm_error());
  long long w = count_wrong(op, recv, count);
  MPI_Allreduce(&w, wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return slowest;
}

int main(int argc, char **argv)
{
  char err[512];
  size_t min_bytes = 4 << 10, max_bytes = 64 << 20;
  int factor = 2, iters = 10, warmup = 2;
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--mpi")) raw_mpi = 1;
    else if (!strcmp(a, "-b") && v) min_bytes = parse_size(argv[++i]);
    else if (!strcmp(a, "-e") && v) max_bytes = parse_size(argv[++i]);
    else if (!strcmp(a, "-f") && v) factor = atoi(argv[++i]);
    else if (!strcmp(a, "-n") && v) iters = atoi(argv[++i]);
    else if (!strcmp(a, "-w") && v) warmup = atoi(argv[++i]);
    else comm_fatal("usage: bench_comm [-b 4K] [-e 64M] [-f 2] [-n 10] [-w 2] [--mpi]");
  }
  if (factor < 2 || iters < 1 || warmup < 0 || min_bytes < 4 || max_bytes < min_bytes)
    comm_fatal("bench_comm: bad sizes or counts");
  rank = comm_world()->rank;
  n_ranks = comm_world()->size;
  float *send = malloc(max_bytes + 64), *recv = malloc(max_bytes + 64);
  if (!send || !recv)
    comm_fatal("bench_comm: out of memory for %zu bytes", max_bytes);
  if (rank == 0) {
    printf("# bench_comm: %d ranks, %s, fp32 sum, %d iterations after %d warm-up, time of the slowest rank\n",
           n_ranks, raw_mpi ? "MPI blocking calls directly (--mpi)" : "comm layer (backend mpi), blocking calls",
           iters, warmup);
    printf("#\n#%14s %12s %15s  %9s %8s %8s %7s  %9s %8s %8s %7s\n", "", "", "", "out-of-place", "", "", "",
           "in-place", "", "", "");
    printf("#%14s %12s %15s  %9s %8s %8s %7s  %9s %8s %8s %7s\n", "size", "count", "op", "time", "algbw",
           "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("#%14s %12s %15s  %9s %8s %8s %7s  %9s %8s %8s %7s\n", "(B)", "(elements)", "", "(us)", "(GB/s)",
           "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  double bus_sum = 0;
  int bus_n = 0;
  long long wrong_total = 0;
  for (int op = 0; op < BENCH_N_OPS; op++)
    for (size_t size = min_bytes; size <= max_bytes; size *= (size_t)factor) {
      size_t per_rank_elems = op == BENCH_ALL_REDUCE ? size / 4 : size / 4 / (size_t)n_ranks;
      if (per_rank_elems == 0)
        continue;
      size_t bytes = op == BENCH_ALL_REDUCE ? per_rank_elems * 4 : per_rank_elems * 4 * (size_t)n_ranks;
      double t[2] = { 0, 0 };
      long long wrong[2] = { 0, 0 };
      int places = op == BENCH_REDUCE_SCATTER ? 1 : 2; /* the comm API has no in-place reduce-scatter */
      for (int p = 0; p < places; p++)
        t[p] = measure((enum bench_op)op, send, recv, per_rank_elems, p, warmup, iters, &wrong[p]);
      if (rank != 0)
        continue;
      printf("%15zu %12zu %15s", bytes, per_rank_elems, op_names[op]);
      for (int p = 0; p < 2; p++) {
        if (p >= places) {
          printf("  %9s %8s %8s %7s", "-", "-", "-", "-");
          continue;
        }
        double algbw = (double)bytes / t[p] / 1e9, busbw = algbw * bus_factor((enum bench_op)op);
        printf("  %9.1f %8.3f %8.3f %7lld", t[p] * 1e6, algbw, busbw, wrong[p]);
        bus_sum += busbw;
        bus_n++;
        wrong_total += wrong[p];
      }
      printf("\n");
      fflush(stdout);
    }
  if (rank == 0) {
    printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.4f GB/s\n#\n", bus_n ? bus_sum / bus_n : 0);
  }
  free(send);
  free(recv);
  if (comm_finalize(err, sizeof err))
    comm_fatal("%s", err);
  return 0;
}
