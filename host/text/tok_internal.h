/* The inside of a loaded tokenizer (text/tokenizer.h), shared by the loader (tok_load.c) and the
 * encoder and decoder (tokenizer.c): the pipeline's steps as read from tokenizer.json, and the
 * hash tables of the vocab and the merge ranks. */
#ifndef TYCHO_TEXT_TOK_INTERNAL_H
#define TYCHO_TEXT_TOK_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

enum norm_kind { NORM_PREPEND, NORM_REPLACE };
struct tok_norm {
  enum norm_kind kind;
  char *a, *b; /* prepend: a; replace: every a by b */
};

enum pre_kind { PRE_BYTELEVEL, PRE_SPLIT, PRE_METASPACE };
enum split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT };
enum prepend_scheme { PREPEND_NEVER, PREPEND_ALWAYS, PREPEND_FIRST };
struct tok_pre {
  enum pre_kind kind;
  int add_prefix_space, use_regex;     /* ByteLevel */
  pcre2_code *re;                      /* ByteLevel (use_regex) and Split */
  enum split_behavior behavior;        /* Split */
  int invert;
  char rep[8];                         /* Metaspace: the replacement, UTF-8 */
  enum prepend_scheme prepend;
  int split;
};

enum dec_kind { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
struct tok_dec {
  enum dec_kind kind;
  char *a, *b;          /* Replace: a by b; Strip: a is the content (one character) */
  int start, stop;      /* Strip */
  char rep[8];          /* Metaspace */
  enum prepend_scheme prepend;
};

struct tok_added {
  char *content;
  size_t len;
  char *match;          /* what is matched: content, normalized where `normalized` */
  size_t match_len;
  uint32_t id;
  int special, normalized;
};

/* string -> id, open addressing; keys point into the tokenizer's strings */
struct tok_strmap {
  const char **key;
  uint32_t *klen;
  uint32_t *val;
  size_t cap;            /* a power of two; 0 when empty */
};

/* (left id, right id) -> (rank, merged id) */
struct tok_mergemap {
  uint64_t *key;         /* left << 32 | right, ~0 when free */
  uint32_t *rank, *id;
  size_t cap;
};

/* A merge's first slot: both ids mixed into every bit (the splitmix64 finalizer), since the
 * low bits of a plain multiplicative hash of left << 32 | right hold only the right id, and a
 * large vocabulary's merges sharing a right symbol then probe long runs. */
static inline size_t tok_merge_slot(const struct tok_mergemap *m, uint64_t key)
{
  uint64_t z = key + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (size_t)(z ^ (z >> 31)) & (m->cap - 1);
}

#define TOK_MAX_STEPS 16

struct tokenizer {
  char *path;
  char *json_text;                  /* the file, kept: vocab strings point into its parse */
  void *json_doc;                   /* struct json_doc */
  uint32_t n_ids;
  const char **tok_str;             /* id -> token (model vocab or added), NULL where none */
  uint32_t *tok_len;
  struct tok_strmap vocab;          /* the model's vocab */
  struct tok_mergemap merges;
  int byte_fallback, fuse_unk, ignore_merges;
  int64_t unk_id;
  int32_t byte_id[256];             /* <0xNN>, -1 where absent */
  int bytelevel_words;              /* a ByteLevel pre-tokenizer maps bytes to characters */
  struct tok_norm norm[TOK_MAX_STEPS];
  int n_norm;
  struct tok_pre pre[TOK_MAX_STEPS];
  int n_pre;
  struct tok_dec dec[TOK_MAX_STEPS];
  int n_dec, has_decoder;
  struct tok_added *added;          /* longest first */
  int n_added, any_raw_added, any_norm_added;
  unsigned char first_raw[256], first_norm[256]; /* a byte that starts an added token */
  int64_t bos, eos, pad;
};

/* The byte-level alphabet: byte b as a character of 1 or 2 UTF-8 bytes. */
extern char tok_byte_char[256][3];
/* Builds tok_byte_char and its inverse once (thread-safe). */
void tok_bytelevel_init(void);
/* The byte a byte-level character stands for, or -1. */
int tok_bytelevel_byte(uint32_t cp);

int tok_strmap_put(struct tok_strmap *m, const char *key, uint32_t klen, uint32_t val);
int64_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t klen);
int tok_normalize(const struct tokenizer *t, const char *s, size_t n, char **out, size_t *len);

#endif
