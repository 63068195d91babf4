/* The device a trainer computes on, chosen from the plan's device field at open: the CPU, or a
 * CUDA context of its own on device local_rank % device_count, whose kernel table is plugged in
 * (runtime_use_backend) while the trainer's model and buffers are made, and which the trainer
 * ends at close. "auto" is CUDA where this build has the backend and the driver sees a device,
 * else the CPU; `text` says which and why for the run's header. */
#ifndef TYCHO_RUNTIME_DEVICE_H
#define TYCHO_RUNTIME_DEVICE_H
#include <stddef.h>

#include "plan/plan.h"

struct runtime_device {
  int cuda;      /* 1: a CUDA context of this trainer's own; 0: the CPU (the selected table) */
  int index;     /* the CUDA device's index, of `count` visible */
  int count;
  void *ctx;     /* the CUDA context (NULL on the CPU) */
  char text[160]; /* "cpu", "cpu (auto: no CUDA device visible)", "cuda 0 of 8 (auto)", ... */
};

/* Resolves `device` for the rank whose local rank is local_rank (−1: unknown, taken as 0) and,
 * for CUDA, opens the context and makes its table and device the backend from now on
 * (runtime_use_backend). A cuda plan on a build or machine that cannot run it is refused before
 * (trainer_plan_supported); what fails here is the context itself. 0, or −1 with a message. */
int runtime_device_open(struct runtime_device *d, enum plan_device device, int local_rank, char *err,
                        size_t err_size);
/* The CUDA context's stream (a cudaStream_t), where NCCL operations go; NULL on the CPU. */
void *runtime_device_stream(const struct runtime_device *d);
/* Ends the context (after every block on its device is freed); the CPU: nothing. d zeroed. */
void runtime_device_close(struct runtime_device *d);
/* The local rank this process runs as: the comm layer's when it is up (it reads Open MPI's and
 * Slurm's environment, else asks MPI), else the environment's (devices_local_rank_env), else 0. */
int runtime_local_rank(void);

#endif
