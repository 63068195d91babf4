/* data.text: text files tokenized once into a cached llm.c token file that the run then maps
 * like data.train (docs/plans.md, "Text as data").
 *
 * The cache is .tycho-cache/text-KEY.bin in the current directory, where KEY is a hash of the
 * texts' contents (each file's size and bytes, in the plan's order), of the tokenizer.json's
 * bytes (and of the config.json and tokenizer_config.json beside it, where its bos and eos ids
 * may come from) and of the encoding's version; the same texts and tokenizer give the same file, from any
 * plan, and a changed byte in either gives a new one. Each file is one document, encoded as
 * `tycho tokenize TOKENIZER FILE...` encodes it (the tokenizer's eos id after each document where
 * it has one), so the cache holds exactly the tokens that command writes. Rank 0 makes it at run
 * start, written whole or not at all (a temporary file renamed into place), so other ranks, which
 * map it after rank 0's agreement, and other runs never see part of one.
 * Every function that can fail returns 0 or -1 with a one-line message naming the field (and
 * file) in err; an input error (a missing file, a bad tokenizer, a vocab too small) is recorded
 * as one (util/err.h). */
#ifndef TYCHO_DATA_TEXT_CACHE_H
#define TYCHO_DATA_TEXT_CACHE_H
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "plan/plan.h"

#define TEXT_CACHE_DIR ".tycho-cache"

struct text_cache_info {
  char path[64];                  /* the cache file: TEXT_CACHE_DIR/text-KEY.bin */
  char tokenizer[PLAN_PATH_MAX + 32]; /* the tokenizer.json hashed */
  uint64_t text_bytes;            /* the texts' sizes, summed */
  int cached;                     /* 1: the file is there */
};

/* The cache file of p's data.text and data.tokenizer (every file read and hashed). */
int text_cache_locate(const struct plan *p, struct text_cache_info *info, char *err, size_t err_size);
/* text_cache_locate, then, unless the file is there, the texts tokenized into it; the tokenizer
 * is checked against model.vocab either way. *made: 1 when it was written now. */
int text_cache_make(const struct plan *p, struct text_cache_info *info, int *made, uint64_t *n_tokens,
                    char *err, size_t err_size);
/* text_cache_make for a command about to open p (run, the REPL's tycho.open, generate), then one
 * line on out (NULL: none) saying whether the texts were tokenized now or already: 0 or -1. */
int text_cache_prepare(const struct plan *p, FILE *out, char *err, size_t err_size);

#endif
