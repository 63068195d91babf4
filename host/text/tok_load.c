/* Reading a Hugging Face tokenizer.json into a struct tokenizer (text/tok_internal.h): every
 * component tycho runs is read with its fields checked, and anything it does not run is refused
 * by name (an input error, exit 2), since a tokenizer that silently skips a step gives other ids
 * than the `tokenizers` library would. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_internal.h"
#include "util/err.h"
#include "util/json.h"
#include "util/path.h"

#define TOK_MAX_FILE_BYTES (1LL << 30)

/* the GPT-2 split of the ByteLevel pre-tokenizer */
static const char gpt2_pattern[] =
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct ld {
  struct tokenizer *t;
  struct json_doc *j;
  const char *path;
  char *err;
  size_t n;
};

static const struct json_node *N(const struct ld *l, int id) { return &l->j->nodes[id]; }

static int mem(const struct ld *l, int id, const char *key)
{
  return id >= 0 && N(l, id)->type == JSON_OBJECT ? json_member(l->j, id, key) : -1;
}

static int is_null(const struct ld *l, int id) { return id < 0 || N(l, id)->type == JSON_NULL; }

static const char *str_of(const struct ld *l, int id)
{
  return id >= 0 && N(l, id)->type == JSON_STRING ? N(l, id)->str : NULL;
}

static int bool_of(const struct ld *l, int id, int dflt)
{
  if (id < 0 || N(l, id)->type == JSON_NULL) return dflt;
  return N(l, id)->type == JSON_TRUE;
}

static int refuse(const struct ld *l, const char *what, const char *type)
{
  return errf_input(l->err, l->n, "%s: %s type \"%s\" is not read by tycho", l->path, what,
                    type ? type : "(none)");
}

static int bad(const struct ld *l, const char *fmt, const char *a)
{
  char m[512];
  snprintf(m, sizeof m, fmt, a);
  return errf_input(l->err, l->n, "%s: %s", l->path, m);
}

/* A flag that tycho implements only as false. */
static int flag_false(const struct ld *l, int obj, const char *key, const char *where)
{
  if (!bool_of(l, mem(l, obj, key), 0)) return 0;
  char m[256];
  snprintf(m, sizeof m, "%s %s true is not read by tycho", where, key);
  return bad(l, "%s", m);
}

/* The fields each component tycho runs may have: any other is refused rather than ignored (a
 * newer library's field could change the ids). */
static const struct { const char *what, *type, *keys; } known_fields[] = {
  { "normalizer", "Sequence", ",type,normalizers," },
  { "normalizer", "Prepend", ",type,prepend," },
  { "normalizer", "Replace", ",type,pattern,content," },
  { "pre_tokenizer", "Sequence", ",type,pretokenizers," },
  { "pre_tokenizer", "ByteLevel", ",type,add_prefix_space,trim_offsets,use_regex," },
  { "pre_tokenizer", "Split", ",type,pattern,behavior,invert," },
  { "pre_tokenizer", "Metaspace", ",type,replacement,add_prefix_space,prepend_scheme,split,str_rep," },
  { "decoder", "Sequence", ",type,decoders," },
  { "decoder", "ByteLevel", ",type,add_prefix_space,trim_offsets,use_regex," },
  { "decoder", "ByteFallback", ",type," },
  { "decoder", "Fuse", ",type," },
  { "decoder", "Replace", ",type,pattern,content," },
  { "decoder", "Strip", ",type,content,start,stop," },
  { "decoder", "Metaspace", ",type,replacement,add_prefix_space,prepend_scheme,split,str_rep," },
  { "model", "BPE", ",type,dropout,unk_token,continuing_subword_prefix,end_of_word_suffix,fuse_unk,"
                    "byte_fallback,ignore_merges,vocab,merges," },
  { "post_processor", "Sequence", ",type,processors," },
  { "post_processor", "TemplateProcessing", ",type,single,pair,special_tokens," },
  { "post_processor", "ByteLevel", ",type,add_prefix_space,trim_offsets,use_regex," },
  { "post_processor", "RobertaProcessing", ",type,sep,cls,trim_offsets,add_prefix_space," },
  { "post_processor", "BertProcessing", ",type,sep,cls," },
  { "added token", "", ",id,content,single_word,lstrip,rstrip,normalized,special," },
};

