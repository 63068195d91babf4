/* Encoding and decoding with a loaded tokenizer (text/tokenizer.h), in the order the `tokenizers`
 * library runs its pipeline: the text split on added tokens that are not normalized, each piece
 * normalized and split on the normalized added tokens, each rest pre-tokenized into words, each
 * word through the BPE model. The model merges a word's symbols lowest rank first (leftmost on a
 * tie), as the library does, over a linked list of symbols with a binary heap of candidate
 * pairs; each worker caches word -> ids, since most words of a text repeat. */
#define _GNU_SOURCE /* memmem */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "util/err.h"
#include "util/hash.h"

/* ---- UTF-8 ---- */

/* The length of the well-formed sequence at s (Unicode Table 3-7), or the negated length of its
 * maximal ill-formed subpart (at least 1). */
static int utf8_step(const unsigned char *s, size_t n)
{
  unsigned c = s[0];
  if (c < 0x80) return 1;
  int need;
  unsigned lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) need = 1;
  else if (c == 0xe0) need = 2, lo = 0xa0;
  else if (c >= 0xe1 && c <= 0xec) need = 2;
  else if (c == 0xed) need = 2, hi = 0x9f;
  else if (c >= 0xee && c <= 0xef) need = 2;
  else if (c == 0xf0) need = 3, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) need = 3;
  else if (c == 0xf4) need = 3, hi = 0x8f;
  else return -1;
  for (int k = 1; k <= need; k++) {
    if ((size_t)k >= n || s[k] < lo || s[k] > hi) return -k;
    lo = 0x80, hi = 0xbf;
  }
  return need + 1;
}

int text_utf8_valid(const char *text, size_t n)
{
  const unsigned char *s = (const unsigned char *)text;
  for (size_t i = 0; i < n;) {
    int k = utf8_step(s + i, n - i);
    if (k < 0) return 0;
    i += (size_t)k;
  }
  return 1;
}

int text_utf8_clean(const char *text, size_t n, char **out, size_t *len)
{
  const unsigned char *s = (const unsigned char *)text;
  char *o = malloc(3 * n + 1); /* one byte becomes at most three */
  size_t m = 0;
  if (!o) return -1;
  for (size_t i = 0; i < n;) {
    int k = utf8_step(s + i, n - i);
    if (k > 0) {
      memcpy(o + m, s + i, (size_t)k);
      m += (size_t)k;
      i += (size_t)k;
    } else {
      memcpy(o + m, "\xef\xbf\xbd", 3);
      m += 3;
      i += (size_t)-k;
    }
  }
  o[m] = 0;
  *out = o;
  *len = m;
  return 0;
}

static uint32_t utf8_decode(const unsigned char *s, int k)
{
  if (k == 1) return s[0];
  uint32_t c = s[0] & (0x7f >> k);
  for (int i = 1; i < k; i++) c = c << 6 | (s[i] & 0x3f);
  return c;
}

/* ---- the byte-level alphabet ---- */

char tok_byte_char[256][3];
static int16_t byte_of_cp[324];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

static void bytelevel_build(void)
{
  char (*tab)[3] = tok_byte_char;
  int next = 256;
  for (int k = 0; k < 324; k++) byte_of_cp[k] = -1;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    int cp = printable ? b : next++;
    if (cp < 0x80) {
      tab[b][0] = (char)cp;
      tab[b][1] = 0;
    } else {
      tab[b][0] = (char)(0xc0 | cp >> 6);
      tab[b][1] = (char)(0x80 | (cp & 0x3f));
      tab[b][2] = 0;
    }
    byte_of_cp[cp] = (int16_t)b;
  }
}

void tok_bytelevel_init(void) { pthread_once(&bytelevel_once, bytelevel_build); }
int tok_bytelevel_byte(uint32_t cp) { return cp < 324 ? byte_of_cp[cp] : -1; }

/* ---- the vocab map ---- */

