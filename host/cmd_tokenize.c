/* `tycho tokenize TOKENIZER FILE... --out OUT.bin [--no-eos] [--threads N]`: text files (one
 * document each) or .jsonl files (one document a line, its "text" field) through a Hugging Face
 * tokenizer (text/tokenizer.h) into one llm.c token file, each document followed by the
 * tokenizer's eos id where it has one. Documents are encoded on several threads in batches and
 * written in input order, so memory holds one batch of ids, not the corpus. The file is written
 * whole or not at all (util/file.h, an atomic replacement); its header says version 1 (uint16
 * tokens) when every id of the tokenizer is below 65536, else version 2 (uint32). Bad inputs are
 * refused with exit 2 naming the file (and line). */
#define _GNU_SOURCE /* sched_getaffinity */
#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "data/tokens.h"
#include "text/tokenizer.h"
#include "util/err.h"
#include "util/file.h"
#include "util/json.h"
#include "util/path.h"

#define BATCH_BYTES (32u << 20)
#define BATCH_DOCS 65536

struct doc {
  const char *text;   /* into the file's mapping */
  size_t len;
  int file;
  long line;          /* .jsonl: 1-based; 0 for a whole file */
};

struct job {
  const struct tokenizer *tok;
  char *const *files;
  struct doc *docs;
  struct tok_ids *ids;
  size_t n_docs, next;
  pthread_mutex_t lock;
  struct tok_worker **workers;  /* one a thread, kept over the batches (their word caches) */
  int next_worker;
  int failed, input_error;
  size_t failed_doc;
  char err[1024];
};

/* One document's text as valid UTF-8 (a .jsonl line's "text"), malloc'd into *out. */
static int doc_text(const struct job *jb, const struct doc *d, char **out, size_t *len, char *err,
                    size_t n)
{
  if (!d->line) {
    if (text_utf8_valid(d->text, d->len)) {
      *out = NULL;
      *len = d->len;
      return 0;
    }
    return text_utf8_clean(d->text, d->len, out, len) ? errf(err, n, "out of memory") : 0;
  }
  struct json_doc j = { 0 };
  char name[4200], why[768];
  snprintf(name, sizeof name, "%s:%ld", jb->files[d->file], d->line);
  if (json_parse(&j, d->text, d->len, name, 0, why, sizeof why)) {
    json_free(&j);
    return errf_input(err, n, "%s", why);
  }
  int t = j.nodes[0].type == JSON_OBJECT ? json_member(&j, 0, "text") : -1;
  if (t < 0 || j.nodes[t].type != JSON_STRING) {
    json_free(&j);
    return errf_input(err, n, "%s: no string \"text\" field", name);
  }
  *out = strdup(j.nodes[t].str);
  *len = *out ? strlen(*out) : 0;
  json_free(&j);
  return *out ? 0 : errf(err, n, "out of memory");
}

static void *worker(void *arg)
{
  struct job *jb = arg;
  pthread_mutex_lock(&jb->lock);
  struct tok_worker *w = jb->workers[jb->next_worker++];
  pthread_mutex_unlock(&jb->lock);
  char err[1024];
  for (;;) {
    pthread_mutex_lock(&jb->lock);
    size_t k = jb->next++;
    int stop = jb->failed;
    pthread_mutex_unlock(&jb->lock);
    if (k >= jb->n_docs || stop) break;
    const struct doc *d = &jb->docs[k];
    char *text = NULL;
    size_t len = 0;
    err_class_reset();
    int rc = w ? 0 : errf(err, sizeof err, "out of memory");
    if (!rc) rc = doc_text(jb, d, &text, &len, err, sizeof err);
    if (!rc) rc = tok_encode(w, text ? text : d->text, len, &jb->ids[k], err, sizeof err);
    free(text);
    if (rc) {
      pthread_mutex_lock(&jb->lock);
      if (!jb->failed || k < jb->failed_doc) { /* the first document's failure is reported */
        jb->failed = 1;
        jb->failed_doc = k;
        jb->input_error = err_class_is_input();
        snprintf(jb->err, sizeof jb->err, "%s", err);
      }
      pthread_mutex_unlock(&jb->lock);
    }
  }
  return NULL;
}

static int ends_with(const char *s, const char *tail)
{
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && !strcmp(s + a - b, tail);
}

/* The output path, checked before any work: not a link, not a special file, in a folder. */
static int check_out(const char *path, char *err, size_t n)
{
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
    return errf(err, n, "--out %s: is a symbolic link; give the file itself", path), 2;
  int rc = path_check_output("--out", path, err, n);
  if (rc) return rc == 2 ? 2 : 1;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) {
    slash[slash == dir ? 1 : 0] = 0;
    int missing = stat(dir, &st) != 0;
    if (missing || !S_ISDIR(st.st_mode))
      return errf(err, n, "--out %s: %s %s", path, dir, missing ? "does not exist" : "is not a folder"), 2;
  }
  return 0;
}

struct run {
  struct file_atomic a;
  int open, version;
  uint64_t n_tokens;
  char *buf;           /* tokens not yet written: flushed at 1 MiB and at each batch's end */
  size_t used, cap;
};

