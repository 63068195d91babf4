/* Hugging Face tokenizers read in C (text/tokenizer.h): the ids of two tokenizers trained with
 * the `tokenizers` library (tests/golden/tokenizer/, made by its make.py) — byte-level BPE and
 * SentencePiece-style BPE with byte fallback — equal the library's on a text of many scripts,
 * emoji, whitespace runs, digits, code and invalid UTF-8 (read as U+FFFD per maximal subpart),
 * and on a text with added tokens; decoding the ids gives the text back; merges are read in both
 * forms; bos/eos come from the template, config.json or the added tokens; and what tycho does
 * not run is refused by name as an input error. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "text/tokenizer.h"
#include "util/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char err[1024];

static char *slurp(const char *path, size_t *n)
{
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)size + 1);
  *n = fread(s, 1, (size_t)size, f);
  s[*n] = 0;
  fclose(f);
  return s;
}

static const char *golden(const char *name)
{
  static char path[4][4096];
  static int k;
  const char *src = getenv("TYCHO_SOURCE_DIR");
  k = (k + 1) % 4;
  snprintf(path[k], sizeof path[k], "%s/tests/golden/tokenizer/%s", src ? src : ".", name);
  return path[k];
}

/* the ids of `text` (cleaned) by tokenizer `tok`, against the golden file */
static void check_golden(const char *tok, const char *text)
{
  char name[64];
  struct tokenizer *t;
  size_t n, cn, gn;
  char *raw = slurp(golden(text), &n), *clean;
  CHECK(raw != NULL);
  CHECK(text_utf8_clean(raw, n, &clean, &cn) == 0);
  snprintf(name, sizeof name, "%s.json", tok);
  CHECK_MSG(tokenizer_load(&t, golden(name), err, sizeof err) == 0, "%s", err);
  struct tok_worker *w = tok_worker_new(t);
  struct tok_ids ids = { 0 };
  CHECK_MSG(tok_encode(w, clean, cn, &ids, err, sizeof err) == 0, "%s", err);
  snprintf(name, sizeof name, "%s.%s", tok, text);
  char *dot = strrchr(name, '.');
  snprintf(dot, sizeof name - (size_t)(dot - name), ".ids");
  char *want = slurp(golden(name), &gn);
  CHECK_MSG(want != NULL, "no %s", name);
  size_t k = 0;
  char *p = want;
  int same = 1;
  while (want && *p) {
    unsigned long v = strtoul(p, &p, 10);
    while (*p == '\n') p++;
    if (k >= ids.n || ids.v[k] != v) {
      if (same) fprintf(stderr, "%s: id %zu is %u, tokenizers gives %lu\n", name, k, k < ids.n ? ids.v[k] : 0u, v);
      same = 0;
    }
    k++;
  }
  CHECK_MSG(same && k == ids.n, "%s: %zu ids, tokenizers gives %zu", name, ids.n, k);
  if (!strcmp(text, "text.txt")) { /* lossless: the decoder gives the (cleaned) text back */
    char *back;
    size_t bn;
    CHECK(tok_decode(t, ids.v, ids.n, &back, &bn, err, sizeof err) == 0);
    CHECK_MSG(bn == cn && !memcmp(back, clean, cn), "%s: decode differs from the text", tok);
    free(back);
  }
  tok_ids_free(&ids);
  tok_worker_free(w);
  tokenizer_free(t);
  free(want);
  free(raw);
  free(clean);
}

static void bytelevel_ids_equal_the_librarys(void)
{
  check_golden("bytelevel", "text.txt");
  check_golden("bytelevel", "special.txt");
}

static void sentencepiece_ids_equal_the_librarys(void)
{
  check_golden("sp", "text.txt");
  check_golden("sp", "special.txt");
}

static void invalid_utf8_becomes_one_replacement_per_maximal_subpart(void)
{
  static const struct { const char *in, *out; } cases[] = {
    { "a\xff" "b", "a\xef\xbf\xbd" "b" },
    { "\xf0\x9f\x98 x", "\xef\xbf\xbd x" },                        /* a cut 4-byte form: one */
    { "\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" },    /* a surrogate: three */
    { "\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd" },                    /* overlong: two */
    { "\xe2\x82", "\xef\xbf\xbd" },                                /* cut at the end: one */
    { "\xe2\x82\xac ok", "\xe2\x82\xac ok" },
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    char *o;
    size_t n;
    CHECK(text_utf8_clean(cases[k].in, strlen(cases[k].in), &o, &n) == 0);
    CHECK_MSG(n == strlen(cases[k].out) && !memcmp(o, cases[k].out, n), "case %zu", k);
    CHECK(text_utf8_valid(o, n));
    free(o);
  }
  CHECK(!text_utf8_valid("\xed\xa0\x80", 3));
}