int tok_strmap_put(struct tok_strmap *m, const char *key, uint32_t klen, uint32_t val)
{
  size_t mask = m->cap - 1, h = (size_t)hash_fnv1a64_bytes(key, klen) & mask;
  while (m->key[h]) {
    if (m->klen[h] == klen && !memcmp(m->key[h], key, klen)) {
      m->val[h] = val;
      return 0;
    }
    h = (h + 1) & mask;
  }
  m->key[h] = key;
  m->klen[h] = klen;
  m->val[h] = val;
  return 0;
}

int64_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t klen)
{
  if (!m->cap) return -1;
  size_t mask = m->cap - 1, h = (size_t)hash_fnv1a64_bytes(key, klen) & mask;
  while (m->key[h]) {
    if (m->klen[h] == klen && !memcmp(m->key[h], key, klen)) return m->val[h];
    h = (h + 1) & mask;
  }
  return -1;
}

static int merge_get(const struct tok_mergemap *m, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *id)
{
  uint64_t key = (uint64_t)a << 32 | b;
  size_t mask = m->cap - 1, h = tok_merge_slot(m, key);
  while (m->key[h] != ~0ull) {
    if (m->key[h] == key) {
      *rank = m->rank[h];
      *id = m->id[h];
      return 1;
    }
    h = (h + 1) & mask;
  }
  return 0;
}

/* ---- growable byte strings and lists of pieces ---- */

struct buf {
  char *s;
  size_t n, cap;
};

static int buf_add(struct buf *b, const void *p, size_t n)
{
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) return -1;
    b->s = s;
    b->cap = cap;
  }
  memcpy(b->s + b->n, p, n);
  b->n += n;
  b->s[b->n] = 0;
  return 0;
}

struct pieces {
  struct buf text;
  size_t *off, *len;
  size_t n, cap;
};

static int pieces_add(struct pieces *p, const char *s, size_t n)
{
  if (n == 0) return 0; /* the library drops empty splits */
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 64;
    size_t *o = realloc(p->off, cap * sizeof *o);
    if (!o) return -1;
    p->off = o;
    size_t *l = realloc(p->len, cap * sizeof *l);
    if (!l) return -1;
    p->len = l;
    p->cap = cap;
  }
  p->off[p->n] = p->text.n;
  p->len[p->n++] = n;
  return buf_add(&p->text, s, n);
}

static void pieces_clear(struct pieces *p) { p->n = 0, p->text.n = 0; }

/* ---- workers ---- */

struct cache_entry {
  uint64_t hash;
  uint32_t key_off, key_len, ids_off, ids_n;
};

#define CACHE_MAX_WORD 256
#define CACHE_SLOTS (1u << 17)

struct tok_worker {
  const struct tokenizer *t;
  pcre2_match_data *md;
  pcre2_match_context *mc;
  pcre2_jit_stack *js;
  int re_error;                  /* the PCRE2 code of a failed match, 0 when none */
  struct pieces a, b, c;
  struct buf norm, tmp, sub;
  uint32_t *sym;
  int *prev, *next;
  uint64_t *heap;
  size_t sym_cap, heap_cap;
  struct cache_entry *cache;     /* CACHE_SLOTS, hash 0 free */
  size_t cache_used;
  struct buf cache_keys;
  struct tok_ids cache_ids;
};

struct tok_worker *tok_worker_new(const struct tokenizer *t)
{
  struct tok_worker *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->t = t;
  w->md = pcre2_match_data_create(16, NULL);
  w->cache = calloc(CACHE_SLOTS, sizeof *w->cache);
  /* a JIT stack that grows to 64 MiB: the default 32 KiB can fail on long runs of one class */
  w->mc = pcre2_match_context_create(NULL);
  w->js = pcre2_jit_stack_create(32 << 10, 64 << 20, NULL);
  if (w->mc && w->js) pcre2_jit_stack_assign(w->mc, NULL, w->js);
  if (!w->md || !w->cache || !w->mc || !w->js) {
    tok_worker_free(w);
    return NULL;
  }
  return w;
}

