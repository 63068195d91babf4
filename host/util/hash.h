/* FNV-1a 64, the one string hash of tycho: parameter names → Philox streams (DESIGN 3.4). */
#ifndef TYCHO_UTIL_HASH_H
#define TYCHO_UTIL_HASH_H
#include <stdint.h>

static inline uint64_t hash_fnv1a64(const char *s)
{
  uint64_t h = 0xcbf29ce484222325ull; /* the 64-bit offset basis, 14695981039346656037 */
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ull; /* prime 0x100000001b3 */
  }
  return h;
}

#endif