static const char *write_json(const char *dir, const char *name, const char *text)
{
  static char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

static void merges_in_both_forms_and_special_ids(void)
{
  char dir[] = "/tmp/test_tokenizer.XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  write_json(dir, "tokenizer.json",
             "{\"added_tokens\": [{\"id\": 5, \"content\": \"<e>\", \"special\": true, \"normalized\": false}],"
             " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"abc\": 4},"
             " \"merges\": [\"a b\", [\"ab\", \"c\"]]}}");
  struct tokenizer *t;
  CHECK_MSG(tokenizer_load(&t, dir, err, sizeof err) == 0, "%s", err); /* the folder */
  struct tok_worker *w = tok_worker_new(t);
  struct tok_ids ids = { 0 };
  CHECK(tok_encode(w, "abcab<e>ca", 10, &ids, err, sizeof err) == 0);
  CHECK_MSG(ids.n == 5 && ids.v[0] == 4 && ids.v[1] == 3 && ids.v[2] == 5 && ids.v[3] == 2 && ids.v[4] == 0,
            "%zu ids", ids.n);
  CHECK(tokenizer_eos(t) == -1 && tokenizer_bos(t) == -1 && tokenizer_n_ids(t) == 6);
  tok_ids_free(&ids);
  tok_worker_free(w);
  tokenizer_free(t);
  /* config.json beside it names the special ids */
  write_json(dir, "config.json", "{\"bos_token_id\": 0, \"eos_token_id\": [5, 1]}");
  write_json(dir, "tokenizer_config.json", "{\"pad_token\": {\"content\": \"c\"}, \"eos_token\": \"b\"}");
  CHECK_MSG(tokenizer_load(&t, dir, err, sizeof err) == 0, "%s", err);
  CHECK(tokenizer_bos(t) == 0 && tokenizer_eos(t) == 5 && tokenizer_pad(t) == 2); /* config.json first */
  tokenizer_free(t);
  unlink(write_json(dir, "config.json", ""));
  CHECK_MSG(tokenizer_load(&t, dir, err, sizeof err) == 0, "%s", err);
  CHECK(tokenizer_bos(t) == -1 && tokenizer_eos(t) == 1 && tokenizer_pad(t) == 2);
  tokenizer_free(t);
  unlink(write_json(dir, "tokenizer_config.json", ""));
  unlink(write_json(dir, "tokenizer.json", ""));
  rmdir(dir);
  /* the golden ones: eos by name (<|endoftext|>; </s>), bos from sp.json's template */
  CHECK(tokenizer_load(&t, golden("bytelevel.json"), err, sizeof err) == 0);
  CHECK(tokenizer_eos(t) == 0 && tokenizer_bos(t) == -1);
  tokenizer_free(t);
  CHECK(tokenizer_load(&t, golden("sp.json"), err, sizeof err) == 0);
  CHECK(tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2);
  tokenizer_free(t);
}

static void what_tycho_does_not_run_is_refused_by_name(void)
{
  char dir[] = "/tmp/test_tokenizer.XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  static const char model[] = "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}";
  static const struct { const char *json, *want; } cases[] = {
    { "{%s, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "pre_tokenizer type \"Whitespace\" is not read by tycho" },
    { "{%s, \"normalizer\": {\"type\": \"NFKC\"}}", "normalizer type \"NFKC\" is not read by tycho" },
    { "{%s, \"decoder\": {\"type\": \"WordPiece\"}}", "decoder type \"WordPiece\" is not read by tycho" },
    { "{%s, \"post_processor\": {\"type\": \"Mystery\"}}", "post_processor type \"Mystery\" is not read by tycho" },
    { "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model type \"WordPiece\" is not read by tycho" },
    { "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}", "dropout > 0 is not read" },
    { "{%s, \"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"lstrip\": true}]}", "added token lstrip true is not read by tycho" },
    { "{%s, \"truncation\": {\"max_length\": 5}}", "a truncation setting is not read by tycho" },
    { "{%s, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"mystery\": 1}}",
      "pre_tokenizer ByteLevel field \"mystery\" is not read by tycho" },
    { "{%s, \"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"weight\": 2}]}", "added token field \"weight\" is not read by tycho" },
    { "{%s, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Contiguous\"}}", "Split behavior \"Contiguous\" is not read by tycho" },
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    char json[1024];
    const char *at = strstr(cases[k].json, "%s"); /* the model where the case has its place */
    if (at)
      snprintf(json, sizeof json, "%.*s%s%s", (int)(at - cases[k].json), cases[k].json, model, at + 2);
    else
      snprintf(json, sizeof json, "%s", cases[k].json);
    struct tokenizer *t = NULL;
    err_class_reset();
    const char *path = write_json(dir, "t.json", json);
    int rc = tokenizer_load(&t, path, err, sizeof err);
    CHECK_MSG(rc != 0, "case %zu loaded", k);
    CHECK_STR_CONTAINS(err, cases[k].want);
    CHECK_STR_CONTAINS(err, "t.json: ");
    CHECK(err_class_is_input());
    unlink(path);
  }
  rmdir(dir);
}

TEST_MAIN(TEST(bytelevel_ids_equal_the_librarys),
          TEST(sentencepiece_ids_equal_the_librarys),
          TEST(invalid_utf8_becomes_one_replacement_per_maximal_subpart),
          TEST(merges_in_both_forms_and_special_ids),
          TEST(what_tycho_does_not_run_is_refused_by_name))
