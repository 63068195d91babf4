/* The fuzz drivers' deterministic random numbers: Philox4x32-10 keyed by the run's seed, its
 * counter advanced once per four numbers, and a stream word of the including driver's own
 * (FUZZ_RNG_STREAM, defined before this header) so that no two drivers draw the same numbers. */
#ifndef TYCHO_FUZZ_RNG_H
#define TYCHO_FUZZ_RNG_H
#include <stdint.h>

#include "philox.h"

struct rng { uint64_t seed, counter; uint32_t out[4]; int left; };

static inline uint32_t rng_next(struct rng *r)
{
  if (!r->left) {
    const uint32_t ctr[4] = { (uint32_t)r->counter, (uint32_t)(r->counter >> 32), FUZZ_RNG_STREAM, 0 };
    const uint32_t key[2] = { (uint32_t)r->seed, (uint32_t)(r->seed >> 32) };
    philox4x32_10(ctr, key, r->out);
    r->counter++;
    r->left = 4;
  }
  return r->out[--r->left];
}

/* Uniform enough in [0, n) for mutation choices; 0 when n is 0. */
static inline uint32_t rng_below(struct rng *r, uint32_t n) { return n ? rng_next(r) % n : 0; }

#endif
