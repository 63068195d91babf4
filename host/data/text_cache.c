/* data.text's token cache (text_cache.h): the key, the file, and the texts tokenized into it. */
#define _GNU_SOURCE /* pwrite */
#include "data/text_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/tokens.h"
#include "text/tokenizer.h"
#include "util/err.h"
#include "util/file.h"
#include "util/path.h"

/* Bumped when the cache's encoding changes (what a document is, the eos rule), so that old
 * caches are not read as new ones. */
#define TEXT_CACHE_FORMAT "tycho text cache 1: one document a file, eos after each"

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

/* file k of data.text mapped; a missing file or anything but a regular file is an input error */
static int map_text(const struct plan *p, int k, struct file_map *m, char *err, size_t n)
{
  char what[64];
  snprintf(what, sizeof what, "data.text[%d]", k + 1);
  struct stat st;
  if (stat(p->data.text[k], &st) != 0)
    return errf_input(err, n, "%s: %s %s: %s%s%s%s", plan_where(p, "data.text"), what, p->data.text[k], strerror(errno),
                      p->data.fetch[0] ? "; run " : "", p->data.fetch, p->data.fetch[0] ? " to fetch it (data.fetch)" : "");
  if (file_map(what, p->data.text[k], 0, m, err, n)) {
    if (S_ISREG(st.st_mode))
      return -1;
    char why[1200];
    snprintf(why, sizeof why, "%s", err);
    return errf_input(err, n, "%s: %s", plan_where(p, "data.text"), why);
  }
  return 0;
}

/* The tokenizer.json that data.tokenizer names (itself, or the one in the folder it names). */
static int tokenizer_file(const struct plan *p, char *out, size_t size, char *err, size_t n)
{
  struct stat st;
  if (stat(p->data.tokenizer, &st) != 0)
    return errf_input(err, n, "%s: data.tokenizer %s: %s", plan_where(p, "data.tokenizer"), p->data.tokenizer,
                      strerror(errno));
  if (S_ISDIR(st.st_mode))
    snprintf(out, size, "%s/tokenizer.json", p->data.tokenizer);
  else
    snprintf(out, size, "%s", p->data.tokenizer);
  return 0;
}

int text_cache_locate(const struct plan *p, struct text_cache_info *info, char *err, size_t n)
{
  memset(info, 0, sizeof *info);
  if (tokenizer_file(p, info->tokenizer, sizeof info->tokenizer, err, n))
    return -1;
  uint64_t h = fnv(0xcbf29ce484222325ull, TEXT_CACHE_FORMAT, sizeof TEXT_CACHE_FORMAT);
  struct file_map m;
  for (int k = 0; k < p->data.n_text; k++) {
    if (map_text(p, k, &m, err, n))
      return -1;
    uint64_t bytes = m.bytes;
    h = fnv(h, &bytes, sizeof bytes);
    h = fnv(h, m.data, m.bytes);
    info->text_bytes += bytes;
    file_unmap(&m);
  }
  err_class_reset();
  if (file_map("data.tokenizer", info->tokenizer, 0, &m, err, n)) {
    char why[1200];
    snprintf(why, sizeof why, "%s", err);
    return errf_input(err, n, "%s: %s", plan_where(p, "data.tokenizer"), why);
  }
  uint64_t bytes = m.bytes;
  h = fnv(h, &bytes, sizeof bytes);
  h = fnv(h, m.data, m.bytes);
  file_unmap(&m);
  /* the files beside it whose bos and eos ids the tokenizer takes (tokenizer.h): a changed eos
   * changes what follows each document. Absent ones add nothing, so a lone tokenizer.json keeps
   * its key. */
  static const char *const beside[2] = { "config.json", "tokenizer_config.json" };
  const char *slash = strrchr(info->tokenizer, '/');
  for (int f = 0; f < 2; f++) {
    char path[PLAN_PATH_MAX + 64];
    struct stat cs;
    snprintf(path, sizeof path, "%.*s%s", slash ? (int)(slash - info->tokenizer + 1) : 0, info->tokenizer, beside[f]);
    if (stat(path, &cs) != 0 || !S_ISREG(cs.st_mode) || file_map(beside[f], path, 0, &m, err, n))
      continue;
    bytes = m.bytes;
    h = fnv(h, beside[f], strlen(beside[f]) + 1);
    h = fnv(h, &bytes, sizeof bytes);
    h = fnv(h, m.data, m.bytes);
    file_unmap(&m);
  }
  err_class_reset();
  err[0] = 0;
  snprintf(info->path, sizeof info->path, "%s/text-%016" PRIx64 ".bin", TEXT_CACHE_DIR, h);
  struct stat st;
  info->cached = stat(info->path, &st) == 0 && S_ISREG(st.st_mode);
  return 0;
}