void tok_worker_free(struct tok_worker *w)
{
  if (!w) return;
  if (w->md) pcre2_match_data_free(w->md);
  if (w->mc) pcre2_match_context_free(w->mc);
  if (w->js) pcre2_jit_stack_free(w->js);
  free(w->a.text.s), free(w->a.off), free(w->a.len);
  free(w->b.text.s), free(w->b.off), free(w->b.len);
  free(w->c.text.s), free(w->c.off), free(w->c.len);
  free(w->norm.s), free(w->tmp.s), free(w->sub.s);
  free(w->sym), free(w->prev), free(w->next), free(w->heap);
  free(w->cache), free(w->cache_keys.s), free(w->cache_ids.v);
  free(w);
}

void tok_ids_free(struct tok_ids *ids)
{
  free(ids->v);
  ids->v = NULL;
  ids->n = ids->cap = 0;
}

static int ids_add(struct tok_ids *o, uint32_t id)
{
  if (o->n == o->cap) {
    size_t cap = o->cap ? 2 * o->cap : 1024;
    uint32_t *v = realloc(o->v, cap * sizeof *v);
    if (!v) return -1;
    o->v = v;
    o->cap = cap;
  }
  o->v[o->n++] = id;
  return 0;
}

/* ---- the BPE model ---- */

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
  size_t i = (*n)++;
  while (i > 0 && h[(i - 1) / 2] > v) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
  uint64_t top = h[0], v = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = v;
  return top;
}

static int bpe_word(struct tok_worker *w, const char *s, size_t n, struct tok_ids *out)
{
  const struct tokenizer *t = w->t;
  if (n + 1 > w->sym_cap) { /* at most one symbol a byte */
    size_t cap = 2 * n + 16;
    uint32_t *a = realloc(w->sym, cap * sizeof *a);
    int *b = realloc(w->prev, cap * sizeof *b), *c = realloc(w->next, cap * sizeof *c);
    uint64_t *h = realloc(w->heap, cap * sizeof *h);
    if (a) w->sym = a;
    if (b) w->prev = b;
    if (c) w->next = c;
    if (h) w->heap = h;
    if (!a || !b || !c || !h) return -1;
    w->sym_cap = w->heap_cap = cap;
  }
  int m = 0;
  int64_t unk = -1; /* a pending unknown (fused while fuse_unk) */
  for (size_t i = 0; i < n;) {
    int k = utf8_step((const unsigned char *)s + i, n - i);
    if (k < 0) k = -k;
    int64_t id = tok_strmap_get(&t->vocab, s + i, (size_t)k);
    if (id >= 0) {
      if (unk >= 0) w->sym[m++] = (uint32_t)unk, unk = -1;
      w->sym[m++] = (uint32_t)id;
    } else {
      int all = t->byte_fallback;
      for (int b = 0; all && b < k; b++) all = t->byte_id[(unsigned char)s[i + b]] >= 0;
      if (all) { /* as the library does, a pending unknown waits for the next known char */
        for (int b = 0; b < k; b++) w->sym[m++] = (uint32_t)t->byte_id[(unsigned char)s[i + b]];
      } else if (t->unk_id >= 0) {
        if (unk >= 0 && !t->fuse_unk) w->sym[m++] = (uint32_t)unk;
        unk = t->unk_id;
      }
    }
    i += (size_t)k;
  }
  if (unk >= 0) w->sym[m++] = (uint32_t)unk;
  size_t hn = 0;
  for (int i = 0; i < m; i++) {
    w->prev[i] = i - 1;
    w->next[i] = i + 1 < m ? i + 1 : -1;
    uint32_t rank, id;
    if (i + 1 < m && merge_get(&t->merges, w->sym[i], w->sym[i + 1], &rank, &id))
      heap_push(w->heap, &hn, (uint64_t)rank << 32 | (uint32_t)i);
  }
  /* sym[i] == UINT32_MAX marks a symbol merged into its left neighbour */
  while (hn) {
    uint64_t top = heap_pop(w->heap, &hn);
    int i = (int)(uint32_t)top, j = w->next[i];
    uint32_t rank, id;
    if (w->sym[i] == UINT32_MAX || j < 0 ||
        !merge_get(&t->merges, w->sym[i], w->sym[j], &rank, &id) || rank != (uint32_t)(top >> 32))
      continue;
    w->sym[i] = id;
    w->sym[j] = UINT32_MAX;
    w->next[i] = w->next[j];
    if (w->next[j] >= 0) w->prev[w->next[j]] = i;
    int p = w->prev[i], q = w->next[i];
    if (p >= 0 && merge_get(&t->merges, w->sym[p], w->sym[i], &rank, &id))
      heap_push(w->heap, &hn, (uint64_t)rank << 32 | (uint32_t)p);
    if (q >= 0 && merge_get(&t->merges, w->sym[i], w->sym[q], &rank, &id))
      heap_push(w->heap, &hn, (uint64_t)rank << 32 | (uint32_t)i);
  }
  for (int i = m ? 0 : -1; i >= 0; i = w->next[i])
    if (ids_add(out, w->sym[i])) return -1;
  return 0;
}

