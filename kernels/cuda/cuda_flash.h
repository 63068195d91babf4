/* The flash-style attention's shared pieces on the CUDA backend (cuda_dense.cu's whole-sequence
 * kernels and cuda_attention_cp.cu's context-parallel blocks): the tile configurations, the
 * dropout as the kernels take it, the tile loads and the score products, and the launch helpers.
 * Both files form every score with tile_dots and draw every mask with att_mask, so a block's
 * numbers are the whole-sequence kernel's formulas (cuda_dense.cu's header explains the tiles). */
#ifndef TYCHO_KERNELS_CUDA_FLASH_H
#define TYCHO_KERNELS_CUDA_FLASH_H
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda_backend.h"
#include "../philox.h"

enum { ATT_THREADS = 256, ATT_WARPS = ATT_THREADS / 32 };

/* A tile configuration, chosen from HS alone (flash_cfg_of): BR query rows per query tile and
 * BR keys per key tile, NJ chunks of 16 head dimensions per thread (16 · NJ ≥ HS). Shared tiles
 * of head-dimension rows are LD = 16 · NJ + 1 floats apart (odd: a column walk meets 16
 * different banks), zero from column HS on; score tiles are SL = BR + 1 apart. */
template <int BR, int NJ>
struct flash_cfg {
  static constexpr int W = 16 * NJ, LD = W + 1, SL = BR + 1;
  /* dynamic shared memory per block, in bytes (the launch opts in above 48 KiB) */
  static constexpr size_t fwd_bytes = sizeof(double) * BR + sizeof(float) * (3 * BR * LD + BR * SL + 2 * BR);
  static constexpr size_t dkv_bytes = sizeof(float) * (4 * BR * LD + 2 * BR * SL + 2 * BR);
  static constexpr size_t dq_bytes = sizeof(float) * (4 * BR * LD + BR * SL + 2 * BR);
};
/* Bytes per block (forward, dkv, dq): HS ≤ 32 (64, 2): 43008, 67584, 50944; HS ≤ 64 (64, 4):
 * 67584, 100352, 83712; HS ≤ 128 (64, 8): 116736, 165888, 149248; HS ≤ 256 (32, 16): 103424,
 * 140288, 136064. The largest, 162 KiB, is under the 227 KiB a Hopper block may opt in to (one
 * block per SM then), so no configuration depends on the device. */
static_assert(flash_cfg<64, 8>::dkv_bytes <= 227 * 1024 && flash_cfg<32, 16>::dkv_bytes <= 227 * 1024 &&
                  flash_cfg<64, 8>::fwd_bytes <= 227 * 1024 && flash_cfg<64, 8>::dq_bytes <= 227 * 1024,
              "attention tiles over the shared memory a block may have");

/* The dropout as the kernels take it, by value: c2 is one sample's, so a launch with dropout
 * covers one sample (on 0: none, one launch covers every sample). */
struct att_drop {
  int on;
  float p, keep;
  uint64_t seed, first;
  uint32_t c1, c2, c3;
};

/* M_ij: 0 or 1/(1 − p), from the number dropout_mask draws for that element (philox.h). */
__device__ static inline float att_mask(const struct att_drop &dr, int h, int i, int j, int T)
{
  return attention_drop_u(dr.seed, dr.c1, dr.c2, dr.c3, dr.first, h, i, j, T) < dr.p ? 0.0f : dr.keep;
}

/* Rows [r0, r0 + BR) of an operand whose row t (this head's) starts at base + t · ld, HS wide,
 * into a BR × LD shared tile; zeros for rows ≥ T and columns in [HS, W). */
template <int BR, int W, int LD>
__device__ static inline void load_tile(float *dst, const real *base, size_t ld, int r0, int T, int HS)
{
  for (int e = threadIdx.x; e < BR * W; e += ATT_THREADS) {
    const int r = e / W, d = e % W, t = r0 + r;
    dst[r * LD + d] = t < T && d < HS ? base[(size_t)t * ld + d] : 0.0f;
  }
}

/* acc[i][jj] = Σ_d A[r][d] · Bm[c][d], d = 0 .. HS − 1 in order, for the thread's rows
 * r = ty + 16 i and columns c = tx + 16 jj of a BR × BR tile. The same code forms every score
 * in forward and backward, so a score is the same number wherever it is recomputed. */
template <int BR, int LD>
__device__ static inline void tile_dots(float (&acc)[BR / 16][BR / 16], const float *A, const float *Bm, int HS,
                                        int tx, int ty)
{
  constexpr int RI = BR / 16;
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < RI; jj++) acc[i][jj] = 0.0f;
  for (int d = 0; d < HS; d++) {
    float a[RI], bb[RI];
#pragma unroll
    for (int i = 0; i < RI; i++) a[i] = A[(ty + 16 * i) * LD + d];
#pragma unroll
    for (int jj = 0; jj < RI; jj++) bb[jj] = Bm[(tx + 16 * jj) * LD + d];
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
      for (int jj = 0; jj < RI; jj++) acc[i][jj] += a[i] * bb[jj];
  }
}

/* The dropout as the kernels take it (c2 filled per sample at launch). */
static inline struct att_drop att_drop_of(const struct attention_dropout *drop)
{
  struct att_drop dr;
  memset(&dr, 0, sizeof dr);
  if (!drop || !(drop->p > 0.0f))
    return dr;
  dr.on = 1;
  dr.p = drop->p;
  dr.keep = drop->p < 1.0f ? 1.0f / (1.0f - drop->p) : 0.0f; /* dropout_mask's keep_scale */
  dr.seed = drop->seed, dr.first = drop->first, dr.c1 = drop->c1, dr.c3 = drop->c3;
  return dr;
}

/* The tile configuration for a head size: BR = 64 rows with 16 · NJ ≥ HS up to 128, BR = 32 at
 * 256 (the shared tiles would not fit at 64); 0 over 256, recorded as the context's failure. */
enum { FLASH_MAX_HS = 256 };
static inline int flash_cfg_of(struct cuda_ctx *c, int HS)
{
  if (HS <= FLASH_MAX_HS)
    return HS <= 32 ? 32 : HS <= 64 ? 64 : HS <= 128 ? 128 : 256;
  char msg[128];
  snprintf(msg, sizeof msg, "head size %d: the CUDA attention takes at most %d", HS, FLASH_MAX_HS);
  cuda_record(c, __FILE__, __LINE__, "attention", msg);
  return 0;
}

/* Launches `launch(dr, b0, nb)` once for every sample (nb = B) without dropout, or once per
 * sample with its c2 (nb = 1); 0, or 1 after a failed launch. */
template <typename F>
static int per_sample(struct cuda_ctx *c, const struct attention_dropout *drop, int B, F launch)
{
  struct att_drop dr = att_drop_of(drop);
  if (!dr.on) {
    launch(dr, 0, B);
    return CUDA_LAUNCHED(c);
  }
  for (int b = 0; b < B; b++) {
    dr.c2 = drop->samples[b];
    launch(dr, b, 1);
    if (CUDA_LAUNCHED(c))
      return 1;
  }
  return 0;
}

#endif