static int only_known(const struct ld *l, int id, const char *what, const char *type)
{
  if (id < 0 || N(l, id)->type != JSON_OBJECT) return 0;
  for (size_t k = 0; k < sizeof known_fields / sizeof *known_fields; k++) {
    if (strcmp(known_fields[k].what, what) || strcmp(known_fields[k].type, type ? type : "")) continue;
    for (int c = N(l, id)->first; c >= 0; c = N(l, c)->next) {
      char key[256];
      snprintf(key, sizeof key, ",%s,", N(l, c)->key);
      if (!strstr(known_fields[k].keys, key))
        return errf_input(l->err, l->n, "%s: %s%s%s field \"%s\" is not read by tycho", l->path, what,
                          *known_fields[k].type ? " " : "", known_fields[k].type, N(l, c)->key);
    }
  }
  return 0;
}

static int compile(const struct ld *l, const char *pattern, int literal, pcre2_code **re)
{
  int code;
  PCRE2_SIZE off;
  *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &code, &off, NULL);
  if (!*re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    return errf_input(l->err, l->n, "%s: regex /%s/ at offset %zu: %s", l->path, pattern,
                      (size_t)off, (const char *)msg);
  }
  pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* where JIT is unavailable the interpreter runs */
  return 0;
}

/* a {"String": s} or {"Regex": r} pattern */
static int pattern_of(const struct ld *l, int obj, const char *where, const char **s, int *literal)
{
  int p = mem(l, obj, "pattern");
  *s = str_of(l, mem(l, p, "String"));
  *literal = 1;
  if (!*s) {
    *s = str_of(l, mem(l, p, "Regex"));
    *literal = 0;
  }
  return *s ? 0 : bad(l, "%s pattern is neither {\"String\": ...} nor {\"Regex\": ...}", where);
}

static int utf8_char(const char *s, char out[8])
{
  size_t k = s ? strlen(s) : 0;
  if (k == 0 || k > 4 || !text_utf8_valid(s, k) || json_utf8_length((const unsigned char *)s, k) != k)
    return -1;
  memcpy(out, s, k + 1);
  return 0;
}