static int model_word(struct tok_worker *w, const char *s, size_t n, struct tok_ids *out)
{
  const struct tokenizer *t = w->t;
  if (t->ignore_merges) {
    int64_t id = tok_strmap_get(&t->vocab, s, n);
    if (id >= 0) return ids_add(out, (uint32_t)id);
  }
  if (n > CACHE_MAX_WORD) return bpe_word(w, s, n, out);
  uint64_t h = hash_fnv1a64_bytes(s, n) | 1;
  size_t slot = (size_t)h & (CACHE_SLOTS - 1);
  while (w->cache[slot].hash) {
    struct cache_entry *e = &w->cache[slot];
    if (e->hash == h && e->key_len == n && !memcmp(w->cache_keys.s + e->key_off, s, n)) {
      for (uint32_t k = 0; k < e->ids_n; k++)
        if (ids_add(out, w->cache_ids.v[e->ids_off + k])) return -1;
      return 0;
    }
    slot = (slot + 1) & (CACHE_SLOTS - 1);
  }
  size_t from = out->n;
  if (bpe_word(w, s, n, out)) return -1;
  if (w->cache_used >= CACHE_SLOTS / 2 || w->cache_keys.n > (64u << 20)) { /* full: start again */
    memset(w->cache, 0, CACHE_SLOTS * sizeof *w->cache);
    w->cache_used = w->cache_keys.n = w->cache_ids.n = 0;
    slot = (size_t)h & (CACHE_SLOTS - 1);
  }
  struct cache_entry e = { h, (uint32_t)w->cache_keys.n, (uint32_t)n, (uint32_t)w->cache_ids.n,
                           (uint32_t)(out->n - from) };
  if (buf_add(&w->cache_keys, s, n)) return -1;
  for (size_t k = from; k < out->n; k++)
    if (ids_add(&w->cache_ids, out->v[k])) return -1;
  w->cache[slot] = e;
  w->cache_used++;
  return 0;
}

/* ---- normalizers ---- */

static int replace_all(struct buf *o, const char *s, size_t n, const char *a, const char *b)
{
  size_t al = strlen(a), bl = strlen(b);
  o->n = 0;
  if (buf_add(o, "", 0)) return -1;
  for (size_t i = 0; i < n;) {
    if (i + al <= n && !memcmp(s + i, a, al)) {
      if (buf_add(o, b, bl)) return -1;
      i += al;
    } else {
      size_t j = i + 1;
      while (j < n && (unsigned char)s[j] != (unsigned char)a[0]) j++;
      if (buf_add(o, s + i, j - i)) return -1;
      i = j;
    }
  }
  return 0;
}