static int flush_ids(struct run *r, char *err, size_t n)
{
  int rc = r->used ? file_atomic_write(&r->a, r->buf, r->used, err, n) : 0;
  r->used = 0;
  return rc;
}

/* one document's ids (and eos) appended to the file */
static int write_ids(struct run *r, const struct tok_ids *ids, int64_t eos, char *err, size_t n)
{
  size_t count = ids->n + (eos >= 0), unit = r->version == 1 ? 2 : 4;
  if (r->used + count * unit > r->cap) {
    size_t cap = r->cap ? r->cap : 1 << 20;
    while (cap < r->used + count * unit) cap *= 2;
    char *b = realloc(r->buf, cap);
    if (!b) return errf(err, n, "out of memory");
    r->buf = b;
    r->cap = cap;
  }
  for (size_t k = 0; k < count; k++) {
    uint32_t v = k < ids->n ? ids->v[k] : (uint32_t)eos;
    if (unit == 2) memcpy(r->buf + r->used + 2 * k, &(uint16_t){ (uint16_t)v }, 2);
    else memcpy(r->buf + r->used + 4 * k, &v, 4);
  }
  r->used += count * unit;
  r->n_tokens += count;
  if (r->n_tokens > INT32_MAX)
    return errf(err, n, "more than %d tokens: the llm.c header counts them in an int32", INT32_MAX);
  return r->used >= (1u << 20) ? flush_ids(r, err, n) : 0;
}