static enum prepend_scheme scheme_of(const struct ld *l, int obj, int *ok)
{
  const char *s = str_of(l, mem(l, obj, "prepend_scheme"));
  *ok = 1;
  if (!s) return bool_of(l, mem(l, obj, "add_prefix_space"), 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
  if (!strcmp(s, "always")) return PREPEND_ALWAYS;
  if (!strcmp(s, "first")) return PREPEND_FIRST;
  if (!strcmp(s, "never")) return PREPEND_NEVER;
  *ok = 0;
  return PREPEND_NEVER;
}

static int read_normalizer(struct ld *l, int id)
{
  if (is_null(l, id)) return 0;
  struct tokenizer *t = l->t;
  const char *type = str_of(l, mem(l, id, "type"));
  if (only_known(l, id, "normalizer", type)) return -1;
  if (type && !strcmp(type, "Sequence")) {
    int list = mem(l, id, "normalizers");
    if (list < 0 || N(l, list)->type != JSON_ARRAY) return bad(l, "normalizer Sequence without %s", "normalizers");
    for (int c = N(l, list)->first; c >= 0; c = N(l, c)->next)
      if (read_normalizer(l, c)) return -1;
    return 0;
  }
  if (t->n_norm == TOK_MAX_STEPS) return bad(l, "more than 16 %s", "normalizers");
  struct tok_norm *s = &t->norm[t->n_norm];
  if (type && !strcmp(type, "Prepend")) {
    const char *p = str_of(l, mem(l, id, "prepend"));
    if (!p) return bad(l, "normalizer Prepend without a string %s", "prepend");
    s->kind = NORM_PREPEND;
    s->a = (char *)p;
  } else if (type && !strcmp(type, "Replace")) {
    const char *p;
    int literal;
    if (pattern_of(l, id, "normalizer Replace", &p, &literal)) return -1;
    if (!literal) return bad(l, "normalizer Replace with a %s pattern is not read by tycho", "Regex");
    const char *c = str_of(l, mem(l, id, "content"));
    if (!c || !*p) return bad(l, "normalizer Replace needs a non-empty pattern and a %s", "content");
    s->kind = NORM_REPLACE;
    s->a = (char *)p;
    s->b = (char *)c;
  } else {
    return refuse(l, "normalizer", type);
  }
  t->n_norm++;
  return 0;
}

static int read_pre(struct ld *l, int id)
{
  if (is_null(l, id)) return 0;
  struct tokenizer *t = l->t;
  const char *type = str_of(l, mem(l, id, "type"));
  if (only_known(l, id, "pre_tokenizer", type)) return -1;
  if (type && !strcmp(type, "Sequence")) {
    int list = mem(l, id, "pretokenizers");
    if (list < 0 || N(l, list)->type != JSON_ARRAY) return bad(l, "pre_tokenizer Sequence without %s", "pretokenizers");
    for (int c = N(l, list)->first; c >= 0; c = N(l, c)->next)
      if (read_pre(l, c)) return -1;
    return 0;
  }
  if (t->n_pre == TOK_MAX_STEPS) return bad(l, "more than 16 %s", "pre-tokenizers");
  struct tok_pre *s = &t->pre[t->n_pre];
  if (type && !strcmp(type, "ByteLevel")) {
    s->kind = PRE_BYTELEVEL;
    s->add_prefix_space = bool_of(l, mem(l, id, "add_prefix_space"), 1);
    s->use_regex = bool_of(l, mem(l, id, "use_regex"), 1);
    if (s->use_regex && compile(l, gpt2_pattern, 0, &s->re)) return -1;
    t->bytelevel_words = 1;
  } else if (type && !strcmp(type, "Split")) {
    const char *p, *b = str_of(l, mem(l, id, "behavior"));
    int literal;
    if (pattern_of(l, id, "pre_tokenizer Split", &p, &literal)) return -1;
    s->kind = PRE_SPLIT;
    s->invert = bool_of(l, mem(l, id, "invert"), 0);
    if (!b) return bad(l, "pre_tokenizer Split without a %s", "behavior");
    if (!strcmp(b, "Removed")) s->behavior = SPLIT_REMOVED;
    else if (!strcmp(b, "Isolated")) s->behavior = SPLIT_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious")) s->behavior = SPLIT_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext")) s->behavior = SPLIT_MERGED_NEXT;
    else return bad(l, "pre_tokenizer Split behavior \"%s\" is not read by tycho", b);
    if (compile(l, p, literal, &s->re)) return -1;
  } else if (type && !strcmp(type, "Metaspace")) {
    int ok;
    s->kind = PRE_METASPACE;
    if (utf8_char(str_of(l, mem(l, id, "replacement")), s->rep))
      return bad(l, "pre_tokenizer Metaspace %s is not one character", "replacement");
    s->prepend = scheme_of(l, id, &ok);
    if (!ok) return bad(l, "pre_tokenizer Metaspace %s is not always, first or never", "prepend_scheme");
    s->split = bool_of(l, mem(l, id, "split"), 1);
  } else {
    return refuse(l, "pre_tokenizer", type);
  }
  t->n_pre++;
  return 0;
}