int tok_normalize(const struct tokenizer *t, const char *s, size_t n, char **out, size_t *len)
{
  struct buf x = { 0 }, y = { 0 };
  if (buf_add(&x, s, n)) return -1;
  for (int k = 0; k < t->n_norm; k++) {
    const struct tok_norm *m = &t->norm[k];
    y.n = 0;
    if (m->kind == NORM_PREPEND) {
      if (x.n && (buf_add(&y, m->a, strlen(m->a)) || buf_add(&y, x.s, x.n))) goto oom;
      if (!x.n && buf_add(&y, "", 0)) goto oom;
    } else if (replace_all(&y, x.s, x.n, m->a, m->b)) {
      goto oom;
    }
    struct buf z = x;
    x = y;
    y = z;
  }
  free(y.s);
  *out = x.s;
  *len = x.n;
  return 0;
oom:
  free(x.s);
  free(y.s);
  return -1;
}

/* ---- pre-tokenizers ---- */

struct part {
  size_t a, b;
  int match;
};

/* The parts of s as the library's Split makes them with `behavior` (tokenizers' own rules for
 * merging a match into its neighbour), into out. */
static int split_piece(struct tok_worker *w, const struct tok_pre *p, const char *s, size_t n,
                       const char *lit, struct pieces *out)
{
  struct part *parts = NULL;
  size_t np = 0, cap = 0, prev = 0, at = 0;
  int rc = 0;
#define PUSH(x, y, mm) do { if (np == cap) { cap = cap ? 2 * cap : 16; struct part *q = realloc(parts, cap * sizeof *q); \
      if (!q) { free(parts); return -1; } parts = q; } parts[np++] = (struct part){ (x), (y), (mm) }; } while (0)
  while (at <= n) {
    size_t ms, me;
    if (lit) {
      const char *f = n - at >= strlen(lit) ? memmem(s + at, n - at, lit, strlen(lit)) : NULL;
      if (!f) break;
      ms = (size_t)(f - s);
      me = ms + strlen(lit);
    } else {
      int r = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, w->md, w->mc);
      if (r == PCRE2_ERROR_NOMATCH) break;
      if (r < 0) { /* a limit reached: never taken for "no more matches" */
        w->re_error = r;
        free(parts);
        return -1;
      }
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
      ms = ov[0];
      me = ov[1];
    }
    if (prev != ms) PUSH(prev, ms, 0);
    PUSH(ms, me, 1);
    prev = me;
    if (me == ms) { /* an empty match: on past the next character */
      if (me >= n) break;
      int k = utf8_step((const unsigned char *)s + me, n - me);
      at = me + (size_t)(k < 0 ? -k : k);
    } else {
      at = me;
    }
  }
  if (prev != n) PUSH(prev, n, 0);
#undef PUSH
  if (p->invert)
    for (size_t k = 0; k < np; k++) parts[k].match = !parts[k].match;
  if (p->behavior == SPLIT_MERGED_NEXT) { /* walked backwards: a match joins the part after it */
    size_t nk = 0;
    int next_match = 0;
    for (size_t k = np; k-- > 0;) {
      struct part x = parts[k];
      if (x.match && !next_match && nk > 0) parts[np - nk].a = x.a;
      else parts[np - ++nk] = (struct part){ x.a, x.b, 0 };
      next_match = x.match;
    }
    memmove(parts, parts + np - nk, nk * sizeof *parts);
    np = nk;
  } else if (p->behavior == SPLIT_MERGED_PREV) {
    size_t nk = 0;
    int prev_match = 0;
    for (size_t k = 0; k < np; k++) {
      struct part x = parts[k];
      if (x.match && !prev_match && nk > 0) parts[nk - 1].b = x.b;
      else parts[nk++] = (struct part){ x.a, x.b, 0 };
      prev_match = x.match;
    }
    np = nk;
  }
  for (size_t k = 0; k < np && !rc; k++)
    if (!(p->behavior == SPLIT_REMOVED && parts[k].match))
      rc = pieces_add(out, s + parts[k].a, parts[k].b - parts[k].a);
  free(parts);
  return rc;
}

