/* Token files: both formats read the same tokens, windows follow the contract in tokens.h
 * (checked against hand-computed offsets), shuffled windows visit every start exactly once per
 * epoch in an order that depends on epoch and seed only, and each bad file is refused with a
 * message naming the cause. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "data/tokens.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char err[512];

/* Write an llm.c file (header fields given) or, with version < 0, a raw file; returns a
 * malloc'd path under /tmp. */
static char *write_file(const uint16_t *tokens, size_t n_tokens, int32_t version, int32_t count)
{
  char *path = strdup("/tmp/test_tokens.XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0) return path;
  FILE *fp = fdopen(fd, "wb");
  if (version >= 0) {
    int32_t header[256] = { TOKENS_MAGIC, version, count };
    fwrite(header, sizeof header, 1, fp);
  }
  if (n_tokens) fwrite(tokens, 2, n_tokens, fp);
  fclose(fp);
  return path;
}

static uint16_t *ramp(size_t n)
{
  uint16_t *t = malloc(n * sizeof *t);
  for (size_t k = 0; k < n; k++) t[k] = (uint16_t)k;
  return t;
}

static void both_formats_read_the_same_tokens(void)
{
  uint16_t *t = ramp(300);
  char *llmc = write_file(t, 300, 1, 300), *raw = write_file(t, 300, -1, 0);
  struct tokens_file a, b;
  CHECK_MSG(tokens_open(&a, llmc, 300, 8, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(tokens_open(&b, raw, 300, 8, err, sizeof err) == 0, "%s", err);
  CHECK(a.format == TOKENS_LLMC && b.format == TOKENS_RAW);
  CHECK(a.n_tokens == 300 && b.n_tokens == 300);
  CHECK(memcmp(a.tokens, t, 600) == 0 && memcmp(b.tokens, t, 600) == 0);
  tokens_close(&a);
  tokens_close(&a);
  tokens_close(&b);
  unlink(llmc);
  unlink(raw);
  free(llmc);
  free(raw);
  free(t);
}

/* A version 2 file (uint32 tokens, as tycho tokenize writes for more than 65536 ids) reads the
 * same windows, ids past 65535 included, and keeps the id < vocab check. */
static void version_2_files_hold_uint32_tokens(void)
{
  uint32_t t[300];
  for (int k = 0; k < 300; k++) t[k] = 70000u + (uint32_t)k;
  char *path = strdup("/tmp/test_tokens.XXXXXX");
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  FILE *fp = fdopen(fd, "wb");
  int32_t header[256] = { TOKENS_MAGIC, 2, 300 };
  fwrite(header, sizeof header, 1, fp);
  fwrite(t, 4, 300, fp);
  fclose(fp);
  struct tokens_file tf;
  CHECK_MSG(tokens_open(&tf, path, 70300, 8, err, sizeof err) == 0, "%s", err);
  CHECK(tf.format == TOKENS_LLMC && tf.n_tokens == 300 && tf.tokens32 && !tf.tokens);
  int in[8], tg[8];
  tokens_fill(&tf, 3, false, 0, in, tg); /* window 3 starts at 3 * 8 */
  CHECK(in[0] == 70024 && tg[0] == 70025 && in[7] == 70031 && tg[7] == 70032);
  CHECK(tokens_at(&tf, 299) == 70299);
  tokens_close(&tf);
  CHECK(tokens_open(&tf, path, 70299, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": token 70299 at index 299 (byte offset 2220) is not below vocab 70299");
  CHECK(tokens_open(&tf, path, 65536, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": token 70000 at index 0 (byte offset 1024) is not below vocab 65536");
  /* a count that does not fit the uint32 body */
  fp = fopen(path, "r+b");
  header[2] = 301;
  fwrite(header, sizeof header, 1, fp);
  fclose(fp);
  CHECK(tokens_open(&tf, path, 80000, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": header says 301 tokens but the file holds 1200 bytes of uint32 tokens "
                     "after the header (300 tokens)");
  unlink(path);
  free(path);
}

static void unshuffled_windows_start_at_w_times_s_mod_n_minus_s_minus_1(void)
{
  /* n = 1000, S = 16: starts are (w·16) mod 983. G = 4, so step 15, k = 1 is w = 61. */
  uint16_t *t = ramp(1000);
  char *path = write_file(t, 1000, 1, 1000);
  struct tokens_file tf;
  CHECK_MSG(tokens_open(&tf, path, 1000, 16, err, sizeof err) == 0, "%s", err);
  const int G = 4;
  const struct { int step, k; uint64_t start; } expect[] = {
    { 0, 0, 0 }, { 0, 1, 16 }, { 0, 3, 48 }, { 1, 0, 64 }, { 15, 1, 976 }, { 15, 2, 9 },
    { 15, 3, 25 }, { 25, 0, 617 }, { 1000000, 0, 64000000 % 983 },
  };
  for (size_t c = 0; c < sizeof expect / sizeof expect[0]; c++) {
    uint64_t w = (uint64_t)expect[c].step * G + (uint64_t)expect[c].k;
    CHECK_MSG(tokens_window_start(&tf, w, false, 7) == expect[c].start, "window %llu",
              (unsigned long long)w);
    int inputs[16], targets[16];
    tokens_fill(&tf, w, false, 7, inputs, targets);
    for (int s = 0; s < 16; s++) {
      CHECK(inputs[s] == (int)expect[c].start + s);
      CHECK(targets[s] == (int)expect[c].start + s + 1);
    }
  }
  /* The last start used is n − S − 2, so the last target is token n − 2. */
  uint64_t max = 0;
  for (uint64_t w = 0; w < 2000; w++) {
    uint64_t o = tokens_window_start(&tf, w, false, 0);
    if (o > max) max = o;
  }
  CHECK(max == 1000 - 16 - 2);
  /* Huge window numbers do not overflow: (w·S) mod m computed exactly. */
  uint64_t w = UINT64_MAX / 3;
  CHECK(tokens_window_start(&tf, w, false, 0) == (uint64_t)((unsigned __int128)w * 16 % 983));
  tokens_close(&tf);
  unlink(path);
  free(path);
  free(t);
}

static void targets_are_inputs_shifted_by_one(void)
{
  uint16_t t[500];
  for (int k = 0; k < 500; k++) t[k] = (uint16_t)((k * 7919 + 13) % 50257);
  char *path = write_file(t, 500, -1, 0);
  struct tokens_file tf;
  CHECK_MSG(tokens_open(&tf, path, 50257, 32, err, sizeof err) == 0, "%s", err);
  for (int shuffle = 0; shuffle < 2; shuffle++) {
    for (uint64_t w = 0; w < 100; w++) {
      int inputs[32], targets[32];
      uint64_t o = tokens_window_start(&tf, w, shuffle, 42);
      tokens_fill(&tf, w, shuffle, 42, inputs, targets);
      CHECK(o + 33 <= 500);
      for (int s = 0; s < 31; s++) CHECK(targets[s] == inputs[s + 1]);
      for (int s = 0; s < 32; s++) CHECK(inputs[s] == t[o + (uint64_t)s]);
      CHECK(targets[31] == t[o + 32]);
    }
  }
  tokens_close(&tf);
  unlink(path);
  free(path);
}

/* Starts of epoch e under seed, as window indices j (start / S); returns 0 unless a permutation. */
static int epoch_order(const struct tokens_file *tf, uint64_t e, uint64_t seed, uint64_t *order)
{
  uint64_t W = tokens_epoch_windows(tf), S = (uint64_t)tf->seq_len;
  char *seen = calloc(W, 1);
  int ok = 1;
  for (uint64_t q = 0; q < W; q++) {
    uint64_t o = tokens_window_start(tf, e * W + q, true, seed);
    if (o % S || o / S >= W || seen[o / S]) ok = 0;
    else seen[o / S] = 1;
    order[q] = o / S;
  }
  free(seen);
  return ok;
}

static void shuffled_windows_visit_every_start_once_per_epoch(void)
{
  /* n = 16·37 + 6 tokens, S = 16: W = floor((n − 1) / 16) = 37, not a power of two. */
  size_t n = 16 * 37 + 6;
  uint16_t *t = ramp(n);
  char *path = write_file(t, n, 1, (int32_t)n);
  struct tokens_file tf;
  CHECK_MSG(tokens_open(&tf, path, 1000, 16, err, sizeof err) == 0, "%s", err);
  CHECK(tokens_epoch_windows(&tf) == 37);
  uint64_t e0[37], e1[37], e0_again[37], other_seed[37];
  CHECK(epoch_order(&tf, 0, 1234, e0));
  CHECK(epoch_order(&tf, 1, 1234, e1));
  CHECK(epoch_order(&tf, 0, 1234, e0_again));
  CHECK(epoch_order(&tf, 0, 1235, other_seed));
  CHECK(epoch_order(&tf, 1000000, 1234, e1) && epoch_order(&tf, 1, 1234, e1));
  CHECK(memcmp(e0, e0_again, sizeof e0) == 0);
  CHECK(memcmp(e0, e1, sizeof e0) != 0);
  CHECK(memcmp(e0, other_seed, sizeof e0) != 0);
  int fixed = 0; /* a shuffle, not the identity */
  for (int q = 0; q < 37; q++) fixed += e0[q] == (uint64_t)q;
  CHECK(fixed < 10);
  /* Reopening the file gives the same windows: the order is a function of (seed, epoch). */
  tokens_close(&tf);
  CHECK_MSG(tokens_open(&tf, path, 1000, 16, err, sizeof err) == 0, "%s", err);
  CHECK(epoch_order(&tf, 0, 1234, e0_again) && memcmp(e0, e0_again, sizeof e0) == 0);
  int inputs[16], targets[16];
  tokens_fill(&tf, 5, true, 1234, inputs, targets);
  CHECK(inputs[0] == (int)(e0[5] * 16) && targets[15] == (int)(e0[5] * 16 + 16));
  tokens_close(&tf);
  unlink(path);
  free(path);
  free(t);
}

static void permutation_is_a_bijection_with_an_inverse(void)
{
  const uint64_t sizes[] = { 1, 2, 3, 5, 16, 17, 1000, 4097 };
  for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
    uint64_t n = sizes[c];
    char *seen = calloc(n, 1);
    int ok = 1;
    for (uint64_t x = 0; x < n; x++) {
      uint64_t y = tokens_permute(x, n, 99, 3);
      if (y >= n || seen[y]) ok = 0;
      else seen[y] = 1;
      if (tokens_unpermute(y, n, 99, 3) != x) ok = 0;
    }
    CHECK_MSG(ok, "n = %llu", (unsigned long long)n);
    free(seen);
  }
  const uint64_t big[] = { ((uint64_t)1 << 40) + 3, ((uint64_t)1 << 63) + 5, UINT64_MAX };
  for (size_t c = 0; c < 3; c++)
    for (uint64_t x = 0; x < 50; x++) {
      uint64_t y = tokens_permute(x * 7777777, big[c], 5, 0);
      CHECK(y < big[c] && tokens_unpermute(y, big[c], 5, 0) == x * 7777777);
    }
}

static void a_file_of_exactly_one_window_has_only_window_zero(void)
{
  uint16_t *t = ramp(17);
  char *path = write_file(t, 17, -1, 0);
  struct tokens_file tf;
  CHECK_MSG(tokens_open(&tf, path, 100, 16, err, sizeof err) == 0, "%s", err);
  for (uint64_t w = 0; w < 5; w++) {
    CHECK(tokens_window_start(&tf, w, false, 1) == 0);
    CHECK(tokens_window_start(&tf, w, true, 1) == 0);
  }
  tokens_close(&tf);
  unlink(path);
  free(path);
  free(t);
}

static void bad_files_are_refused_with_their_cause(void)
{
  struct tokens_file tf;
  uint16_t *t = ramp(300);
  char *path;
  CHECK(tokens_open(&tf, "/nonexistent/train.bin", 100, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "/nonexistent/train.bin: cannot open: No such file or directory");

  path = write_file(t, 100, 3, 100);
  CHECK(tokens_open(&tf, path, 1000, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, path);
  CHECK_STR_CONTAINS(err, ": llm.c header version 3 (expected 1: uint16 tokens, or 2: uint32 tokens)");
  unlink(path);
  free(path);

  path = write_file(t, 100, 2, 100); /* version 2 with uint16's bytes: the count does not fit */
  CHECK(tokens_open(&tf, path, 1000, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": header says 100 tokens but the file holds 200 bytes of uint32 tokens "
                     "after the header (50 tokens)");
  unlink(path);
  free(path);

  path = write_file(t, 100, 1, 120);
  CHECK(tokens_open(&tf, path, 1000, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": header says 120 tokens but the file holds 200 bytes of uint16 tokens "
                     "after the header (100 tokens)");
  unlink(path);
  free(path);

  path = write_file(t, 10, 1, 10);
  CHECK(tokens_open(&tf, path, 1000, 16, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": 10 tokens, shorter than one window of seq_len + 1 = 17 tokens");
  unlink(path);
  free(path);

  path = write_file(t, 0, -1, 0);
  CHECK(tokens_open(&tf, path, 1000, 16, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": 0 tokens, shorter than one window");
  unlink(path);
  free(path);

  t[5] = 300;
  t[7] = 301;
  path = write_file(t, 100, 1, 100);
  CHECK(tokens_open(&tf, path, 256, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": token 300 at index 5 (byte offset 1034) is not below vocab 256");
  CHECK_MSG(tokens_open(&tf, path, 302, 8, err, sizeof err) == 0, "%s", err);
  tokens_close(&tf);
  unlink(path);
  free(path);

  /* An odd size without the magic is neither format. */
  path = write_file(t, 0, -1, 0);
  FILE *fp = fopen(path, "wb");
  fwrite("abc", 1, 3, fp);
  fclose(fp);
  CHECK(tokens_open(&tf, path, 1000, 1, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": 3 bytes is odd and the magic 20240520 is absent");
  /* The magic with a truncated header. */
  int32_t head[4] = { TOKENS_MAGIC, 1, 0, 0 };
  fp = fopen(path, "wb");
  fwrite(head, sizeof head, 1, fp);
  fclose(fp);
  CHECK(tokens_open(&tf, path, 1000, 1, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": 16 bytes, shorter than the 1024-byte llm.c header");
  unlink(path);
  free(path);

  /* The accepted corner: a raw file that starts with tokens 55432, 308 spells the magic and is
   * read as llm.c (here refused for its version field, tokens 2 and 3). */
  uint16_t corner[600] = { 55432, 308, 7, 0 };
  path = write_file(corner, 600, -1, 0);
  CHECK(tokens_open(&tf, path, 65536, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": llm.c header version 7 (expected 1");
  unlink(path);
  free(path);

  CHECK(tokens_open(&tf, "/tmp", 100, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "/tmp: is a folder, not a regular file");
  free(t);
}

/* A FIFO is refused at once, not waited on (open blocked until a writer came, forever). An
 * alarm turns a hang into a failure of this test. */
static void a_fifo_is_refused_without_blocking(void)
{
  char dir[] = "/tmp/test_tokens_fifo.XXXXXX", path[64];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/train.bin", dir);
  CHECK(mkfifo(path, 0600) == 0);
  struct tokens_file tf;
  alarm(20);
  CHECK(tokens_open(&tf, path, 64, 8, err, sizeof err) != 0);
  alarm(0);
  CHECK_STR_CONTAINS(err, "/train.bin: is a FIFO, not a regular file");
  unlink(path);
  rmdir(dir);
}

/* An llm.c file whose magic is wrong is refused for its header; it was read as raw tokens and
 * refused for "token 24910 ... is not below vocab 64" (the magic's low half). */
static void a_bad_llmc_magic_is_refused_as_a_bad_header(void)
{
  uint16_t *t = calloc(300, sizeof *t);
  struct tokens_file tf;
  char *path = write_file(t, 300, 1, 300);
  FILE *fp = fopen(path, "r+b");
  int32_t magic = 12345678;
  fwrite(&magic, sizeof magic, 1, fp);
  fclose(fp);
  CHECK(tokens_open(&tf, path, 64, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": a bad llm.c header: magic 12345678 where llm.c writes 20240520 "
                     "(the rest is an llm.c header: version 1, 300 tokens)");
  /* a wrong count too: still an llm.c header by its version and zeros */
  fp = fopen(path, "r+b");
  int32_t bad[3] = { 20240521, 1, 7 };
  fwrite(bad, sizeof bad, 1, fp);
  fclose(fp);
  CHECK(tokens_open(&tf, path, 64, 8, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, ": a bad llm.c header: magic 20240521 where llm.c writes 20240520");
  unlink(path);
  free(path);
  /* raw tokens of the same size stay raw */
  for (int k = 0; k < 300; k++) t[k] = (uint16_t)(k % 64);
  path = write_file(t, 300, -1, 0);
  CHECK_MSG(tokens_open(&tf, path, 64, 8, err, sizeof err) == 0, "%s", err);
  CHECK(tf.format == TOKENS_RAW && tf.n_tokens == 300);
  tokens_close(&tf);
  unlink(path);
  free(path);
  free(t);
}

TEST_MAIN(TEST(both_formats_read_the_same_tokens),
          TEST(version_2_files_hold_uint32_tokens),
          TEST(unshuffled_windows_start_at_w_times_s_mod_n_minus_s_minus_1),
          TEST(targets_are_inputs_shifted_by_one),
          TEST(shuffled_windows_visit_every_start_once_per_epoch),
          TEST(permutation_is_a_bijection_with_an_inverse),
          TEST(a_file_of_exactly_one_window_has_only_window_zero),
          TEST(bad_files_are_refused_with_their_cause),
          TEST(a_fifo_is_refused_without_blocking),
          TEST(a_bad_llmc_magic_is_refused_as_a_bad_header))
