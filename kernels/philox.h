/* Philox4x32-10, the counter-based generator of Random123 and cuRAND, header-only so that host
 * C code and CUDA kernels compute bitwise the same numbers. Every random number tycho uses is a
 * pure function of (seed, stream coordinates, element index) — never of rank or of call order —
 * so a rank holding a slice of a tensor draws exactly the serial run's values for that slice
 * (docs/design.md, "Randomness"). Key = (seed low 32 bits, seed high 32 bits). */
#ifndef TYCHO_PHILOX_H
#define TYCHO_PHILOX_H
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define TYCHO_HD __host__ __device__
#else
#define TYCHO_HD
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* One Philox block: 4 random words from a 128-bit counter and a 64-bit key. */
TYCHO_HD static inline void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                          uint32_t out[4])
{
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    if (round > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Uniform float in [0, 1) with 24 random bits: word (elem % 4) of the block with counter
 * (elem / 4, c1, c2, c3). Only the low 32 bits of elem / 4 enter the counter, so indices are
 * distinct up to elem < 2^34 (16 G elements per (c1, c2, c3)); beyond that they repeat — give
 * larger tensors another c1..c3 per 2^34 elements. */
TYCHO_HD static inline float philox_uniform(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t c3,
                                            uint64_t elem)
{
  const uint32_t ctr[4] = { (uint32_t)(elem >> 2), c1, c2, c3 };
  const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
  uint32_t out[4];
  philox4x32_10(ctr, key, out);
  return (float)(out[elem & 3] >> 8) * (1.0f / 16777216.0f);
}

/* The uniform attention's dropout compares with p for sample b's (c2) query head h, row i,
 * key j: element (h·T + i)·T + j of the sample's (NH, T, T) block at offset first — the number
 * dropout_mask draws for that element, so a kernel draws it where it needs it and keeps no mask. */
TYCHO_HD static inline float attention_drop_u(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t c3,
                                              uint64_t first, int h, int i, int j, int T)
{
  return philox_uniform(seed, c1, c2, c3, first + ((uint64_t)h * T + i) * T + j);
}

/* Standard normal float by Box–Muller in double: element elem uses block elem / 2 (counter
 * (block low 32, block high 32, stream_lo, stream_hi)) and its words w = 2·(elem % 2), w + 1:
 * u1 = (word_w + 1) / 2^32 in (0, 1], u2 = word_{w+1} / 2^32, z = sqrt(−2 ln u1) · cos(2π u2).
 * The full 64-bit elem is used. */
TYCHO_HD static inline float philox_normal(uint64_t seed, uint32_t stream_lo, uint32_t stream_hi,
                                           uint64_t elem)
{
  const uint64_t block = elem >> 1;
  const uint32_t ctr[4] = { (uint32_t)block, (uint32_t)(block >> 32), stream_lo, stream_hi };
  const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
  uint32_t out[4];
  philox4x32_10(ctr, key, out);
  const int w = 2 * (int)(elem & 1);
  const double u1 = ((double)out[w] + 1.0) * (1.0 / 4294967296.0);
  const double u2 = (double)out[w + 1] * (1.0 / 4294967296.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));
}

#endif