static int bytelevel_piece(struct tok_worker *w, const struct tok_pre *p, const char *s, size_t n,
                           struct pieces *out)
{
  struct buf *tmp = &w->tmp;
  tmp->n = 0;
  if (p->add_prefix_space && s[0] != ' ') {
    if (buf_add(tmp, " ", 1) || buf_add(tmp, s, n)) return -1;
    s = tmp->s;
    n = tmp->n;
  }
  struct pieces *sp = &w->c;
  pieces_clear(sp);
  if (p->use_regex) {
    struct tok_pre iso = *p;
    iso.behavior = SPLIT_ISOLATED;
    iso.invert = 0;
    if (split_piece(w, &iso, s, n, NULL, sp)) return -1;
  } else if (pieces_add(sp, s, n)) {
    return -1;
  }
  /* each piece's bytes as byte-level characters */
  for (size_t k = 0; k < sp->n; k++) {
    struct buf *sub = &w->sub;
    sub->n = 0;
    for (size_t i = 0; i < sp->len[k]; i++) {
      const char *c = tok_byte_char[(unsigned char)sp->text.s[sp->off[k] + i]];
      if (buf_add(sub, c, c[1] ? 2 : 1)) return -1;
    }
    if (pieces_add(out, sub->s, sub->n)) return -1;
  }
  return 0;
}

static int metaspace_piece(struct tok_worker *w, const struct tok_pre *p, const char *s, size_t n,
                           int at0, struct pieces *out)
{
  struct buf *tmp = &w->sub;
  size_t rl = strlen(p->rep);
  if (replace_all(tmp, s, n, " ", p->rep)) return -1;
  int starts = tmp->n >= rl && !memcmp(tmp->s, p->rep, rl);
  if (!starts && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && at0))) {
    struct buf *t2 = &w->tmp;
    t2->n = 0;
    if (buf_add(t2, p->rep, rl) || buf_add(t2, tmp->s, tmp->n)) return -1;
    tmp = t2;
  }
  if (!p->split) return pieces_add(out, tmp->s, tmp->n);
  struct tok_pre m = *p;
  m.behavior = SPLIT_MERGED_NEXT;
  m.invert = 0;
  return split_piece(w, &m, tmp->s, tmp->n, p->rep, out);
}

/* words of one piece of normalized text through the pre-tokenizers and the model */
static int words(struct tok_worker *w, const char *s, size_t n, int at0, struct tok_ids *out)
{
  const struct tokenizer *t = w->t;
  if (n == 0) return 0;
  if (t->n_pre == 0) return model_word(w, s, n, out);
  struct pieces *in = &w->a, *o = &w->b;
  pieces_clear(in);
  if (pieces_add(in, s, n)) return -1;
  for (int k = 0; k < t->n_pre; k++) {
    const struct tok_pre *p = &t->pre[k];
    pieces_clear(o);
    for (size_t i = 0; i < in->n; i++) {
      const char *x = in->text.s + in->off[i];
      size_t xn = in->len[i];
      int rc = p->kind == PRE_BYTELEVEL ? bytelevel_piece(w, p, x, xn, o)
             : p->kind == PRE_METASPACE ? metaspace_piece(w, p, x, xn, at0 && i == 0, o)
             : split_piece(w, p, x, xn, NULL, o);
      if (rc) return -1;
    }
    struct pieces *z = in;
    in = o;
    o = z;
  }
  for (size_t i = 0; i < in->n; i++)
    if (model_word(w, in->text.s + in->off[i], in->len[i], out)) return -1;
  return 0;
}

/* The first added token (of the normalized ones or the others) in s[from, n), leftmost-longest:
 * its index and place, or -1. */
static int find_added(const struct tokenizer *t, int normalized, const char *s, size_t n, size_t from,
                      size_t *at)
{
  const unsigned char *first = normalized ? t->first_norm : t->first_raw;
  for (size_t i = from; i < n; i++) {
    if (!first[(unsigned char)s[i]]) continue;
    for (int k = 0; k < t->n_added; k++) {
      const struct tok_added *a = &t->added[k];
      if (a->normalized == normalized && a->match_len <= n - i && !memcmp(s + i, a->match, a->match_len)) {
        *at = i;
        return k;
      }
    }
  }
  return -1;
}

