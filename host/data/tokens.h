/* Token files, memory-mapped (never read whole), and the window contract for the whole project.
 *
 * Formats, chosen by the first int32: llm.c (256 little-endian int32 of header: [0] magic
 * 20240520, [1] version 1, [2] token count; then uint16 tokens; or version 2 and uint32 tokens,
 * as `tycho tokenize` writes for a tokenizer with more than 65536 ids) or raw (the whole file is
 * uint16 tokens, as nanoGPT writes). A raw file whose first two tokens happen to spell the magic
 * (tokens 55432 and 308 in that order) is read as llm.c and then refused for its header: an
 * accepted corner. A file without the magic whose first 1024 bytes are an llm.c header in all
 * else (the token count of header[2] fits the file exactly, or version 1 or 2 in header[1] and
 * zeros to the end of the header) is refused as a bad llm.c header rather than read as raw
 * tokens; raw tokens that look like that are the other accepted corner.
 *
 * Windows. With global batch G and sequence length S, window w = step·G + k (k = 0..G−1) has
 * inputs tokens[o, o+S) and targets tokens[o+1, o+S+1), where o is
 *   unshuffled: o = (w·S) mod (n_tokens − S − 1)   (o = 0 when n_tokens = S + 1);
 *   shuffled:   the epoch has W = floor((n_tokens − 1) / S) windows starting at j·S; window w is
 *               in epoch e = w / W at position q = w mod W, and o = perm_{seed,e}(q)·S, where
 *               perm is tokens_permute (a keyed Feistel permutation; docs/design.md, "Randomness").
 * Every function that can fail returns 0 or nonzero with a one-line message in err. */
#ifndef TYCHO_DATA_TOKENS_H
#define TYCHO_DATA_TOKENS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOKENS_MAGIC 20240520
#define TOKENS_VERSION 1    /* uint16 tokens */
#define TOKENS_VERSION_U32 2 /* uint32 tokens */
#define TOKENS_HEADER_BYTES 1024 /* 256 int32 */

enum tokens_format { TOKENS_LLMC, TOKENS_RAW };

struct tokens_file {
  char *path;
  void *map;                    /* the whole file, read-only */
  size_t map_bytes;
  enum tokens_format format;
  const uint16_t *tokens;       /* (n_tokens) little-endian, into map; NULL for uint32 files */
  const uint32_t *tokens32;     /* (n_tokens) of a version 2 file, else NULL */
  uint64_t n_tokens;
  int seq_len;                  /* S, checked at open: n_tokens >= S + 1 */
};

/* Map `path`, pick the format, and check it: the header (llm.c), the size, at least one window
 * of seq_len + 1 tokens, and every token id < vocab (one linear pass over the mapping). A path
 * that is not a regular file (a FIFO, a device, a folder) is refused at once, unread: status 2
 * (util/path.h); other failures 1. */
int tokens_open(struct tokens_file *tf, const char *path, int vocab, int seq_len,
                char *err, size_t err_size);
/* Token k of the file, either width. */
static inline uint32_t tokens_at(const struct tokens_file *tf, uint64_t k)
{
  return tf->tokens32 ? tf->tokens32[k] : tf->tokens[k];
}
/* Release the mapping; safe on a zeroed or already-closed tokens_file. */
void tokens_close(struct tokens_file *tf);
/* W, the number of windows in one shuffled epoch: floor((n_tokens − 1) / S). */
uint64_t tokens_epoch_windows(const struct tokens_file *tf);
/* The first token of window w (see above). */
uint64_t tokens_window_start(const struct tokens_file *tf, uint64_t window, bool shuffle,
                             uint64_t data_seed);
/* inputs[t] = tokens[o + t], targets[t] = tokens[o + t + 1] for t < S; either may be NULL. */
void tokens_fill(const struct tokens_file *tf, uint64_t window, bool shuffle, uint64_t data_seed,
                 int *inputs, int *targets);

/* A pseudo-random permutation of 0..n−1 keyed by (seed, stream), O(1) memory: a 6-round
 * Feistel network over the smallest even power of two ≥ n with Philox4x32-10 as its round
 * function, cycle-walking back into range. tokens_unpermute is its inverse. x must be < n. */
uint64_t tokens_permute(uint64_t x, uint64_t n, uint64_t seed, uint64_t stream);
uint64_t tokens_unpermute(uint64_t y, uint64_t n, uint64_t seed, uint64_t stream);

#endif
