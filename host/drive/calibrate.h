/* `tycho calibrate`: measures this machine and writes a cluster file (plan/cluster.h) that
 * `tycho check --cluster` and `tycho tune` price plans against (docs/calibrate.md).
 *
 * It runs under mpirun with 2 or more ranks on one node, at most one per core (run by hand,
 * `tycho calibrate` starts one rank per online core itself: host/main.c, util/launch.h): a "GPU" of the
 * file is one core running one rank of one thread, as `tycho run` runs N ranks on N cores. Every
 * rank measures at once (the cores share caches and memory bandwidth as in a run), and each
 * figure is the slowest rank's best (shortest time) of the repetitions — on a machine other work
 * shares, a burst of it lengthens some repetitions and never shortens one; the compute is timed
 * in the measuring thread's CPU time (calibrate runs the kernels on one thread), so what the core
 * gave other work is left out; the collectives on the wall clock:
 *   - peak_tflops: the kernel table's linear_forward on a 1024 × 1024 × 1024 product (or the plan's
 *     linears' rate where that is higher);
 *   - efficiency.compute: the rate of the plan's linears (q|k|v, o, gate|up, down, the head;
 *     forward and backward at batch.micro × batch.seq tokens) over that peak;
 *   - overheads.attention_tflops: attention_forward_qkv + attention_backward_qkv at the plan's
 *     shapes, over 3 × the attention core's FLOPs as plan_layer_flops counts them;
 *   - overheads.pointwise_ns: the plan's serial forward and backward (the trainer `tycho run`
 *     uses, one rank, mesh 1 × 1 × 1, zero 0) less what the model gives its matmuls and
 *     attention at the rates above, per token · layer · (dim + ffn_dim) element (cost.h);
 *   - overheads.optimizer_ns: sumsq + adamw_update over the plan's parameter count, per element;
 *   - the link: all-reduce, all-gather and reduce-scatter of the world through the comm layer at
 *     8 B, 64 KiB, 1 MiB and 8 MiB, fitted to the model's ring costs (latency and bandwidth,
 *     efficiency.comm = 1: the fit is the achieved bandwidth); inter_node = intra_node, nodes = 1;
 * *   - gpus_per_node: the online cores (sysconf; the launcher binds each rank to one, so a rank's
 *     affinity is not the node's); device_memory_gb: the
 *     node's memory over them.
 * The file's header comment states when, where and how, with every figure measured. */
#ifndef TYCHO_DRIVE_CALIBRATE_H
#define TYCHO_DRIVE_CALIBRATE_H
#include <stddef.h>
#include <stdio.h>

struct calibrate_options {
  const char *plan;          /* the plan whose shapes are measured */
  const char *out;           /* the cluster file to write (rank 0) */
  const char *name;          /* the cluster's name; NULL: one made from the host and cores */
  int reps;                  /* repetitions per measurement (the best is kept) */
  int unsafe;
  size_t memory_limit;
  long long instruction_limit;
  int n_sets;
  const char *const *sets;
  const char *command;       /* the command line, for the header */
};

/* Collective over the comm world. 0 ok (rank 0 wrote o->out and a summary on `log`); 2 a usage
 * or plan error (fewer than 2 ranks, more ranks than cores, ranks on several nodes, a plan this
 * cannot measure); 1 a runtime failure. The message in err; the status is the same on every
 * rank. */
int calibrate_run(const struct calibrate_options *o, FILE *log, char *err, size_t err_size);

#endif
