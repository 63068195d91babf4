/* Cluster descriptions (plans/clusters/NAME.lua): what `tycho check --cluster` and `tycho tune`
 * price a plan against. A cluster file is Lua run in the plan sandbox and returns a plain table:
 *
 *   return {
 *     name = "...",
 *     gpus_per_node = 8,
 *     device_memory_gb = 80,            -- per GPU, 10^9 bytes
 *     peak_tflops = 989,                -- dense bf16 per GPU, from the vendor's data sheet
 *     intra_node = { bandwidth_gbs = 450, latency_us = 3 },   -- per GPU, one direction
 *     inter_node = { bandwidth_gbs = 50, latency_us = 5 },
 *     efficiency = { compute = 0.6, comm = 0.8 },             -- achievable fractions
 *   }
 *
 * Every field is required; unknown fields are refused with the closest name. */
#ifndef TYCHO_PLAN_CLUSTER_H
#define TYCHO_PLAN_CLUSTER_H
#include <stddef.h>

struct cluster_link {
  double bandwidth;  /* bytes per second, one direction, per GPU */
  double latency;    /* seconds */
};

struct cluster {
  char name[128];
  char file[1024];
  int gpus_per_node;
  double device_memory;   /* bytes */
  double peak_flops;      /* dense bf16 FLOP/s per GPU */
  struct cluster_link intra, inter;
  double compute_efficiency, comm_efficiency;
};

/* Reads a cluster file. 0 ok; −1 with "<file>:<line>: <field>: <problem>" in err. */
int cluster_load(const char *path, int unsafe, struct cluster *out, char *err, size_t err_size);

#endif