/* one piece between raw added tokens: normalized, split on the normalized added tokens */
static int segment(struct tok_worker *w, const char *s, size_t n, int at0, struct tok_ids *out)
{
  const struct tokenizer *t = w->t;
  char *norm = NULL;
  size_t nn = n;
  if (n == 0) return 0;
  if (t->n_norm) {
    if (tok_normalize(t, s, n, &norm, &nn)) return -1;
    s = norm;
  }
  int rc = 0;
  size_t from = 0;
  while (!rc && t->any_norm_added) {
    size_t at;
    int k = find_added(t, 1, s, nn, from, &at);
    if (k < 0) break;
    rc = words(w, s + from, at - from, at0 && from == 0, out);
    if (!rc) rc = ids_add(out, t->added[k].id);
    from = at + t->added[k].match_len;
  }
  if (!rc) rc = words(w, s + from, nn - from, at0 && from == 0, out);
  free(norm);
  return rc;
}

int tok_encode(struct tok_worker *w, const char *text, size_t n, struct tok_ids *out, char *err,
               size_t err_size)
{
  const struct tokenizer *t = w->t;
  size_t from = 0;
  int rc = 0;
  while (!rc && t->any_raw_added) {
    size_t at;
    int k = find_added(t, 0, text, n, from, &at);
    if (k < 0) break;
    rc = segment(w, text + from, at - from, from == 0, out);
    if (!rc) rc = ids_add(out, t->added[k].id);
    from = at + t->added[k].match_len;
  }
  if (!rc) rc = segment(w, text + from, n - from, from == 0, out);
  if (rc && w->re_error) {
    PCRE2_UCHAR m[256];
    pcre2_get_error_message(w->re_error, m, sizeof m);
    w->re_error = 0;
    return errf(err, err_size, "%s: a pre-tokenizer's regex failed on this text: %s", t->path,
                (const char *)m);
  }
  return rc ? errf(err, err_size, "%s: out of memory while encoding", t->path) : 0;
}

/* ---- decoding ---- */

struct toks {
  struct buf *v;
  size_t n;
};

static void toks_free(struct toks *l)
{
  for (size_t k = 0; k < l->n; k++) free(l->v[k].s);
  free(l->v);
  l->v = NULL;
  l->n = 0;
}

static int toks_push(struct toks *l, const char *s, size_t n)
{
  struct buf *v = realloc(l->v, (l->n + 1) * sizeof *v);
  if (!v) return -1;
  l->v = v;
  memset(&v[l->n], 0, sizeof *v);
  return buf_add(&v[l->n++], s, n);
}

static int is_byte_token(const char *s, size_t n, unsigned *b)
{
  static const char hex[] = "0123456789ABCDEF";
  if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
  const char *h = strchr(hex, s[3]), *l = strchr(hex, s[4]);
  if (!h || !l || !s[3] || !s[4]) return 0;
  *b = (unsigned)((h - hex) * 16 + (l - hex));
  return 1;
}

/* lossy UTF-8 of bytes into a token (Rust's from_utf8_lossy: the maximal subparts) */
static int push_lossy(struct toks *o, const char *s, size_t n)
{
  char *c;
  size_t cn;
  if (text_utf8_clean(s, n, &c, &cn)) return -1;
  int rc = toks_push(o, c, cn);
  free(c);
  return rc;
}