/* The texts through tok into the llm.c file at path, atomically. */
static int write_cache(const struct plan *p, const struct tokenizer *tok, const char *path, uint64_t *n_tokens,
                       char *err, size_t n)
{
  const int version = tokenizer_n_ids(tok) <= 65536 ? TOKENS_VERSION : TOKENS_VERSION_U32;
  const int64_t eos = tokenizer_eos(tok);
  struct tok_worker *w = tok_worker_new(tok);
  if (!w)
    return errf(err, n, "data.text: out of memory");
  /* written as PATH.<pid> (itself atomically, through PATH.<pid>.tmp), then renamed over PATH:
   * two runs making the same cache at once each write a file of their own, and PATH is always
   * one of them whole */
  char mine[4096];
  if (snprintf(mine, sizeof mine, "%s.%ld", path, (long)getpid()) >= (int)sizeof mine) {
    tok_worker_free(w);
    return errf(err, n, "data.text: the cache path %s is too long", path);
  }
  struct file_atomic a;
  if (file_atomic_begin(&a, "data.text's token cache", mine, err, n)) {
    tok_worker_free(w);
    return -1;
  }
  int32_t header[256] = { 0 };
  int rc = file_atomic_write(&a, header, sizeof header, err, n);
  uint64_t count = 0;
  void *buf = NULL;
  for (int k = 0; k < p->data.n_text && !rc; k++) {
    struct file_map m;
    struct tok_ids ids = { 0 };
    char *clean = NULL;
    size_t len = 0;
    if ((rc = map_text(p, k, &m, err, n)) != 0)
      break;
    const char *text = m.data ? m.data : "";
    len = m.bytes;
    if (!text_utf8_valid(text, len) && text_utf8_clean(text, len, &clean, &len))
      rc = errf(err, n, "data.text: out of memory");
    char why[1024];
    if (!rc && tok_encode(w, clean ? clean : text, len, &ids, why, sizeof why))
      rc = errf(err, n, "data.text[%d] %s: %s", k + 1, p->data.text[k], why);
    free(clean);
    file_unmap(&m);
    if (!rc && eos >= 0) {
      uint32_t e = (uint32_t)eos;
      if (ids.n == ids.cap) {
        uint32_t *v = realloc(ids.v, (ids.cap + 1) * sizeof *v);
        if (!v)
          rc = errf(err, n, "data.text: out of memory");
        else
          ids.v = v, ids.cap++;
      }
      if (!rc)
        ids.v[ids.n++] = e;
    }
    const size_t unit = version == TOKENS_VERSION ? 2 : 4;
    if (!rc && ids.n && !(buf = realloc(buf, ids.n * unit)))
      rc = errf(err, n, "data.text: out of memory");
    for (size_t i = 0; !rc && i < ids.n; i++) {
      if (unit == 2)
        ((uint16_t *)buf)[i] = (uint16_t)ids.v[i];
      else
        ((uint32_t *)buf)[i] = ids.v[i];
    }
    count += ids.n;
    if (!rc && count > INT32_MAX)
      rc = errf_input(err, n, "data.text: more than %d tokens: the llm.c header counts them in an int32", INT32_MAX);
    if (!rc && ids.n)
      rc = file_atomic_write(&a, buf, ids.n * unit, err, n);
    tok_ids_free(&ids);
  }
  free(buf);
  tok_worker_free(w);
  if (!rc) {
    header[0] = TOKENS_MAGIC;
    header[1] = version;
    header[2] = (int32_t)count;
    if (pwrite(a.fd, header, sizeof header, 0) != (ssize_t)sizeof header)
      rc = errf(err, n, "cannot write %s: %s", a.tmp, strerror(errno));
  }
  if (file_atomic_end(&a, !rc, err, n) && !rc)
    rc = -1;
  if (!rc && rename(mine, path) != 0) {
    rc = errf(err, n, "cannot rename %s to %s: %s", mine, path, strerror(errno));
    unlink(mine);
  }
  *n_tokens = count;
  return rc ? -1 : 0;
}

int text_cache_make(const struct plan *p, struct text_cache_info *info, int *made, uint64_t *n_tokens,
                    char *err, size_t n)
{
  *made = 0;
  *n_tokens = 0;
  if (text_cache_locate(p, info, err, n))
    return -1;
  err_class_reset();
  struct tokenizer *tok;
  char why[1536];
  if (tokenizer_load(&tok, p->data.tokenizer, why, sizeof why)) {
    if (err_class_is_input() || errno == ENOENT)
      return errf_input(err, n, "%s: data.tokenizer: %s", plan_where(p, "data.tokenizer"), why);
    return errf(err, n, "data.tokenizer: %s", why);
  }
  int rc = 0;
  if (tokenizer_n_ids(tok) > (uint32_t)p->model.vocab)
    rc = errf_input(err, n, "%s: data.tokenizer %s has %" PRIu32 " ids, more than model.vocab = %d; give a "
                    "model.vocab of at least %" PRIu32, plan_where(p, "data.tokenizer"), p->data.tokenizer,
                    tokenizer_n_ids(tok), p->model.vocab, tokenizer_n_ids(tok));
  if (!rc && !info->cached) {
    if (mkdir(TEXT_CACHE_DIR, 0755) != 0 && errno != EEXIST)
      rc = errf(err, n, "data.text: cannot make the cache folder %s: %s", TEXT_CACHE_DIR, strerror(errno));
    if (!rc)
      rc = write_cache(p, tok, info->path, n_tokens, err, n);
    *made = !rc;
    info->cached = !rc;
  }
  tokenizer_free(tok);
  return rc;
}

int text_cache_prepare(const struct plan *p, FILE *out, char *err, size_t n)
{
  struct text_cache_info info;
  int made;
  uint64_t tokens;
  if (text_cache_make(p, &info, &made, &tokens, err, n))
    return -1;
  if (out && made)
    fprintf(out, "data.text: %d file%s (%" PRIu64 " bytes) tokenized with %s into %s: %" PRIu64 " tokens\n",
            p->data.n_text, p->data.n_text == 1 ? "" : "s", info.text_bytes, info.tokenizer, info.path, tokens);
  else if (out)
    fprintf(out, "data.text: %d file%s (%" PRIu64 " bytes) already tokenized with %s: %s\n", p->data.n_text,
            p->data.n_text == 1 ? "" : "s", info.text_bytes, info.tokenizer, info.path);
  if (out)
    fflush(out);
  return 0;
}
