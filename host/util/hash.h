/* FNV-1a 64, the one string hash of tycho: parameter names → Philox streams (docs/design.md,
 * "Randomness"). */
#ifndef TYCHO_UTIL_HASH_H
#define TYCHO_UTIL_HASH_H
#include <stdint.h>

#include <stddef.h>

/* FNV-1a 64 of n bytes. */
static inline uint64_t hash_fnv1a64_bytes(const void *data, size_t n)
{
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull; /* the 64-bit offset basis, 14695981039346656037 */
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull; /* prime 0x100000001b3 */
  }
  return h;
}

/* FNV-1a 64 of a NUL-terminated string. */
static inline uint64_t hash_fnv1a64(const char *s)
{
  size_t n = 0;
  while (s[n])
    n++;
  return hash_fnv1a64_bytes(s, n);
}

#endif
