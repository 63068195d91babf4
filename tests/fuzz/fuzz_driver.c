/* main() for fuzz_safetensors.c where libFuzzer is unavailable (gcc): builds a few valid seed
 * images in memory, checks that they parse, then feeds LLVMFuzzerTestOneInput deterministic
 * mutations of them: bit flips, byte replacements (often with JSON punctuation), insertions,
 * deletions, truncations and header-length changes. Each input sits in a buffer of exactly its
 * size, so the sanitizers catch any read past the end. Usage: fuzz_safetensors [iterations [seed]]. */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seed { uint8_t *bytes; size_t n; };

static struct seed image(const char *header, size_t data_bytes)
{
  struct seed s;
  uint64_t n = strlen(header);
  s.n = 8 + n + data_bytes;
  s.bytes = malloc(s.n);
  memcpy(s.bytes, &n, 8);
  memcpy(s.bytes + 8, header, n);
  for (size_t k = 0; k < data_bytes; k++) s.bytes[8 + n + k] = (uint8_t)(k * 37 + 11);
  return s;
}

static struct seed text(const char *json)
{
  struct seed s = { (uint8_t *)strdup(json), strlen(json) };
  return s;
}

/* The writer's own output, read back from a temporary file. */
static struct seed written(void)
{
  char path[] = "/tmp/fuzz_safetensors.XXXXXX";
  struct seed s = { NULL, 0 };
  real a[6] = { 1, -2, 3.5f, 0, 1e-40f, 7 };
  struct st_write_tensor w[] = { { "model.embed_tokens.weight", 2, {2, 3}, a },
                                 { "norm\"\\x", 1, {2}, a }, { "s", 0, {0}, a } };
  char err[256];
  int fd = mkstemp(path);
  if (fd < 0) return s;
  close(fd);
  if (st_write_f32(path, w, 3, err, sizeof err) == 0) {
    FILE *fp = fopen(path, "rb");
    s.bytes = malloc(4096);
    s.n = fread(s.bytes, 1, 4096, fp);
    fclose(fp);
  } else {
    fprintf(stderr, "%s\n", err);
  }
  unlink(path);
  return s;
}

#define FUZZ_RNG_STREAM 0x66757a7aU /* "fuzz" */
#include "fuzz_rng.h"

static const char interesting[] = "{}[],:\"\\u0123456789-.eE+ ntfa\x00\xff\x80\xc3\xed\xf4";

/* Apply one mutation to buf[0, *n) (capacity cap). */
static void mutate(struct rng *r, uint8_t *buf, size_t *n, size_t cap)
{
  uint64_t len;
  size_t at = *n ? rng_below(r, (uint32_t)*n) : 0;
  switch (rng_below(r, 8)) {
  case 0: if (*n) buf[at] ^= (uint8_t)(1u << rng_below(r, 8)); break;
  case 1: if (*n) buf[at] = (uint8_t)rng_next(r); break;
  case 2: if (*n) buf[at] = (uint8_t)interesting[rng_below(r, sizeof interesting - 1)]; break;
  case 3: /* truncate, often ending on a byte that starts something (end-of-input paths) */
    *n = rng_below(r, (uint32_t)*n + 1);
    if (*n && rng_below(r, 2)) buf[*n - 1] = (uint8_t)interesting[rng_below(r, sizeof interesting - 1)];
    break;
  case 4: /* change the header length a little, or to anything */
    if (*n < 8) break;
    memcpy(&len, buf, 8);
    if (rng_below(r, 4) == 0) len = ((uint64_t)rng_next(r) << 32 | rng_next(r)) >> rng_below(r, 64);
    else len += (uint64_t)(int64_t)((int)rng_below(r, 33) - 16);
    memcpy(buf, &len, 8);
    break;
  case 5: /* insert a byte */
    if (*n < cap) {
      memmove(buf + at + 1, buf + at, *n - at);
      buf[at] = (uint8_t)interesting[rng_below(r, sizeof interesting - 1)];
      (*n)++;
    }
    break;
  case 6: /* delete a run */
    if (*n) {
      size_t k = 1 + rng_below(r, 8);
      if (k > *n - at) k = *n - at;
      memmove(buf + at, buf + at + k, *n - at - k);
      *n -= k;
    }
    break;
  default: /* copy a run from elsewhere over this spot */
    if (*n) {
      size_t from = rng_below(r, (uint32_t)*n), k = 1 + rng_below(r, 16);
      if (k > *n - from) k = *n - from;
      if (k > *n - at) k = *n - at;
      memmove(buf + at, buf + from, k);
    }
  }
}