static int read_decoder(struct ld *l, int id)
{
  if (is_null(l, id)) return 0;
  struct tokenizer *t = l->t;
  const char *type = str_of(l, mem(l, id, "type"));
  if (only_known(l, id, "decoder", type)) return -1;
  t->has_decoder = 1;
  if (type && !strcmp(type, "Sequence")) {
    int list = mem(l, id, "decoders");
    if (list < 0 || N(l, list)->type != JSON_ARRAY) return bad(l, "decoder Sequence without %s", "decoders");
    for (int c = N(l, list)->first; c >= 0; c = N(l, c)->next)
      if (read_decoder(l, c)) return -1;
    return 0;
  }
  if (t->n_dec == TOK_MAX_STEPS) return bad(l, "more than 16 %s", "decoders");
  struct tok_dec *s = &t->dec[t->n_dec];
  if (type && !strcmp(type, "ByteLevel")) {
    s->kind = DEC_BYTELEVEL;
  } else if (type && !strcmp(type, "ByteFallback")) {
    s->kind = DEC_BYTEFALLBACK;
  } else if (type && !strcmp(type, "Fuse")) {
    s->kind = DEC_FUSE;
  } else if (type && !strcmp(type, "Replace")) {
    const char *p;
    int literal;
    if (pattern_of(l, id, "decoder Replace", &p, &literal)) return -1;
    if (!literal) return bad(l, "decoder Replace with a %s pattern is not read by tycho", "Regex");
    s->kind = DEC_REPLACE;
    s->a = (char *)p;
    s->b = (char *)str_of(l, mem(l, id, "content"));
    if (!s->b || !*p) return bad(l, "decoder Replace needs a non-empty pattern and a %s", "content");
  } else if (type && !strcmp(type, "Strip")) {
    uint64_t a = 0, b = 0;
    s->kind = DEC_STRIP;
    s->a = (char *)str_of(l, mem(l, id, "content"));
    char one[8];
    if (utf8_char(s->a, one) || !json_uint64(l->j, mem(l, id, "start"), &a) ||
        !json_uint64(l->j, mem(l, id, "stop"), &b) || a > 1000 || b > 1000)
      return bad(l, "decoder Strip needs one character of content and counts %s", "start, stop");
    s->start = (int)a;
    s->stop = (int)b;
  } else if (type && !strcmp(type, "Metaspace")) {
    int ok;
    s->kind = DEC_METASPACE;
    if (utf8_char(str_of(l, mem(l, id, "replacement")), s->rep))
      return bad(l, "decoder Metaspace %s is not one character", "replacement");
    s->prepend = scheme_of(l, id, &ok);
    if (!ok) return bad(l, "decoder Metaspace %s is not always, first or never", "prepend_scheme");
  } else {
    return refuse(l, "decoder", type);
  }
  t->n_dec++;
  return 0;
}

static int set_token(struct ld *l, uint32_t id, const char *s)
{
  struct tokenizer *t = l->t;
  if (id >= t->n_ids) {
    uint32_t n = id + 1;
    const char **a = realloc(t->tok_str, n * sizeof *a);
    uint32_t *b = a ? realloc(t->tok_len, n * sizeof *b) : NULL;
    if (a) t->tok_str = a;
    if (!b) return errf(l->err, l->n, "%s: out of memory", l->path);
    t->tok_len = b;
    for (uint32_t k = t->n_ids; k < n; k++) t->tok_str[k] = NULL, t->tok_len[k] = 0;
    t->n_ids = n;
  }
  t->tok_str[id] = s;
  t->tok_len[id] = (uint32_t)strlen(s);
  return 0;
}

static int read_id(const struct ld *l, int node, uint32_t *id)
{
  uint64_t v;
  if (!json_uint64(l->j, node, &v) || v > 0x7fffffffu) return -1;
  *id = (uint32_t)v;
  return 0;
}

static int merge_put(struct tok_mergemap *m, uint64_t key, uint32_t rank, uint32_t id)
{
  size_t mask = m->cap - 1, h = tok_merge_slot(m, key);
  while (m->key[h] != ~0ull) {
    if (m->key[h] == key) return 0; /* a repeated merge: the first rank holds */
    h = (h + 1) & mask;
  }
  m->key[h] = key;
  m->rank[h] = rank;
  m->id[h] = id;
  return 0;
}

