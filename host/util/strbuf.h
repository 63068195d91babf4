/* A growable string and a small JSON writer on top of it. One serializer serves both
 * `tycho check --json` and the plan hash, so the hash covers exactly what is printed. */
#ifndef TYCHO_STRBUF_H
#define TYCHO_STRBUF_H
#include <stddef.h>

struct strbuf {
  char *s;
  size_t n, cap;
  int failed; /* an allocation failed: the content is incomplete */
  long replaced; /* bytes json_string/json_key wrote as U+FFFD: not UTF-8, so not as given */
};

void sb_init(struct strbuf *b);
void sb_free(struct strbuf *b);
void sb_put(struct strbuf *b, const char *s, size_t n);
void sb_puts(struct strbuf *b, const char *s);
void sb_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* JSON: the writer tracks whether a comma is due. Keys are written by json_key. Strings are
 * written as given, with '"', '\\' and control bytes escaped (\n \r \t, the rest \u00XX); a byte
 * that begins no valid UTF-8 sequence is written as \ufffd (and counted in `replaced`), so the
 * output is always JSON that util/json.h reads back. */
struct json {
  struct strbuf *b;
  int depth;
  unsigned char need_comma[64];
};

void json_init(struct json *j, struct strbuf *b);
void json_begin_object(struct json *j);
void json_end_object(struct json *j);
void json_begin_array(struct json *j);
void json_end_array(struct json *j);
void json_key(struct json *j, const char *key);
void json_string(struct json *j, const char *s);
void json_int(struct json *j, long long v);
void json_number(struct json *j, double v); /* shortest exact form; NaN and infinities as null */
void json_bool(struct json *j, int v);
void json_null(struct json *j);

#endif