int main(int argc, char **argv)
{
  long iterations = argc > 1 ? atol(argv[1]) : 20000;
  uint64_t rng_seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 20240520;
  struct seed seeds[] = {
    image("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],"
          "\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":"
          "[16,28]}}       ", 28),
    image("{\"h\\u00e9\\ud83d\\ude00\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
          "\"bf\":{\"shape\":[1,3],\"dtype\":\"BF16\",\"data_offsets\":[8,14]},\"__metadata__\":"
          "{\"k\\n\":\"v\\\"\\\\\\/\"}}", 14),
    image("{\"i\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},\"z\":{\"dtype\":\"U8\","
          "\"shape\":[0,7],\"data_offsets\":[8,8]},\"d\":{\"dtype\":\"F64\",\"shape\":[1],"
          "\"data_offsets\":[16,24]},\"e\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":"
          "[30,31]}}", 31),
    text("{\"metadata\":{\"total_size\":28,\"x\":[null,true,false,-1.5e-3,0.25E+2,{\"y\":[]}]},"
         "\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":"
         "\"model-00002-of-00002.safetensors\",\"c\\u0041\":\"sub/x.safetensors\"}}"),
    written(),
  };
  int n_seeds = (int)(sizeof seeds / sizeof seeds[0]);
  size_t cap = 0;
  char err[256];
  for (int s = 0; s < n_seeds; s++) {
    struct st_file f;
    struct st_index ix;
    if (!seeds[s].bytes) { fprintf(stderr, "seed %d: could not be built\n", s); return 1; }
    if (seeds[s].n > cap) cap = seeds[s].n;
    int is_image = s != 3; /* seed 3 is index JSON */
    if (is_image && st_parse(&f, seeds[s].bytes, seeds[s].n, "seed", err, sizeof err) != 0) {
      fprintf(stderr, "seed %d does not parse: %s\n", s, err);
      return 1;
    }
    if (is_image) st_close(&f);
    else if (st_index_parse(&ix, (const char *)seeds[s].bytes, seeds[s].n, "seed", err, sizeof err)) {
      fprintf(stderr, "seed %d does not parse: %s\n", s, err);
      return 1;
    } else {
      st_index_close(&ix);
    }
    LLVMFuzzerTestOneInput(seeds[s].bytes, seeds[s].n);
  }
  cap += 64;
  uint8_t *work = malloc(cap);
  struct rng r = { rng_seed, 0, {0}, 0 };
  long accepted = 0;
  for (long it = 0; it < iterations; it++) {
    const struct seed *s = &seeds[rng_below(&r, (uint32_t)n_seeds)];
    size_t n = s->n;
    memcpy(work, s->bytes, n);
    int n_mutations = 1 + (int)rng_below(&r, 4);
    for (int m = 0; m < n_mutations; m++) mutate(&r, work, &n, cap);
    uint8_t *input = malloc(n ? n : 1); /* exactly n bytes: overreads are caught */
    memcpy(input, work, n);
    struct st_file f;
    if (st_parse(&f, input, n, "m", err, sizeof err) == 0) { accepted++; st_close(&f); }
    LLVMFuzzerTestOneInput(input, n);
    free(input);
  }
  printf("fuzz_safetensors: %ld mutated inputs, %ld still valid images, no crash\n", iterations,
         accepted);
  free(work);
  for (int s = 0; s < n_seeds; s++) free(seeds[s].bytes);
  return 0;
}
