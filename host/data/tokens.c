/* Token files (llm.c, version 1 uint16 or 2 uint32, and raw uint16), memory-mapped, and the window contract: which tokens
 * window w holds, shuffled or not. The shuffle is a keyed permutation computed per window in
 * O(1) memory, so any rank can find any window without a shared index and a resumed run finds
 * the same windows from the step number alone. */
#define _POSIX_C_SOURCE 200809L
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/path.h"

#include "philox.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens.c assumes a little-endian host"
#endif

#define FEISTEL_ROUNDS 6


/* A file without the magic that is an llm.c header in all else: at least the header's 1024
 * bytes and either the count of header[2] tokens exactly after it, or a known version in
 * header[1] and zeros in the rest of the header. Raw tokens that happen to look like this are
 * an accepted corner (tokens.h). */
static int looks_like_llmc_header(const void *map, size_t n, const int32_t header[3])
{
  if (n < TOKENS_HEADER_BYTES)
    return 0;
  if (header[2] > 0 && (uint64_t)header[2] * (header[1] == TOKENS_VERSION_U32 ? 4 : 2) ==
                       n - TOKENS_HEADER_BYTES)
    return 1;
  if (header[1] != TOKENS_VERSION && header[1] != TOKENS_VERSION_U32)
    return 0;
  const unsigned char *b = map;
  for (size_t k = sizeof(int32_t) * 3; k < TOKENS_HEADER_BYTES; k++)
    if (b[k])
      return 0;
  return 1;
}

/* Check the header (llm.c) or the size (raw) and set format, tokens and n_tokens. */
static int tokens_layout(struct tokens_file *tf, char *err, size_t err_size)
{
  int32_t header[3] = { 0, 0, 0 };
  size_t n = tf->map_bytes;
  if (n >= sizeof header) memcpy(header, tf->map, sizeof header);
  if (header[0] == TOKENS_MAGIC) {
    tf->format = TOKENS_LLMC;
    if (n < TOKENS_HEADER_BYTES)
      return errf_input(err, err_size, "%s: %zu bytes, shorter than the %d-byte llm.c header",
                  tf->path, n, TOKENS_HEADER_BYTES);
    if (header[1] != TOKENS_VERSION && header[1] != TOKENS_VERSION_U32)
      return errf_input(err, err_size, "%s: llm.c header version %" PRId32 " (expected %d: uint16 "
                  "tokens, or %d: uint32 tokens)", tf->path, header[1], TOKENS_VERSION,
                  TOKENS_VERSION_U32);
    const uint64_t width = header[1] == TOKENS_VERSION_U32 ? 4 : 2, body = n - TOKENS_HEADER_BYTES;
    if (header[2] < 0 || (uint64_t)header[2] * width != body)
      return errf_input(err, err_size, "%s: header says %" PRId32 " tokens but the file holds %" PRIu64
                  " bytes of %s tokens after the header (%" PRIu64 " tokens%s)", tf->path,
                  header[2], body, width == 4 ? "uint32" : "uint16", body / width,
                  body % width ? " and stray bytes" : "");
    const void *body_at = (const char *)tf->map + TOKENS_HEADER_BYTES;
    if (width == 4) tf->tokens32 = body_at;
    else tf->tokens = body_at;
    tf->n_tokens = (uint64_t)header[2];
  } else if (looks_like_llmc_header(tf->map, n, header)) {
    return errf_input(err, err_size, "%s: a bad llm.c header: magic %" PRId32 " where llm.c writes %d "
                "(the rest is an llm.c header: version %" PRId32 ", %" PRId32 " tokens); a damaged "
                "file or another format", tf->path, header[0], TOKENS_MAGIC, header[1], header[2]);
  } else {
    tf->format = TOKENS_RAW;
    if (n % 2)
      return errf_input(err, err_size, "%s: %zu bytes is odd and the magic %d is absent: neither an "
                  "llm.c token file nor raw uint16 tokens", tf->path, n, TOKENS_MAGIC);
    tf->tokens = tf->map;
    tf->n_tokens = n / 2;
  }
  return 0;
}

