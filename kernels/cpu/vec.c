/* The vector layer's dispatch (vec.h): which path the kernels take, chosen once from the CPU
 * and TYCHO_SIMD. This file is built with the program's flags (no ISA flags), so it runs on any
 * x86-64; only the paths it picks use AVX2 or AVX-512. */
#include "vec.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"

static const char *const isa_names[VEC_N_ISAS] = { "scalar", "avx2", "avx512" };

static atomic_int chosen = -1;   /* an enum vec_isa once made */
static atomic_flag said = ATOMIC_FLAG_INIT; /* the TYCHO_SIMD refusal printed once */

const char *vec_isa_name(enum vec_isa isa)
{
  return (unsigned)isa < VEC_N_ISAS ? isa_names[isa] : "?";
}

int vec_supported(enum vec_isa isa)
{
  switch (isa) {
  case VEC_SCALAR:
    return 1;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  case VEC_AVX2:
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  case VEC_AVX512:
    __builtin_cpu_init(); /* the features count only where the OS saves their registers */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("fma");
#endif
  default:
    return 0;
  }
}

const struct vec_ops *vec_ops_of(enum vec_isa isa)
{
  if (isa == VEC_SCALAR || !vec_supported(isa))
    return NULL;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return isa == VEC_AVX512 ? &vec_ops_avx512 : &vec_ops_avx2;
#else
  return NULL;
#endif
}

static enum vec_isa widest(void)
{
  return vec_supported(VEC_AVX512) ? VEC_AVX512 : vec_supported(VEC_AVX2) ? VEC_AVX2 : VEC_SCALAR;
}

static enum vec_isa choose(void)
{
  const enum vec_isa best = widest();
  const char *env = getenv("TYCHO_SIMD");
  if (!env || !*env)
    return best;
  for (int i = 0; i < VEC_N_ISAS; i++)
    if (strcmp(env, isa_names[i]) == 0) {
      if (vec_supported((enum vec_isa)i))
        return (enum vec_isa)i;
      if (!atomic_flag_test_and_set(&said))
        fprintf(stderr, "tycho: TYCHO_SIMD=%s: this CPU lacks %s; the kernels use %s\n", env,
                i == VEC_AVX2 ? "AVX2 and FMA" : "AVX-512 (F, DQ, BW, VL) with FMA",
                isa_names[best]);
      return best;
    }
  if (!atomic_flag_test_and_set(&said))
    fprintf(stderr, "tycho: TYCHO_SIMD=%s: not one of scalar, avx2, avx512; the kernels use %s\n",
            env, isa_names[best]);
  return best;
}

enum vec_isa vec_current(void)
{
  int c = atomic_load_explicit(&chosen, memory_order_acquire);
  if (c < 0) {
    int expected = -1, mine = (int)choose();
    c = atomic_compare_exchange_strong(&chosen, &expected, mine) ? mine : expected;
  }
  return (enum vec_isa)c;
}

const struct vec_ops *vec_active(void)
{
  const enum vec_isa isa = vec_current(); /* supported: choose and vec_select see to it */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (isa != VEC_SCALAR)
    return isa == VEC_AVX512 ? &vec_ops_avx512 : &vec_ops_avx2;
#endif
  (void)isa;
  return NULL;
}

int vec_select(enum vec_isa isa)
{
  if ((unsigned)isa >= VEC_N_ISAS || !vec_supported(isa))
    return -1;
  atomic_store_explicit(&chosen, (int)isa, memory_order_release);
  return 0;
}

void vec_dropout_stream(struct vec_dropout *d, uint64_t seed, uint32_t c1, uint32_t c2,
                        uint32_t c3, float p, float keep)
{
  d->c1 = c1;
  d->c2 = c2;
  d->c3 = c3;
  d->p = p;
  d->keep = keep;
  for (uint32_t r = 0; r < 10; r++) { /* philox4x32_10's key, round by round */
    d->k0[r] = (uint32_t)seed + r * PHILOX_W0;
    d->k1[r] = (uint32_t)(seed >> 32) + r * PHILOX_W1;
  }
}
