/* main() for fuzz_manifest.c where libFuzzer is unavailable (gcc): builds a few valid manifests
 * in memory (tensor-parallel column blocks, ZeRO ranges that start and end mid-row, vocabulary
 * padding rows, a vector, an empty tensor; checksums of the fuzz shards), checks that the reader
 * accepts them and every piece's bytes, then feeds LLVMFuzzerTestOneInput deterministic mutations
 * of them: numbers replaced by edge values (0, -1, 2^31, 2^32, 2^60, 2^62, 2^63 - 1, 2^64 and
 * neighbours) or nudged, objects (a tensor, a piece) repeated or dropped, and byte flips,
 * insertions, deletions and truncations. Each input sits in a buffer of exactly its size.
 * Usage: fuzz_manifest [iterations [seed]]. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/state/manifest.h"

#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_manifest.h"
#include "util/hash.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seed { uint8_t *bytes; size_t n; };

/* A piece of a seed: its file, block and range, for each kind (or one kind: kind >= 0). */
struct seed_piece { int file, r0, c0, rows, cols, lo, hi, kind; };
struct seed_tensor { const char *name; int n_dims, s0, s1, n_pieces; struct seed_piece p[6]; };

#define TEXT_CAP 32768

static struct seed manifest(const struct seed_tensor *t, int n_tensors, int n_files, int moe_keys)
{
  static const char *const kinds[3] = { "param", "exp_avg", "exp_avg_sq" };
  unsigned char shard[FUZZ_SHARD_BYTES];
  int64_t used[4] = { 0 };
  char *s = malloc(TEXT_CAP);
  size_t n = 0;
#define PUT(...) (n += (size_t)snprintf(s + n, TEXT_CAP - n, __VA_ARGS__))
  PUT("{\"format\":\"tycho-checkpoint\",\"version\":1,\"step\":7,\"plan_hash\":\"00ff\",\"plan\":\"f\\u00e9\","
      "\"model\":{\"n_layers\":1,\"dim\":8,\"n_heads\":2,\"n_kv_heads\":1,\"ffn_dim\":16,\"vocab\":5,"
      "\"tie_embeddings\":0%s},\"mesh\":{\"world\":%d,\"tp\":%d,\"pp\":1,\"dp\":1,\"zero\":1},"
      "\"state\":{\"windows_done\":28,\"recent_losses\":[1.5,2],\"skipped_in_a_row\":0},"
      "\"computes\":{\"seeds.model\":\"1\"},\"checksum\":\"fnv1a64\",\"files\":[",
      moe_keys ? ",\"moe_experts\":0,\"moe_ffn_dim\":0" : "", n_files, n_files);
  for (int f = 0; f < n_files; f++)
    PUT("%s\"rank_%05d.bin\"", f ? "," : "", f);
  PUT("],\"tensors\":[");
  for (int i = 0; i < n_tensors; i++) {
    PUT("%s{\"name\":\"%s\",\"dtype\":\"%s\",\"shape\":[%d", i ? "," : "", t[i].name, REAL_DTYPE, t[i].s0);
    if (t[i].n_dims == 2)
      PUT(",%d", t[i].s1);
    PUT("],\"pieces\":[");
    int first = 1;
    for (int kind = 0; kind < 3; kind++)
      for (int k = 0; k < t[i].n_pieces; k++) {
        const struct seed_piece *q = &t[i].p[k];
        if (q->kind >= 0 && q->kind != kind)
          continue;
        const int64_t bytes = (int64_t)(q->hi - q->lo) * (int64_t)sizeof(real), at = used[q->file];
        used[q->file] += bytes;
        if (used[q->file] > FUZZ_SHARD_BYTES) {
          fprintf(stderr, "fuzz_manifest: a seed needs more than %d bytes of shard %d\n", FUZZ_SHARD_BYTES, q->file);
          exit(1);
        }
        fuzz_manifest_shard(q->file, shard);
        PUT("%s{\"kind\":\"%s\",\"file\":%d,\"offset\":%" PRId64 ",\"block\":[%d,%d,%d,%d],\"range\":[%d,%d],"
            "\"fnv1a64\":\"%016" PRIx64 "\"}", first ? "" : ",", kinds[kind], q->file, at, q->r0, q->c0, q->rows,
            q->cols, q->lo, q->hi, hash_fnv1a64_bytes(shard + at, (size_t)bytes));
        first = 0;
      }
    PUT("]}");
  }
  PUT("]}\n");
#undef PUT
  struct seed out = { (uint8_t *)s, n };
  return out;
}

#define FUZZ_RNG_STREAM 0x6d616e69U /* "mani" */
#include "fuzz_rng.h"