static int read_model(struct ld *l, int id)
{
  struct tokenizer *t = l->t;
  const char *type = str_of(l, mem(l, id, "type"));
  if (!type && mem(l, id, "merges") >= 0) type = "BPE"; /* older files leave the type out */
  if (!type || strcmp(type, "BPE")) return refuse(l, "model", type);
  if (only_known(l, id, "model", type)) return -1;
  double dropout = 0;
  int d = mem(l, id, "dropout");
  if (!is_null(l, d) && (!json_double(l->j, d, &dropout) || dropout > 0))
    return bad(l, "model BPE dropout %s is not read by tycho (only null or 0)", "> 0");
  if (str_of(l, mem(l, id, "continuing_subword_prefix")) && *str_of(l, mem(l, id, "continuing_subword_prefix")))
    return bad(l, "model BPE %s is not read by tycho", "continuing_subword_prefix");
  if (str_of(l, mem(l, id, "end_of_word_suffix")) && *str_of(l, mem(l, id, "end_of_word_suffix")))
    return bad(l, "model BPE %s is not read by tycho", "end_of_word_suffix");
  t->byte_fallback = bool_of(l, mem(l, id, "byte_fallback"), 0);
  t->fuse_unk = bool_of(l, mem(l, id, "fuse_unk"), 0);
  t->ignore_merges = bool_of(l, mem(l, id, "ignore_merges"), 0);
  int vocab = mem(l, id, "vocab"), merges = mem(l, id, "merges");
  if (vocab < 0 || N(l, vocab)->type != JSON_OBJECT) return bad(l, "model %s is not an object", "vocab");
  if (merges < 0 || N(l, merges)->type != JSON_ARRAY) return bad(l, "model %s is not an array", "merges");
  size_t cap = 16;
  while (cap < 2 * (size_t)N(l, vocab)->n_children + 2) cap *= 2;
  t->vocab.cap = cap;
  t->vocab.key = calloc(cap, sizeof *t->vocab.key);
  t->vocab.klen = calloc(cap, sizeof *t->vocab.klen);
  t->vocab.val = calloc(cap, sizeof *t->vocab.val);
  if (!t->vocab.key || !t->vocab.klen || !t->vocab.val) return errf(l->err, l->n, "%s: out of memory", l->path);
  for (int c = N(l, vocab)->first; c >= 0; c = N(l, c)->next) {
    uint32_t v;
    if (read_id(l, c, &v)) return bad(l, "model vocab \"%s\" has no id in 0..2^31-1", N(l, c)->key);
    if (tok_strmap_put(&t->vocab, N(l, c)->key, (uint32_t)strlen(N(l, c)->key), v) ||
        set_token(l, v, N(l, c)->key))
      return -1;
  }
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    int64_t v = tok_strmap_get(&t->vocab, name, 6);
    t->byte_id[b] = v >= 0 ? (int32_t)v : -1;
  }
  const char *unk = str_of(l, mem(l, id, "unk_token"));
  t->unk_id = -1;
  if (unk) {
    t->unk_id = tok_strmap_get(&t->vocab, unk, strlen(unk));
    if (t->unk_id < 0) return bad(l, "model unk_token \"%s\" is not in the vocab", unk);
  }
  cap = 16;
  while (cap < 2 * (size_t)N(l, merges)->n_children + 2) cap *= 2;
  t->merges.cap = cap;
  t->merges.key = malloc(cap * sizeof *t->merges.key);
  t->merges.rank = malloc(cap * sizeof *t->merges.rank);
  t->merges.id = malloc(cap * sizeof *t->merges.id);
  if (!t->merges.key || !t->merges.rank || !t->merges.id) return errf(l->err, l->n, "%s: out of memory", l->path);
  memset(t->merges.key, 0xff, cap * sizeof *t->merges.key);
  uint32_t rank = 0;
  for (int c = N(l, merges)->first; c >= 0; c = N(l, c)->next, rank++) {
    const char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    if (N(l, c)->type == JSON_STRING) { /* "a b" */
      a = N(l, c)->str;
      const char *sp = strchr(a, ' ');
      if (sp) {
        al = (size_t)(sp - a);
        b = sp + 1;
        bl = strlen(b);
      }
    } else if (N(l, c)->type == JSON_ARRAY && N(l, c)->n_children == 2) { /* ["a", "b"] */
      int x = N(l, c)->first, y = N(l, x)->next;
      a = str_of(l, x);
      b = str_of(l, y);
      if (a && b) al = strlen(a), bl = strlen(b);
    }
    if (!a || !b) {
      char m[64];
      snprintf(m, sizeof m, "%u", rank);
      return bad(l, "model merge %s is neither \"a b\" nor [\"a\", \"b\"]", m);
    }
    int64_t ia = tok_strmap_get(&t->vocab, a, al), ib = tok_strmap_get(&t->vocab, b, bl);
    char both[1024];
    int64_t im = -1;
    if (al + bl < sizeof both) {
      memcpy(both, a, al);
      memcpy(both + al, b, bl);
      im = tok_strmap_get(&t->vocab, both, al + bl);
    }
    if (ia < 0 || ib < 0 || im < 0) {
      char m[160];
      snprintf(m, sizeof m, "%u (%.60s)", rank, N(l, c)->type == JSON_STRING ? a : "a pair");
      return bad(l, "model merge %s has a part or a result outside the vocab", m);
    }
    merge_put(&t->merges, (uint64_t)ia << 32 | (uint64_t)ib, rank, (uint32_t)im);
  }
  return 0;
}

