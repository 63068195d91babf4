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
 *     -- optional (`tycho calibrate` writes them for the machine it measured, docs/calibrate.md):
 *     nodes = 1,                        -- nodes in the cluster; absent: as many as a job needs
 *     -- optional in intra_node and inter_node: an op's own figures where it differs from the link's
 *     --   intra_node = { bandwidth_gbs = 5, latency_us = 5, all_gather = { bandwidth_gbs = 9, latency_us = 4 } },
 *     --   (all_reduce, all_gather, reduce_scatter; the pipeline's sends use the link's)
 *     overlap = false,                  -- collectives hide behind compute (absent: true); false
 *                                       -- where the comm layer's progress shares the compute's core
 *     overheads = {                     -- work beside the matmuls; absent: costs nothing
 *       attention_tflops = 0.02,        -- the causal attention core, its FLOPs as the plan counts them
 *       pointwise_ns = 0.5,             -- per token, layer and (dim + ffn_dim) element, fwd + bwd
 *       optimizer_ns = 2,               -- per parameter element a rank updates (norm, clip, AdamW)
 *     },
 *   }
 *
 * For a CPU cluster (what `tycho calibrate` writes) a "GPU" is one core running one rank of one
 * thread: gpus_per_node is the cores, device_memory_gb the node's memory over its cores,
 * peak_tflops the core's sgemm rate on large square products. With `nodes`, a job of more ranks
 * than nodes × gpus_per_node shares the devices: the model runs every rank's compute slower by
 * ranks per device (cost.h). Every other field is required; unknown fields are refused with the
 * list of the known ones. */
#ifndef TYCHO_PLAN_CLUSTER_H
#define TYCHO_PLAN_CLUSTER_H
#include <stddef.h>

struct cluster_link {
  double bandwidth;  /* bytes per second, one direction, per GPU */
  double latency;    /* seconds */
  /* the link's figures for all-reduce, all-gather, reduce-scatter (enum comm_op order) where
   * the file states them (intra_node.all_gather = { ... }); 0: bandwidth and latency above */
  double op_bandwidth[3], op_latency[3];
};

struct cluster {
  char name[128];
  char file[1024];
  int gpus_per_node;
  double device_memory;   /* bytes */
  double peak_flops;      /* dense bf16 FLOP/s per GPU */
  struct cluster_link intra, inter;
  double compute_efficiency, comm_efficiency;
  int nodes;                /* 0: not stated (as many as a job needs) */
  int no_overlap;           /* overlap = false: every collective's time is exposed */
  double attention_flops;   /* FLOP/s of the attention core; 0: at peak × compute efficiency */
  double pointwise_s;       /* seconds per token · layer · (dim + ffn_dim) element, fwd + bwd; 0: none */
  double optimizer_s;       /* seconds per parameter element updated; 0: none */
};

/* Reads a cluster file. 0 ok; −1 with "<file>:<line>: <field>: <problem>" in err. */
int cluster_load(const char *path, int unsafe, struct cluster *out, char *err, size_t err_size);

#endif