static const char interesting[] = "{}[],:\"\\-0123456789eE. ntfu\x00\xff";
static const char *const numbers[] = {
  "0", "1", "2", "3", "4", "5", "6", "7", "8", "-1", "-8", "63", "64", "4095", "4096", "4097",
  "2147483647", "2147483648", "4294967295", "4294967296", "4611686018427387904", "1152921504606846975",
  "1152921504606846976", "1152921504606846977", "576460752303423488", "9223372036854775807",
  "9223372036854775800", "9223372036854775808", "18446744073709551615", "18446744073709551616",
  "99999999999999999999999", "1e3", "0.5", "-0", "00", "1.0",
};

/* [from, to) of the object whose '{' is at or after at, or 0 (none, or unbalanced). */
static int object_at(const uint8_t *b, size_t n, size_t at, size_t *from, size_t *to)
{
  while (at < n && b[at] != '{')
    at++;
  if (at >= n)
    return 0;
  int depth = 0, in_string = 0;
  for (size_t k = at; k < n; k++) {
    const uint8_t c = b[k];
    if (in_string) {
      if (c == '\\')
        k++;
      else if (c == '"')
        in_string = 0;
    } else if (c == '"') {
      in_string = 1;
    } else if (c == '{') {
      depth++;
    } else if (c == '}' && --depth == 0) {
      *from = at;
      *to = k + 1;
      return 1;
    }
  }
  return 0;
}

/* Replace [from, to) of buf[0, *n) (capacity cap) with rep[0, len). */
static void splice(uint8_t *buf, size_t *n, size_t cap, size_t from, size_t to, const void *rep, size_t len)
{
  if (*n - (to - from) + len > cap)
    return;
  memmove(buf + from + len, buf + to, *n - to);
  memcpy(buf + from, rep, len);
  *n = *n - (to - from) + len;
}

static void mutate(struct rng *r, uint8_t *buf, size_t *n, size_t cap)
{
  size_t at = *n ? rng_below(r, (uint32_t)*n) : 0, from, to;
  char num[48];
  switch (rng_below(r, 12)) {
  case 0: if (*n) buf[at] ^= (uint8_t)(1u << rng_below(r, 8)); break;
  case 1: if (*n) buf[at] = (uint8_t)interesting[rng_below(r, sizeof interesting - 1)]; break;
  case 2: /* truncate */
    *n = rng_below(r, (uint32_t)*n + 1);
    break;
  case 3: /* insert a byte */
    if (*n < cap) {
      memmove(buf + at + 1, buf + at, *n - at);
      buf[at] = (uint8_t)interesting[rng_below(r, sizeof interesting - 1)];
      (*n)++;
    }
    break;
  case 4: /* delete a run */
    if (*n) {
      size_t k = 1 + rng_below(r, 8);
      if (k > *n - at) k = *n - at;
      memmove(buf + at, buf + at + k, *n - at - k);
      *n -= k;
    }
    break;
  case 5: case 6: case 7: case 8: /* a number: an edge value, or nudged */
    while (at < *n && !(buf[at] >= '0' && buf[at] <= '9'))
      at++;
    if (at >= *n)
      break;
    from = at > 0 && buf[at - 1] == '-' ? at - 1 : at;
    to = at;
    while (to < *n && buf[to] >= '0' && buf[to] <= '9')
      to++;
    if (rng_below(r, 2)) {
      const char *v = numbers[rng_below(r, sizeof numbers / sizeof numbers[0])];
      splice(buf, n, cap, from, to, v, strlen(v));
    } else {
      char old[32];
      size_t len = to - from < sizeof old - 1 ? to - from : sizeof old - 1;
      memcpy(old, buf + from, len);
      old[len] = 0;
      long long v = strtoll(old, NULL, 10); /* saturates */
      v = v > LLONG_MAX - 8 ? LLONG_MAX - 8 : v < LLONG_MIN + 8 ? LLONG_MIN + 8 : v;
      v += (long long)rng_below(r, 17) - 8;
      splice(buf, n, cap, from, to, num, (size_t)snprintf(num, sizeof num, "%lld", v));
    }
    break;
  case 9: /* an object (a tensor, a piece, ...) repeated */
    if (object_at(buf, *n, at, &from, &to) && *n + (to - from) + 1 <= cap) {
      memmove(buf + to + 1 + (to - from), buf + to, *n - to);
      buf[to] = ',';
      memcpy(buf + to + 1, buf + from, to - from);
      *n += to - from + 1;
    }
    break;
  case 10: /* an object dropped, with the comma before it */
    if (object_at(buf, *n, at, &from, &to)) {
      if (from > 0 && buf[from - 1] == ',')
        from--;
      splice(buf, n, cap, from, to, "", 0);
    }
    break;
  default: /* copy a run from elsewhere over this spot */
    if (*n) {
      size_t src = rng_below(r, (uint32_t)*n), k = 1 + rng_below(r, 16);
      if (k > *n - src) k = *n - src;
      if (k > *n - at) k = *n - at;
      memmove(buf + at, buf + src, k);
    }
  }
}

