/* Hugging Face tokenizers read in C: a tokenizer.json (a file, or the folder that holds one)
 * loaded and run as the `tokenizers` library runs it with encode(text, add_special_tokens=False),
 * giving the same ids. What tycho reads: the BPE model (vocab, merges as "a b" strings or [a, b]
 * pairs, byte_fallback, fuse_unk, ignore_merges, unk_token); the normalizers Sequence, Prepend
 * and Replace (a String pattern); the pre-tokenizers Sequence, ByteLevel (its GPT-2 regex,
 * use_regex, add_prefix_space), Split (a String or Regex pattern run by PCRE2 in UTF and UCP
 * mode; behavior Removed, Isolated, MergedWithPrevious or MergedWithNext; invert) and Metaspace;
 * the decoders Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip and Metaspace; added
 * tokens (matched in the text before the model, leftmost-longest, normalized or not; lstrip,
 * rstrip and single_word false). Anything else in the file is refused by name, an input error
 * (exit 2), never ignored: another model type, an unknown component type, a dropout > 0, a
 * truncation or padding setting.
 *
 * A tokenizer is read-only once loaded and shared by threads; each thread encodes through a
 * tok_worker of its own (scratch, regex match data, a cache of word -> ids).
 * Every function that can fail returns 0 or -1 with a one-line message in err. */
#ifndef TYCHO_TEXT_TOKENIZER_H
#define TYCHO_TEXT_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct tok_worker;

/* ids grown by the encoder */
struct tok_ids {
  uint32_t *v;
  size_t n, cap;
};

/* Loads PATH (tokenizer.json, or a folder holding tokenizer.json). The bos and eos ids come from, in
 * order: config.json beside tokenizer.json (bos_token_id, eos_token_id: a number or the first of
 * a list), tokenizer_config.json there (bos_token, eos_token: a string or {"content": ...}), the
 * post_processor's single template (a special token before $A is bos, after it eos), and, for
 * eos alone, an added special token named </s>, <|endoftext|>, <|end_of_text|> or <eos>. */
int tokenizer_load(struct tokenizer **t, const char *path, char *err, size_t err_size);
void tokenizer_free(struct tokenizer *t);
/* One more than the largest id of the vocab and added tokens. */
uint32_t tokenizer_n_ids(const struct tokenizer *t);
/* -1 where the tokenizer has none */
int64_t tokenizer_bos(const struct tokenizer *t);
int64_t tokenizer_eos(const struct tokenizer *t);
/* pad: from config.json (pad_token_id) or tokenizer_config.json (pad_token) alone */
int64_t tokenizer_pad(const struct tokenizer *t);
/* The path read (tokenizer.json itself). */
const char *tokenizer_path(const struct tokenizer *t);

struct tok_worker *tok_worker_new(const struct tokenizer *t);
void tok_worker_free(struct tok_worker *w);
/* Appends the ids of text[0, n) (valid UTF-8: see text_utf8_clean) to out. */
int tok_encode(struct tok_worker *w, const char *text, size_t n, struct tok_ids *out, char *err,
               size_t err_size);
/* The text of ids through the tokenizer's decoder, special tokens kept; *out malloc'd, with a
 * NUL after its *len bytes. */
int tok_decode(const struct tokenizer *t, const uint32_t *ids, size_t n, char **out, size_t *len,
               char *err, size_t err_size);

/* text[0, n) as valid UTF-8 into a malloc'd *out (NUL after *len bytes): each maximal subpart of
 * an ill-formed sequence becomes U+FFFD, as Python's errors="replace" reads it. */
int text_utf8_clean(const char *text, size_t n, char **out, size_t *len);
/* Whether text[0, n) is valid UTF-8 (no surrogates, no overlong forms). */
int text_utf8_valid(const char *text, size_t n);

void tok_ids_free(struct tok_ids *ids);

#endif
