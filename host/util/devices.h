/* The CUDA devices this process may run on, asked of the driver: what decides where a plan with
 * device = "auto" or "cuda" runs. Kept out of plan/ (a plan is a pure function of its file) and
 * below check/ and runtime/ (both ask it). */
#ifndef TYCHO_DEVICES_H
#define TYCHO_DEVICES_H

/* 1 when this build has the CUDA backend (kernels/cuda/), else 0. */
int devices_cuda_built(void);
/* CUDA devices visible to this process: 0 without the backend, without a driver or without a
 * device (CUDA_VISIBLE_DEVICES applies). Asked of the driver once, then remembered. */
int devices_cuda_count(void);
/* The device of the rank with local rank local_rank (its index on its node) among count
 * devices: local_rank % count, so ranks of a node share the node's devices round robin; −1
 * when count < 1 or local_rank < 0. */
int devices_pick(int local_rank, int count);
/* The local rank the launcher gives: OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), else SLURM_LOCALID
 * (Slurm), else −1 (neither set, or not a number ≥ 0). */
int devices_local_rank_env(void);

#endif