/* Every token id must be < vocab: one pass for the maximum, a second only to name the culprit. */
static int tokens_check_vocab(const struct tokens_file *tf, int vocab, char *err, size_t err_size)
{
  uint32_t max = 0;
  if (tf->tokens32) {
    for (uint64_t k = 0; k < tf->n_tokens; k++)
      if (tf->tokens32[k] > max) max = tf->tokens32[k];
  } else {
    if (vocab > 65535) return 0;
    for (uint64_t k = 0; k < tf->n_tokens; k++)
      if (tf->tokens[k] > max) max = tf->tokens[k];
  }
  if (max < (uint32_t)vocab) return 0;
  uint64_t k = 0;
  while (tokens_at(tf, k) < (uint32_t)vocab) k++;
  uint64_t offset = (uint64_t)(tf->tokens32 ? 1024 + 4 * k
                                            : (uint64_t)((const char *)&tf->tokens[k] - (const char *)tf->map));
  return errf_input(err, err_size, "%s: token %" PRIu32 " at index %" PRIu64 " (byte offset %" PRIu64 ") is "
              "not below vocab %d", tf->path, tokens_at(tf, k), k, offset, vocab);
}

int tokens_open(struct tokens_file *tf, const char *path, int vocab, int seq_len,
                char *err, size_t err_size)
{
  int rc = 0;
  memset(tf, 0, sizeof *tf);
  if (vocab < 1 || seq_len < 1)
    return errf(err, err_size, "%s: vocab %d and seq_len %d must be positive", path, vocab,
                seq_len);
  /* opened without waiting (a FIFO or a device would block the open or the mapping), refused
   * unless a regular file: token files are memory-mapped */
  int fd;
  long long size;
  if ((rc = path_open_input(NULL, path, 0, &fd, &size, err, err_size)) != 0) return rc;
  tf->path = strdup(path);
  tf->seq_len = seq_len;
  if (!tf->path) rc = errf(err, err_size, "%s: out of memory", path);
  if (!rc && size > 0) {
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      rc = errf(err, err_size, "%s: cannot mmap %lld bytes: %s", path, (long long)size,
                strerror(errno));
    } else {
      tf->map = map;
      tf->map_bytes = (size_t)size;
      map_guard_add(map, (size_t)size, NULL, path); /* shrunk under the run: one line, exit 1 */
    }
  }
  close(fd);
  if (!rc) rc = tokens_layout(tf, err, err_size);
  if (!rc && tf->n_tokens < (uint64_t)seq_len + 1)
    rc = errf_input(err, err_size, "%s: %" PRIu64 " tokens, shorter than one window of seq_len + 1 = "
              "%" PRIu64 " tokens", path, tf->n_tokens, (uint64_t)seq_len + 1);
  if (!rc) {
    posix_madvise(tf->map, tf->map_bytes, POSIX_MADV_SEQUENTIAL);
    rc = tokens_check_vocab(tf, vocab, err, err_size);
    posix_madvise(tf->map, tf->map_bytes, POSIX_MADV_NORMAL);
  }
  if (rc) tokens_close(tf);
  return rc;
}

void tokens_close(struct tokens_file *tf)
{
  if (tf->map) {
    map_guard_remove(tf->map);
    munmap(tf->map, tf->map_bytes);
  }
  free(tf->path);
  memset(tf, 0, sizeof *tf);
}

uint64_t tokens_epoch_windows(const struct tokens_file *tf)
{
  return (tf->n_tokens - 1) / (uint64_t)tf->seq_len;
}

/* (a · b) mod m without overflow, for any 64-bit operands (m > 0). */
static uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m)
{
  uint64_t r = 0;
  a %= m;
  while (b) {
    if (b & 1) r = r >= m - a ? r - (m - a) : r + a;
    a = a >= m - a ? a - (m - a) : a + a;
    b >>= 1;
  }
  return r;
}