int cmd_tokenize(lua_State *L, int argc, char **argv)
{
  const char *out = NULL, *tokpath = NULL;
  int no_eos = 0, threads = 0;
  char **files = calloc((size_t)argc, sizeof *files);
  int n_files = 0;
  if (!files) return host_fail(L, EXIT_RUNTIME, "out of memory");
  for (int k = 2; k < argc; k++) {
    if (!strcmp(argv[k], "--out") && k + 1 < argc) {
      out = argv[++k];
    } else if (!strcmp(argv[k], "--no-eos")) {
      no_eos = 1;
    } else if (!strcmp(argv[k], "--threads") && k + 1 < argc) {
      char *end;
      long v = strtol(argv[++k], &end, 10);
      if (*end || end == argv[k] || v < 1 || v > 256)
        return host_fail(L, EXIT_USAGE, "--threads %s: give a whole number of threads, 1..256", argv[k]);
      threads = (int)v;
    } else if (!strcmp(argv[k], "--out") || !strcmp(argv[k], "--threads")) {
      return host_fail(L, EXIT_USAGE, "%s needs a value (tycho tokenize --help)", argv[k]);
    } else if (argv[k][0] == '-' && argv[k][1]) {
      return host_fail(L, EXIT_USAGE, "tokenize: unknown option '%s' (tycho tokenize --help)", argv[k]);
    } else if (!tokpath) {
      tokpath = argv[k];
    } else {
      files[n_files++] = argv[k];
    }
  }
  if (!tokpath || !n_files || !out)
    return host_fail(L, EXIT_USAGE, "usage: tycho tokenize TOKENIZER FILE... --out OUT.bin [--no-eos] [--threads N]");
  char err[2048];
  int rc = check_out(out, err, sizeof err);
  if (rc) return host_fail(L, rc, "%s", err);
  if (!threads) { /* the CPUs this process may run on (taskset, a launcher's binding) */
    cpu_set_t set;
    long c = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    threads = c < 1 ? 1 : c > 64 ? 64 : (int)c;
  }
  err_class_reset();
  struct tokenizer *tok;
  if (tokenizer_load(&tok, tokpath, err, sizeof err))
    return host_fail(L, err_class_is_input() ? EXIT_USAGE : EXIT_RUNTIME, "%s", err);

  /* every input mapped and cut into documents before anything is written */
  struct file_map *maps = calloc((size_t)n_files, sizeof *maps);
  struct doc *docs = NULL;
  size_t n_docs = 0, cap_docs = 0, total = 0;
  if (!maps) rc = EXIT_RUNTIME, snprintf(err, sizeof err, "out of memory");
  for (int f = 0; f < n_files && !rc; f++) {
    err_class_reset();
    if (file_map("input", files[f], 0, &maps[f], err, sizeof err)) {
      rc = err_class_is_input() || errno == ENOENT ? EXIT_USAGE : EXIT_RUNTIME;
      break;
    }
    const char *s = maps[f].data;
    size_t n = maps[f].bytes, at = 0;
    total += n;
    for (long line = 1; at < n || (!ends_with(files[f], ".jsonl") && line == 1); line++) {
      struct doc d = { s + at, n - at, f, 0 };
      if (ends_with(files[f], ".jsonl")) {
        const char *nl = memchr(s + at, '\n', n - at);
        d.len = nl ? (size_t)(nl - (s + at)) : n - at;
        d.line = line;
        at += d.len + (nl != NULL);
        size_t b = 0;
        while (b < d.len && strchr(" \t\r", d.text[b])) b++;
        if (b == d.len) continue; /* a blank line holds no document */
      } else {
        at = n;
      }
      if (n_docs == cap_docs) {
        cap_docs = cap_docs ? 2 * cap_docs : 1024;
        struct doc *x = realloc(docs, cap_docs * sizeof *x);
        if (!x) { rc = EXIT_RUNTIME; snprintf(err, sizeof err, "out of memory"); break; }
        docs = x;
      }
      docs[n_docs++] = d;
      if (!n) break;
    }
  }

  struct run r = { .version = tokenizer_n_ids(tok) <= 65536 ? 1 : 2 };
  int64_t eos = no_eos ? -1 : tokenizer_eos(tok);
  if (!rc && file_atomic_begin(&r.a, "--out", out, err, sizeof err)) rc = EXIT_RUNTIME;
  r.open = !rc;
  int32_t header[256] = { 0 };
  if (!rc && file_atomic_write(&r.a, header, sizeof header, err, sizeof err)) rc = EXIT_RUNTIME;
  const int progress = isatty(2) && total > BATCH_BYTES;
  size_t done_bytes = 0;
  struct tok_ids *ids = calloc(BATCH_DOCS, sizeof *ids);
  struct tok_worker **workers = calloc((size_t)threads, sizeof *workers);
  int oom = !ids || !workers;
  for (int k = 0; workers && k < threads; k++)
    if (!(workers[k] = tok_worker_new(tok))) oom = 1;
  if (oom && !rc) rc = EXIT_RUNTIME, snprintf(err, sizeof err, "out of memory");
  for (size_t first = 0; first < n_docs && !rc;) {
    size_t last = first, bytes = 0;
    while (last < n_docs && last - first < BATCH_DOCS && (bytes < BATCH_BYTES || last == first))
      bytes += docs[last++].len;
    struct job jb = { .tok = tok, .files = files, .docs = docs + first, .ids = ids, .n_docs = last - first,
                      .workers = workers };
    pthread_mutex_init(&jb.lock, NULL);
    int nt = threads < (int)jb.n_docs ? threads : (int)jb.n_docs;
    pthread_t th[256];
    int started = 0;
    for (int k = 1; k < nt; k++)
      if (pthread_create(&th[started], NULL, worker, &jb) == 0) started++;
    worker(&jb);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    pthread_mutex_destroy(&jb.lock);
    if (jb.failed) {
      rc = jb.input_error ? EXIT_USAGE : EXIT_RUNTIME;
      const struct doc *d = &docs[first + jb.failed_doc];
      if (d->line || jb.input_error) snprintf(err, sizeof err, "%s", jb.err);
      else snprintf(err, sizeof err, "%s: %s", files[d->file], jb.err);
    }
    for (size_t k = 0; k < jb.n_docs; k++) {
      if (!rc && write_ids(&r, &ids[k], eos, err, sizeof err)) rc = EXIT_RUNTIME;
      tok_ids_free(&ids[k]);
    }
    if (!rc && flush_ids(&r, err, sizeof err)) rc = EXIT_RUNTIME;
    done_bytes += bytes;
    first = last;
    if (progress)
      fprintf(stderr, "\rtokenize: %zu of %zu MiB, %" PRIu64 " tokens", done_bytes >> 20, total >> 20,
              r.n_tokens);
  }
  if (progress) /* the last line whole: the counts above leave out the lines' ends */
    fprintf(stderr, "\rtokenize: %zu of %zu MiB, %" PRIu64 " tokens%s\n", rc ? done_bytes >> 20 : total >> 20,
            total >> 20, r.n_tokens, rc ? ": stopped" : "");
  if (!rc) {
    header[0] = TOKENS_MAGIC;
    header[1] = r.version;
    header[2] = (int32_t)r.n_tokens;
    if (pwrite(r.a.fd, header, sizeof header, 0) != (ssize_t)sizeof header)
      rc = EXIT_RUNTIME, snprintf(err, sizeof err, "cannot write %s: %s", r.a.tmp, strerror(errno));
  }
  if (r.open && file_atomic_end(&r.a, !rc, err, sizeof err) && !rc) rc = EXIT_RUNTIME;
  char eos_txt[64];
  snprintf(eos_txt, sizeof eos_txt, "eos %" PRId64 " after each document", eos);
  if (!rc)
    printf("tokenize: %zu documents, %" PRIu64 " tokens (llm.c version %d, %s tokens; %s) -> %s\n",
           n_docs, r.n_tokens, r.version, r.version == 1 ? "uint16" : "uint32",
           eos >= 0 ? eos_txt : no_eos ? "no eos (--no-eos)" : "no eos: the tokenizer has none", out);
  for (int f = 0; f < n_files; f++)
    if (maps) file_unmap(&maps[f]);
  free(maps);
  free(docs);
  free(ids);
  for (int k = 0; workers && k < threads; k++) tok_worker_free(workers[k]);
  free(workers);
  free(r.buf);
  free(files);
  tokenizer_free(tok);
  return rc ? host_fail(L, rc, "%s", err) : 0;
}
