/* Philox4x32-10 and the random streams built on it: the generator matches Random123's
 * known-answer vectors bit for bit (so the CUDA side, using the same header, draws the same
 * numbers), the uniform and normal streams have the stated mapping and the right statistics,
 * and dropout masks are a function of the element index alone (a slice computed on its own
 * equals that slice of the whole). */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "kernels.h"
#include "philox.h"

static void philox_matches_random123_known_answers(void)
{
  static const struct { uint32_t ctr[4], key[2], expect[4]; } kat[] = {
    { { 0, 0, 0, 0 }, { 0, 0 }, { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 } },
    { { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff }, { 0xffffffff, 0xffffffff },
      { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd } },
    { { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 }, { 0xa4093822, 0x299f31d0 },
      { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 } },
  };
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    philox4x32_10(kat[i].ctr, kat[i].key, out);
    for (int w = 0; w < 4; w++)
      CHECK_MSG(out[w] == kat[i].expect[w], "vector %d word %d: %08x, expected %08x", i, w,
                (unsigned)out[w], (unsigned)kat[i].expect[w]);
  }
}

static void uniform_takes_word_elem_mod_4_of_block_elem_div_4(void)
{
  const uint64_t seed = 0x299f31d0a4093822ull; /* key = (a4093822, 299f31d0) */
  const uint64_t elems[] = { 0, 1, 2, 3, 4, 7, 4ull * 0x243f6a88 + 2, (1ull << 34) - 1 };
  for (size_t e = 0; e < sizeof elems / sizeof elems[0]; e++) {
    uint64_t elem = elems[e];
    uint32_t ctr[4] = { (uint32_t)(elem / 4), 0x85a308d3, 0x13198a2e, 0x03707344 };
    uint32_t key[2] = { 0xa4093822, 0x299f31d0 }, out[4];
    philox4x32_10(ctr, key, out);
    float expect = (float)(out[elem % 4] >> 8) / 16777216.0f;
    CHECK(philox_uniform(seed, 0x85a308d3, 0x13198a2e, 0x03707344, elem) == expect);
  }
  /* The third known-answer block, word 0: d16cfe09 >> 8 = 0xd16cfe. */
  CHECK(philox_uniform(seed, 0x85a308d3, 0x13198a2e, 0x03707344, 4ull * 0x243f6a88)
        == (float)0xd16cfe / 16777216.0f);
}

static void uniform_is_in_unit_interval_with_mean_one_half(void)
{
  const int n = 100000;
  double sum = 0.0;
  int in_range = 1;
  for (int i = 0; i < n; i++) {
    float u = philox_uniform(42, 1, 2, 3, (uint64_t)i);
    in_range &= u >= 0.0f && u < 1.0f;
    sum += u;
  }
  CHECK(in_range);
  CHECK_NEAR(sum / n, 0.5, 0.005); /* standard error 0.0009 */
}

static void normal_uses_block_elem_div_2_and_full_64_bit_index(void)
{
  const uint64_t elems[] = { 0, 1, 2, 3, 12345, (1ull << 33) + 1, (3ull << 40) + 6 };
  for (size_t e = 0; e < sizeof elems / sizeof elems[0]; e++) {
    uint64_t elem = elems[e], block = elem / 2;
    uint32_t ctr[4] = { (uint32_t)block, (uint32_t)(block >> 32), 77, 88 };
    uint32_t key[2] = { 5, 6 }, out[4];
    philox4x32_10(ctr, key, out);
    int w = 2 * (int)(elem % 2);
    double u1 = ((double)out[w] + 1.0) / 4294967296.0, u2 = out[w + 1] / 4294967296.0;
    float expect = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
    CHECK(philox_normal(5 | (6ull << 32), 77, 88, elem) == expect);
  }
  /* Elements 2^32 blocks apart differ: the high half of the index is used. */
  CHECK(philox_normal(1, 2, 3, 10) != philox_normal(1, 2, 3, 10 + (2ull << 32)));
}

static void normal_has_mean_zero_variance_one(void)
{
  const int n = 100000;
  double sum = 0.0, sum2 = 0.0;
  int beyond_2sigma = 0;
  for (int i = 0; i < n; i++) {
    double z = philox_normal(1234, 0xabcdef, 7, (uint64_t)i);
    sum += z;
    sum2 += z * z;
    beyond_2sigma += fabs(z) > 2.0;
  }
  double mean = sum / n, var = sum2 / n - mean * mean;
  CHECK_NEAR(mean, 0.0, 0.02);                      /* standard error 0.003 */
  CHECK_NEAR(var, 1.0, 0.03);                       /* standard error 0.0045 */
  CHECK_NEAR((double)beyond_2sigma / n, 0.0455, 0.005); /* P(|z| > 2), s.e. 0.0007 */
  /* Different streams give different numbers. */
  CHECK(philox_normal(1234, 0xabcdef, 7, 0) != philox_normal(1234, 0xabcdef, 8, 0));
}

static void dropout_mask_keeps_one_minus_p_scaled(void)
{
  const size_t n = 100000;
  const float p = 0.1f;
  const real keep = (real)1 / (1 - (real)p);
  real *mask = malloc(n * sizeof(real)), *again = malloc(n * sizeof(real));
  dropout_mask(mask, n, p, 99, 1, 2, 3, 0);
  size_t kept = 0, bad = 0;
  for (size_t i = 0; i < n; i++) {
    kept += mask[i] == keep;
    bad += mask[i] != keep && mask[i] != 0.0f;
  }
  CHECK(bad == 0);
  CHECK_NEAR((double)kept / n, 1.0 - p, 0.006); /* standard error 0.001 */
  dropout_mask(again, n, p, 99, 1, 2, 3, 0);
  CHECK(memcmp(mask, again, n * sizeof(real)) == 0);
  dropout_mask(again, n, p, 99, 1, 2, 4, 0);
  CHECK(memcmp(mask, again, n * sizeof(real)) != 0);
  dropout_mask(again, n, p, 100, 1, 2, 3, 0);
  CHECK(memcmp(mask, again, n * sizeof(real)) != 0);
  dropout_mask(again, n, 0.0f, 99, 1, 2, 3, 0);
  size_t ones = 0;
  for (size_t i = 0; i < n; i++) ones += again[i] == 1.0f;
  CHECK(ones == n);
  free(mask);
  free(again);
}

static void dropout_mask_of_a_slice_equals_slice_of_full_mask(void)
{
  const size_t n = 50000, a = 12345, b = 31001; /* a not a multiple of 4: starts mid-block */
  real *full = malloc(n * sizeof(real)), *part = malloc((b - a) * sizeof(real));
  dropout_mask(full, n, 0.3f, 7, 11, 12, 13, 0);
  dropout_mask(part, b - a, 0.3f, 7, 11, 12, 13, a);
  CHECK(memcmp(full + a, part, (b - a) * sizeof(real)) == 0);
  free(full);
  free(part);
}

TEST_MAIN(TEST(philox_matches_random123_known_answers),
          TEST(uniform_takes_word_elem_mod_4_of_block_elem_div_4),
          TEST(uniform_is_in_unit_interval_with_mean_one_half),
          TEST(normal_uses_block_elem_div_2_and_full_64_bit_index),
          TEST(normal_has_mean_zero_variance_one),
          TEST(dropout_mask_keeps_one_minus_p_scaled),
          TEST(dropout_mask_of_a_slice_equals_slice_of_full_mask))
