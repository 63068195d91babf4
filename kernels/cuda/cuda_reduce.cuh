/* Block reductions of a fixed shape, shared by the CUDA kernels (the .cu files here): a block of
 * THREADS threads (blockDim.x == THREADS), every thread passing its partial and getting the
 * block's result. The tree is fixed (thread t with t + s, s halving from THREADS / 2), so the
 * order of the additions depends on THREADS only, never on the launch; `sh` has THREADS
 * elements of shared memory, free again on return. */
#ifndef TYCHO_KERNELS_CUDA_REDUCE_CUH
#define TYCHO_KERNELS_CUDA_REDUCE_CUH

/* The largest of the partials (exact in any order; a NaN partial is passed over as the CPU's
 * `l > max ? l : max` passes it). */
template <int THREADS>
__device__ static inline float block_max(float v, float *sh)
{
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) {
      const float o = sh[threadIdx.x + s];
      sh[threadIdx.x] = o > sh[threadIdx.x] ? o : sh[threadIdx.x];
    }
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

/* Σ of the partials, in double. */
template <int THREADS>
__device__ static inline double block_sum(double v, double *sh)
{
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s)
      sh[threadIdx.x] = sh[threadIdx.x] + sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

#endif
