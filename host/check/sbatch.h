/* `tycho check --sbatch`: a Slurm batch script that runs a checked plan on a cluster. */
#ifndef TYCHO_CHECK_SBATCH_H
#define TYCHO_CHECK_SBATCH_H
#include <stdio.h>

#include "plan/cluster.h"
#include "plan/plan.h"

struct sbatch_options {
  const char *plan_path;    /* as given to check: the srun line runs the same file */
  const char *cluster_path; /* as given to check, for the script's comment */
  const char *self;         /* the tycho executable the srun line starts */
  const char *cwd;          /* the job's working folder (#SBATCH --chdir): relative paths as here */
  int n_sets;
  const char *const *sets;  /* the --set arguments, in order, passed on to `tycho run` */
  int cpus_per_task;        /* 0: not given (1 on a CPU cluster; whole nodes shared out on a GPU one) */
  int unsafe;               /* check ran with --unsafe: so does the job */
};

/* Writes the script for plan p (compiled for its world) on cluster c to f: #SBATCH nodes, tasks
 * and devices per node from the cluster's gpus_per_node and the world, CPUs per task, job name,
 * output file; the checkpoint and metrics paths and check's memory and step-time summary as
 * comments; the srun line running `tycho run` of the same plan with the same --sets, each word
 * quoted so that no byte of it ends the word or the line. 0 ok; −1 with the reason in err (the
 * bill or the cost could not be computed); 2, before anything is written, for a working folder
 * whose path holds a control character (an #SBATCH line cannot carry a line break). */
int check_write_sbatch(const struct plan *p, const struct cluster *c, const struct sbatch_options *o, FILE *f,
                       char *err, size_t err_size);

#endif
