-- The slurm tests' cluster: one node of 4 CPU ranks, as `tycho calibrate` describes a machine (a
-- device is one core running one rank of one thread). Figures of the order of a 2-core test
-- machine's; only the layout of the batch script depends on them.
return {
  name = "slurm test node, 4 CPU ranks",
  gpus_per_node = 4,
  nodes = 1,
  device_memory_gb = 1,
  peak_tflops = 0.05,
  intra_node = { bandwidth_gbs = 5, latency_us = 5 },
  inter_node = { bandwidth_gbs = 1, latency_us = 50 },
  efficiency = { compute = 0.8, comm = 0.8 },
  overlap = false,
}