static int cmp_added(const void *x, const void *y)
{
  const struct tok_added *a = x, *b = y;
  return a->len < b->len ? 1 : a->len > b->len ? -1 : 0;
}

static int read_added(struct ld *l, int list)
{
  struct tokenizer *t = l->t;
  if (is_null(l, list)) return 0;
  if (N(l, list)->type != JSON_ARRAY) return bad(l, "%s is not an array", "added_tokens");
  t->added = calloc((size_t)N(l, list)->n_children + 1, sizeof *t->added);
  if (!t->added) return errf(l->err, l->n, "%s: out of memory", l->path);
  for (int c = N(l, list)->first; c >= 0; c = N(l, c)->next) {
    struct tok_added *a = &t->added[t->n_added];
    if (only_known(l, c, "added token", "")) return -1;
    a->content = (char *)str_of(l, mem(l, c, "content"));
    if (!a->content || !*a->content || read_id(l, mem(l, c, "id"), &a->id))
      return bad(l, "an added token without a content or an %s", "id");
    if (flag_false(l, c, "single_word", "added token") || flag_false(l, c, "lstrip", "added token") ||
        flag_false(l, c, "rstrip", "added token"))
      return -1;
    a->len = strlen(a->content);
    a->special = bool_of(l, mem(l, c, "special"), 0);
    a->normalized = bool_of(l, mem(l, c, "normalized"), !a->special);
    if (set_token(l, a->id, a->content)) return -1;
    t->n_added++;
  }
  qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
  return 0;
}

/* What added tokens are matched as: normalized ones through the normalizer (as the library
 * builds its matcher). */
static int prepare_added(struct ld *l)
{
  struct tokenizer *t = l->t;
  for (int k = 0; k < t->n_added; k++) {
    struct tok_added *a = &t->added[k];
    if (a->normalized && t->n_norm) {
      if (tok_normalize(t, a->content, a->len, &a->match, &a->match_len))
        return errf(l->err, l->n, "%s: out of memory", l->path);
    } else {
      a->match = strdup(a->content);
      a->match_len = a->len;
      if (!a->match) return errf(l->err, l->n, "%s: out of memory", l->path);
    }
    if (a->normalized) t->any_norm_added = 1, t->first_norm[(unsigned char)a->match[0]] = 1;
    else t->any_raw_added = 1, t->first_raw[(unsigned char)a->match[0]] = 1;
  }
  /* the match order is leftmost-longest: longest first at each place */
  for (int i = 1; i < t->n_added; i++)
    for (int k = i; k > 0 && t->added[k].match_len > t->added[k - 1].match_len; k--) {
      struct tok_added x = t->added[k];
      t->added[k] = t->added[k - 1];
      t->added[k - 1] = x;
    }
  return 0;
}