uint64_t tokens_window_start(const struct tokens_file *tf, uint64_t window, bool shuffle,
                             uint64_t data_seed)
{
  uint64_t S = (uint64_t)tf->seq_len;
  if (!shuffle) {
    uint64_t m = tf->n_tokens - S - 1;
    return m ? mul_mod(window, S, m) : 0;
  }
  uint64_t W = tokens_epoch_windows(tf);
  return tokens_permute(window % W, W, data_seed, window / W) * S;
}

void tokens_fill(const struct tokens_file *tf, uint64_t window, bool shuffle, uint64_t data_seed,
                 int *inputs, int *targets)
{
  const uint64_t o = tokens_window_start(tf, window, shuffle, data_seed);
  for (int t = 0; t < tf->seq_len; t++) { /* ids below vocab (checked at open): they fit an int */
    if (inputs) inputs[t] = (int)tokens_at(tf, o + (uint64_t)t);
    if (targets) targets[t] = (int)tokens_at(tf, o + (uint64_t)t + 1);
  }
}

/* ---------------------------------------------------------------------------------------- */
/* The keyed permutation. A balanced Feistel network on 2·half bits is a permutation for any
 * round function; cycle-walking (apply again until the value is < n) restricts it to 0..n−1
 * and stays a permutation. The domain is at most 4n, so the walk takes < 4 steps on average. */

struct feistel { unsigned half; uint64_t mask; uint32_t key[2], stream[2]; };

static struct feistel feistel_make(uint64_t n, uint64_t seed, uint64_t stream)
{
  struct feistel f;
  unsigned bits = 0;
  while (bits < 64 && ((uint64_t)1 << bits) < n) bits++;
  if (bits < 2) bits = 2;
  bits += bits & 1;
  f.half = bits / 2;
  f.mask = f.half == 32 ? 0xffffffffu : ((uint64_t)1 << f.half) - 1;
  f.key[0] = (uint32_t)seed;
  f.key[1] = (uint32_t)(seed >> 32);
  f.stream[0] = (uint32_t)stream;
  f.stream[1] = (uint32_t)(stream >> 32);
  return f;
}

static uint64_t feistel_round(const struct feistel *f, int round, uint64_t half_value)
{
  const uint32_t ctr[4] = { (uint32_t)half_value, (uint32_t)round | f->half << 8, f->stream[0],
                            f->stream[1] };
  uint32_t out[4];
  philox4x32_10(ctr, f->key, out);
  return out[0] & f->mask;
}

static uint64_t feistel_forward(const struct feistel *f, uint64_t x)
{
  uint64_t left = x >> f->half, right = x & f->mask;
  for (int r = 0; r < FEISTEL_ROUNDS; r++) {
    uint64_t next = left ^ feistel_round(f, r, right);
    left = right;
    right = next;
  }
  return left << f->half | right;
}

static uint64_t feistel_backward(const struct feistel *f, uint64_t y)
{
  uint64_t left = y >> f->half, right = y & f->mask;
  for (int r = FEISTEL_ROUNDS - 1; r >= 0; r--) {
    uint64_t prev = right ^ feistel_round(f, r, left);
    right = left;
    left = prev;
  }
  return left << f->half | right;
}

uint64_t tokens_permute(uint64_t x, uint64_t n, uint64_t seed, uint64_t stream)
{
  if (n <= 1) return 0;
  struct feistel f = feistel_make(n, seed, stream);
  do x = feistel_forward(&f, x); while (x >= n);
  return x;
}

uint64_t tokens_unpermute(uint64_t y, uint64_t n, uint64_t seed, uint64_t stream)
{
  if (n <= 1) return 0;
  struct feistel f = feistel_make(n, seed, stream);
  do y = feistel_backward(&f, y); while (y >= n);
  return y;
}
