/* Block reductions of a fixed shape, shared by the CUDA kernels (the .cu files here): a block of
 * THREADS threads (blockDim.x == THREADS), every thread passing its partial and getting the
 * block's result. The tree is fixed (thread t with t + s, s halving from THREADS / 2), so the
 * order of the additions depends on THREADS only, never on the launch; `sh` has THREADS
 * elements of shared memory, free again on return.
 *
 * Also the grid of the row-wise element kernels (ROW_LOOP): rows on y, columns on x, both 32-bit,
 * so an element's row and column come without a 64-bit division (tens of instructions each on
 * the GPU, more than the element's own arithmetic in SwiGLU or a loss's backward). */
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

/* Row r, column c of a (rows, cols) array, each pair once: rows strided over the grid's y
 * (at most 65535 blocks there), one column per thread of x, which row_grid makes cover cols
 * (the inner `for` runs once or not at all; no stride that could pass INT_MAX). */
#define ROW_LOOP(r, c, rows, cols)                                                   \
  for (int r = (int)blockIdx.y; r < (rows); r += (int)gridDim.y)                     \
    for (int c = (int)(blockIdx.x * blockDim.x + threadIdx.x); c < (cols); c = (cols))

/* The grid for ROW_LOOP with `threads` threads a block. */
static inline dim3 row_grid(int rows, int cols, unsigned threads)
{
  const unsigned x = (unsigned)(((long long)cols + threads - 1) / threads);
  const unsigned y = rows > 65535 ? 65535u : (unsigned)rows;
  return dim3(x ? x : 1u, y ? y : 1u);
}

#endif