static int64_t token_id(const struct tokenizer *t, const char *s)
{
  if (!s) return -1;
  for (int k = 0; k < t->n_added; k++)
    if (!strcmp(t->added[k].content, s)) return t->added[k].id;
  return tok_strmap_get(&t->vocab, s, strlen(s));
}

/* bos/eos from the post-processor's single template (TemplateProcessing, or inside a Sequence) */
static int read_post(struct ld *l, int id)
{
  if (is_null(l, id)) return 0;
  struct tokenizer *t = l->t;
  const char *type = str_of(l, mem(l, id, "type"));
  if (only_known(l, id, "post_processor", type)) return -1;
  if (type && !strcmp(type, "Sequence")) {
    int list = mem(l, id, "processors");
    for (int c = list >= 0 ? N(l, list)->first : -1; c >= 0; c = N(l, c)->next)
      if (read_post(l, c)) return -1;
    return 0;
  }
  if (type && !strcmp(type, "TemplateProcessing")) {
    int single = mem(l, id, "single"), seen_a = 0;
    for (int c = single >= 0 && N(l, single)->type == JSON_ARRAY ? N(l, single)->first : -1; c >= 0;
         c = N(l, c)->next) {
      if (mem(l, c, "Sequence") >= 0) { seen_a = 1; continue; }
      const char *name = str_of(l, mem(l, mem(l, c, "SpecialToken"), "id"));
      int64_t v = token_id(t, name);
      if (v < 0) continue;
      if (!seen_a && t->bos < 0) t->bos = v;
      if (seen_a && t->eos < 0) t->eos = v;
    }
    return 0;
  }
  if (type && (!strcmp(type, "ByteLevel") || !strcmp(type, "RobertaProcessing") ||
               !strcmp(type, "BertProcessing")))
    return 0; /* no ids change without the special tokens */
  return refuse(l, "post_processor", type);
}

/* The special ids of config.json or tokenizer_config.json in `dir` (either may be absent). */
static void read_configs(struct tokenizer *t, const char *dir)
{
  static const char *const files[2] = { "config.json", "tokenizer_config.json" };
  for (int f = 0; f < 2; f++) {
    char p[4200], e[256], *text = NULL;
    size_t len;
    if (snprintf(p, sizeof p, "%s/%s", dir, files[f]) >= (int)sizeof p) continue;
    if (path_read_input(NULL, p, 64 << 20, &text, &len, e, sizeof e)) continue;
    struct json_doc j = { 0 };
    if (json_parse(&j, text, len, p, 0, e, sizeof e) == 0 && j.nodes[0].type == JSON_OBJECT) {
      struct ld l = { t, &j, p, e, sizeof e };
      const char *keys[2][3] = { { "bos_token_id", "eos_token_id", "pad_token_id" },
                                 { "bos_token", "eos_token", "pad_token" } };
      for (int w = 0; w < 3; w++) {
        int64_t *slot = w == 2 ? &t->pad : w ? &t->eos : &t->bos;
        int node = mem(&l, 0, keys[f][w]);
        if (node >= 0 && N(&l, node)->type == JSON_ARRAY) node = N(&l, node)->first;
        uint32_t v;
        if (f == 0 && node >= 0 && !read_id(&l, node, &v) && v < t->n_ids && *slot < 0)
          *slot = v;
        if (f == 1 && *slot < 0) {
          const char *s = str_of(&l, node);
          if (!s) s = str_of(&l, mem(&l, node, "content"));
          *slot = token_id(t, s);
        }
      }
    }
    json_free(&j);
    free(text);
  }
}