/* The reader accepts the seed and every piece's bytes. */
static int seed_ok(const struct seed *s, int index)
{
  char err[512];
  struct manifest mf;
  char *text = malloc(s->n + 1);
  memcpy(text, s->bytes, s->n);
  text[s->n] = 0;
  if (manifest_parse(&mf, text, s->n, "seed", "seed/manifest.json", err, sizeof err)) {
    fprintf(stderr, "fuzz_manifest: seed %d is refused: %s\n", index, err);
    manifest_free(&mf);
    return 0;
  }
  static unsigned char shards[4][FUZZ_SHARD_BYTES];
  mf.in_memory = 1;
  for (int f = 0; f < mf.n_files && f < 4; f++) {
    fuzz_manifest_shard(f, shards[f]);
    mf.maps[f] = (struct manifest_map){ shards[f], FUZZ_SHARD_BYTES, 1 };
  }
  int ok = 1;
  for (int i = 0; ok && i < mf.n_tensors; i++)
    for (int k = 0; ok && k < mf.tensors[i].n_pieces; k++)
      if (!manifest_piece_data(&mf, &mf.tensors[i], &mf.tensors[i].pieces[k], err, sizeof err)) {
        fprintf(stderr, "fuzz_manifest: seed %d: %s\n", index, err);
        ok = 0;
      }
  manifest_free(&mf);
  return ok;
}

int main(int argc, char **argv)
{
  long iterations = argc > 1 ? atol(argv[1]) : 20000;
  uint64_t rng_seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 20240611;
  /* Tensor-parallel column blocks, one split into ZeRO ranges mid-row; a vocabulary-split tensor
   * whose last block has a padding row (one kind's range covering it); a vector in two ranges. */
  const struct seed_tensor a[] = {
    { "w", 2, 6, 8, 3, { { 0, 0, 0, 6, 4, 0, 24, -1 }, { 1, 0, 4, 6, 4, 0, 10, -1 }, { 0, 0, 4, 6, 4, 10, 24, -1 } } },
    { "model.embed_tokens.weight", 2, 5, 4, 3,
      { { 0, 0, 0, 3, 4, 0, 12, -1 }, { 1, 3, 0, 3, 4, 0, 8, -1 }, { 1, 3, 0, 3, 4, 8, 12, 2 } } },
    { "n", 1, 7, 1, 2, { { 1, 0, 0, 7, 1, 0, 3, -1 }, { 0, 0, 0, 7, 1, 3, 7, -1 } } },
  };
  /* Row blocks, the first in two ranges that meet mid-row; an empty tensor; one row per piece. */
  const struct seed_tensor b[] = {
    { "q", 2, 4, 6, 3, { { 0, 0, 0, 2, 6, 0, 5, -1 }, { 1, 0, 0, 2, 6, 5, 12, -1 }, { 2, 2, 0, 2, 6, 0, 12, -1 } } },
    { "empty", 2, 0, 3, 0, { { 0 } } },
    { "z", 2, 3, 3, 3, { { 0, 0, 0, 1, 3, 0, 3, -1 }, { 1, 1, 0, 1, 3, 0, 3, -1 }, { 2, 2, 0, 1, 3, 0, 3, -1 } } },
  };
  const struct seed_tensor c[] = { { "model.norm.weight", 1, 4, 1, 1, { { 0, 0, 0, 4, 1, 0, 4, -1 } } } };
  struct seed seeds[] = { manifest(a, 3, 2, 1), manifest(b, 3, 3, 1), manifest(c, 1, 1, 0) };
  const int n_seeds = (int)(sizeof seeds / sizeof seeds[0]);
  for (int s = 0; s < n_seeds; s++) {
    if (!seed_ok(&seeds[s], s))
      return 1;
    LLVMFuzzerTestOneInput(seeds[s].bytes, seeds[s].n);
  }
  uint8_t *work = malloc(TEXT_CAP);
  struct rng r = { rng_seed, 0, { 0 }, 0 };
  for (long it = 0; it < iterations; it++) {
    const struct seed *s = &seeds[rng_below(&r, (uint32_t)n_seeds)];
    size_t n = s->n;
    memcpy(work, s->bytes, n);
    const int n_mutations = 1 + (int)rng_below(&r, 4);
    for (int m = 0; m < n_mutations; m++)
      mutate(&r, work, &n, TEXT_CAP);
    uint8_t *input = malloc(n ? n : 1); /* exactly n bytes: overreads are caught */
    memcpy(input, work, n);
    LLVMFuzzerTestOneInput(input, n);
    free(input);
  }
  printf("fuzz_manifest: %ld mutated manifests, %ld still accepted, no crash and no broken promise\n",
         iterations, fuzz_manifest_accepted - n_seeds);
  free(work);
  for (int s = 0; s < n_seeds; s++)
    free(seeds[s].bytes);
  return 0;
}
