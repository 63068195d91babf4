-- 8 × NVIDIA A100 80GB SXM per node (a DGX A100 / HGX A100 layout), nodes joined by InfiniBand
-- HDR, one 200 Gb/s adapter per GPU.
-- Figures: NVIDIA A100 data sheet (BF16 tensor core 312 TFLOPS dense, 80 GB HBM2e, NVLink 3 at
-- 600 GB/s per GPU, both directions together); HDR InfiniBand 200 Gb/s = 25 GB/s per direction.
-- Latencies and efficiencies are assumptions, not measurements: about 3 µs for an NVLink hop and
-- 6 µs over InfiniBand for small collectives; training reaches ~60% of peak in its GEMMs (Megatron-LM
-- reported 52% of peak end to end for GPT-3 175B on A100s: Narayanan et al., SC 2021), NCCL's bus
-- bandwidth ~80% of the link.
return {
  name = "8x A100-80G SXM per node, InfiniBand HDR 200 Gb/s per GPU",
  gpus_per_node = 8,
  device_memory_gb = 80,
  peak_tflops = 312,
  intra_node = { bandwidth_gbs = 300, latency_us = 3 },
  inter_node = { bandwidth_gbs = 25, latency_us = 6 },
  efficiency = { compute = 0.6, comm = 0.8 },
}