int tokenizer_load(struct tokenizer **out, const char *path, char *err, size_t err_size)
{
  *out = NULL;
  struct tokenizer *t = calloc(1, sizeof *t);
  struct json_doc *j = calloc(1, sizeof *j);
  char file[4200], dir[4200];
  struct stat st;
  if (!t || !j) {
    free(t);
    free(j);
    return errf(err, err_size, "%s: out of memory", path);
  }
  t->bos = t->eos = t->pad = -1;
  t->json_doc = j;
  tok_bytelevel_init();
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(file, sizeof file, "%s/tokenizer.json", path);
    snprintf(dir, sizeof dir, "%s", path);
  } else {
    snprintf(file, sizeof file, "%s", path);
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
  }
  t->path = strdup(file);
  size_t len;
  int rc = path_read_input("tokenizer", file, TOK_MAX_FILE_BYTES, &t->json_text, &len, err, err_size);
  if (rc) {
    if (rc == 2 || errno == ENOENT) err_mark_input();
    tokenizer_free(t);
    return -1;
  }
  struct ld l = { t, j, t->path, err, err_size };
  rc = json_parse(j, t->json_text, len, t->path, 0, err, err_size);
  if (rc) err_mark_input();
  if (!rc && j->nodes[0].type != JSON_OBJECT) rc = bad(&l, "not a JSON %s", "object");
  static const char *const known[] = { "version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "post_processor", "decoder", "model" };
  for (int c = rc ? -1 : j->nodes[0].first; c >= 0 && !rc; c = j->nodes[c].next) {
    size_t k = 0;
    while (k < sizeof known / sizeof *known && strcmp(known[k], j->nodes[c].key)) k++;
    if (k == sizeof known / sizeof *known) rc = bad(&l, "field \"%s\" is not read by tycho", j->nodes[c].key);
  }
  if (!rc && !is_null(&l, mem(&l, 0, "truncation"))) rc = bad(&l, "a %s setting is not read by tycho", "truncation");
  if (!rc && !is_null(&l, mem(&l, 0, "padding"))) rc = bad(&l, "a %s setting is not read by tycho", "padding");
  if (!rc && mem(&l, 0, "model") < 0) rc = bad(&l, "no %s", "model");
  if (!rc) rc = read_model(&l, mem(&l, 0, "model"));
  if (!rc) rc = read_normalizer(&l, mem(&l, 0, "normalizer"));
  if (!rc) rc = read_pre(&l, mem(&l, 0, "pre_tokenizer"));
  if (!rc) rc = read_decoder(&l, mem(&l, 0, "decoder"));
  if (!rc) rc = read_added(&l, mem(&l, 0, "added_tokens"));
  if (!rc) rc = prepare_added(&l);
  if (!rc) read_configs(t, dir);
  if (!rc) rc = read_post(&l, mem(&l, 0, "post_processor"));
  if (!rc && t->eos < 0) {
    static const char *const names[] = { "</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>" };
    for (size_t k = 0; k < sizeof names / sizeof *names && t->eos < 0; k++)
      for (int a = 0; a < t->n_added; a++)
        if (t->added[a].special && !strcmp(t->added[a].content, names[k])) t->eos = t->added[a].id;
  }
  if (!rc && t->n_ids == 0) rc = bad(&l, "an empty %s", "vocab");
  if (rc) {
    tokenizer_free(t);
    return -1;
  }
  *out = t;
  return 0;
}

void tokenizer_free(struct tokenizer *t)
{
  if (!t) return;
  for (int k = 0; k < t->n_pre; k++)
    if (t->pre[k].re) pcre2_code_free(t->pre[k].re);
  for (int k = 0; k < t->n_added; k++) free(t->added[k].match);
  free(t->added);
  free(t->vocab.key);
  free(t->vocab.klen);
  free(t->vocab.val);
  free(t->merges.key);
  free(t->merges.rank);
  free(t->merges.id);
  free(t->tok_str);
  free(t->tok_len);
  if (t->json_doc) json_free(t->json_doc);
  free(t->json_doc);
  free(t->json_text);
  free(t->path);
  free(t);
}

uint32_t tokenizer_n_ids(const struct tokenizer *t) { return t->n_ids; }
int64_t tokenizer_bos(const struct tokenizer *t) { return t->bos; }
int64_t tokenizer_eos(const struct tokenizer *t) { return t->eos; }
int64_t tokenizer_pad(const struct tokenizer *t) { return t->pad; }
const char *tokenizer_path(const struct tokenizer *t) { return t->path; }
