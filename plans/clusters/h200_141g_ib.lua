-- 8 × NVIDIA H200 141GB SXM per node (HGX H200), nodes joined by InfiniBand NDR, one
-- 400 Gb/s adapter per GPU.
-- Figures: NVIDIA H200 data sheet (BF16 tensor core 989 TFLOPS dense, as the H100; 141 GB HBM3e;
-- NVLink 4 at 900 GB/s per GPU, both directions together); NDR 400 Gb/s = 50 GB/s per direction.
-- Latencies and efficiencies are assumptions, as for the H100 file; the faster memory
-- (4.8 TB/s against 3.35) is not modelled.
return {
  name = "8x H200-141G SXM per node, InfiniBand NDR 400 Gb/s per GPU",
  gpus_per_node = 8,
  device_memory_gb = 141,
  peak_tflops = 989,
  intra_node = { bandwidth_gbs = 450, latency_us = 3 },
  inter_node = { bandwidth_gbs = 50, latency_us = 5 },
  efficiency = { compute = 0.55, comm = 0.8 },
}
