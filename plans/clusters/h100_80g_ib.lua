-- 8 × NVIDIA H100 80GB SXM5 per node (DGX H100 / HGX H100), nodes joined by InfiniBand NDR,
-- one 400 Gb/s adapter per GPU.
-- Figures: NVIDIA H100 data sheet (BF16 tensor core 989 TFLOPS dense — 1,979 is the sparse
-- figure —, 80 GB HBM3, NVLink 4 at 900 GB/s per GPU, both directions together); NDR InfiniBand
-- 400 Gb/s = 50 GB/s per direction.
-- Latencies and efficiencies are assumptions: ~3 µs per NVLink collective step, 5 µs over
-- InfiniBand; training GEMMs reach ~55% of peak, NCCL's bus bandwidth ~80% of the link.
return {
  name = "8x H100-80G SXM per node, InfiniBand NDR 400 Gb/s per GPU",
  gpus_per_node = 8,
  device_memory_gb = 80,
  peak_tflops = 989,
  intra_node = { bandwidth_gbs = 450, latency_us = 3 },
  inter_node = { bandwidth_gbs = 50, latency_us = 5 },
  efficiency = { compute = 0.55, comm = 0.8 },
}