static int decode_step(const struct tok_dec *d, struct toks *in, struct toks *o)
{
  struct buf acc = { 0 };
  int rc = 0;
  if (d->kind == DEC_BYTELEVEL || d->kind == DEC_FUSE) {
    if (buf_add(&acc, "", 0)) return -1;
    for (size_t k = 0; k < in->n && !rc; k++) {
      const unsigned char *s = (const unsigned char *)in->v[k].s;
      size_t n = in->v[k].n, start = acc.n;
      if (d->kind == DEC_FUSE) { rc = buf_add(&acc, s, n); continue; }
      int raw = 0; /* a token with a character outside the alphabet goes in as it is */
      for (size_t i = 0; i < n && !rc;) {
        int l = utf8_step(s + i, n - i);
        int b = l > 0 ? tok_bytelevel_byte(utf8_decode(s + i, l)) : -1;
        if (b < 0) { raw = 1; break; }
        unsigned char c = (unsigned char)b;
        rc = buf_add(&acc, &c, 1);
        i += (size_t)l;
      }
      if (raw) {
        acc.n = start;
        rc = buf_add(&acc, s, n);
      }
    }
    if (!rc) rc = d->kind == DEC_FUSE ? toks_push(o, acc.s, acc.n) : push_lossy(o, acc.s, acc.n);
  } else if (d->kind == DEC_BYTEFALLBACK) {
    for (size_t k = 0; k <= in->n && !rc; k++) {
      unsigned b;
      if (k < in->n && is_byte_token(in->v[k].s, in->v[k].n, &b)) {
        unsigned char c = (unsigned char)b;
        rc = buf_add(&acc, &c, 1);
        continue;
      }
      if (acc.n) {
        if (text_utf8_valid(acc.s, acc.n)) rc = toks_push(o, acc.s, acc.n);
        for (size_t i = 0; !text_utf8_valid(acc.s, acc.n) && i < acc.n && !rc; i++)
          rc = toks_push(o, "\xef\xbf\xbd", 3); /* the library gives one U+FFFD a byte */
        acc.n = 0;
      }
      if (k < in->n && !rc) rc = toks_push(o, in->v[k].s, in->v[k].n);
    }
  } else {
    for (size_t k = 0; k < in->n && !rc; k++) {
      struct buf x = { 0 };
      const char *s = in->v[k].s;
      size_t n = in->v[k].n;
      if (d->kind == DEC_REPLACE || d->kind == DEC_METASPACE) {
        rc = replace_all(&x, s, n, d->kind == DEC_REPLACE ? d->a : d->rep, d->kind == DEC_REPLACE ? d->b : " ");
        size_t cut = d->kind == DEC_METASPACE && k == 0 && d->prepend != PREPEND_NEVER && x.n && x.s[0] == ' ';
        if (!rc) rc = toks_push(o, x.s + cut, x.n - cut);
      } else { /* Strip: up to start leading and stop trailing copies of the content */
        size_t cl = strlen(d->a), a = 0, b = n;
        for (int i = 0; i < d->start && a + cl <= b && !memcmp(s + a, d->a, cl); i++) a += cl;
        for (int i = 0; i < d->stop && b >= a + cl && !memcmp(s + b - cl, d->a, cl); i++) b -= cl;
        rc = toks_push(o, s + a, b - a);
      }
      free(x.s);
    }
  }
  free(acc.s);
  return rc;
}

int tok_decode(const struct tokenizer *t, const uint32_t *ids, size_t n, char **out, size_t *len,
               char *err, size_t err_size)
{
  struct toks a = { 0 }, b = { 0 };
  int rc = 0;
  for (size_t k = 0; k < n && !rc; k++)
    if (ids[k] < t->n_ids && t->tok_str[ids[k]]) rc = toks_push(&a, t->tok_str[ids[k]], t->tok_len[ids[k]]);
  for (int k = 0; k < t->n_dec && !rc; k++) {
    rc = decode_step(&t->dec[k], &a, &b);
    toks_free(&a);
    a = b;
    b = (struct toks){ 0 };
  }
  struct buf all = { 0 };
  if (!rc) rc = buf_add(&all, "", 0);
  for (size_t k = 0; k < a.n && !rc; k++) /* without a decoder the library joins with spaces */
    rc = (k && !t->has_decoder ? buf_add(&all, " ", 1) : 0) || buf_add(&all, a.v[k].s, a.v[k].n);
  toks_free(&a);
  toks_free(&b);
  if (rc) {
    free(all.s);
    return errf(err, err_size, "%s: out of memory while decoding", t->path);
  }
  *out = all.s;
  *len = all.n;
  return 0;
}
