/* Growable strings and the JSON writer: see strbuf.h. */
#include "strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"

void sb_init(struct strbuf *b)
{
  memset(b, 0, sizeof *b);
}

void sb_free(struct strbuf *b)
{
  free(b->s);
  memset(b, 0, sizeof *b);
}

static int sb_reserve(struct strbuf *b, size_t extra)
{
  if (b->failed)
    return -1;
  if (b->n + extra + 1 <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (b->n + extra + 1 > cap)
    cap *= 2;
  char *s = realloc(b->s, cap);
  if (!s) {
    b->failed = 1;
    return -1;
  }
  b->s = s;
  b->cap = cap;
  return 0;
}

void sb_put(struct strbuf *b, const char *s, size_t n)
{
  if (sb_reserve(b, n))
    return;
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}

void sb_puts(struct strbuf *b, const char *s)
{
  sb_put(b, s, strlen(s));
}

void sb_printf(struct strbuf *b, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || sb_reserve(b, (size_t)n))
    return;
  va_start(ap, fmt);
  vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)n;
}

void json_init(struct json *j, struct strbuf *b)
{
  memset(j, 0, sizeof *j);
  j->b = b;
}

static void json_value_start(struct json *j)
{
  /* need_comma: 0 first value, 1 a value came before, 2 a key was just written */
  if (j->need_comma[j->depth] == 1)
    sb_put(j->b, ",", 1);
  j->need_comma[j->depth] = 1;
}

void json_begin_object(struct json *j)
{
  json_value_start(j);
  sb_put(j->b, "{", 1);
  if (j->depth < 63)
    j->need_comma[++j->depth] = 0;
}

void json_end_object(struct json *j)
{
  sb_put(j->b, "}", 1);
  if (j->depth > 0)
    j->depth--;
}

void json_begin_array(struct json *j)
{
  json_value_start(j);
  sb_put(j->b, "[", 1);
  if (j->depth < 63)
    j->need_comma[++j->depth] = 0;
}

void json_end_array(struct json *j)
{
  sb_put(j->b, "]", 1);
  if (j->depth > 0)
    j->depth--;
}

static void json_raw_string(struct strbuf *b, const char *s)
{
  sb_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': sb_puts(b, "\\\""); break;
    case '\\': sb_puts(b, "\\\\"); break;
    case '\n': sb_puts(b, "\\n"); break;
    case '\r': sb_puts(b, "\\r"); break;
    case '\t': sb_puts(b, "\\t"); break;
    default:
      if (*p < 0x20) {
        sb_printf(b, "\\u%04x", *p);
      } else if (*p < 0x80) {
        sb_put(b, (const char *)p, 1);
      } else {
        /* JSON text is UTF-8, and the reader refuses anything else: a byte that does not begin a
         * valid sequence is written as U+FFFD, so what is written always reads back. */
        size_t len = json_utf8_length(p, 4); /* stops at the NUL: it is no continuation byte */
        if (len) {
          sb_put(b, (const char *)p, len);
          p += len - 1;
        } else {
          sb_puts(b, "\\ufffd");
          b->replaced++;
        }
      }
    }
  }
  sb_put(b, "\"", 1);
}

void json_key(struct json *j, const char *key)
{
  if (j->need_comma[j->depth] == 1)
    sb_put(j->b, ",", 1);
  json_raw_string(j->b, key);
  sb_put(j->b, ":", 1);
  j->need_comma[j->depth] = 2;
}

void json_string(struct json *j, const char *s)
{
  json_value_start(j);
  json_raw_string(j->b, s);
}

void json_int(struct json *j, long long v)
{
  json_value_start(j);
  sb_printf(j->b, "%lld", v);
}

void json_number(struct json *j, double v)
{
  json_value_start(j);
  if (isnan(v) || isinf(v))
    sb_puts(j->b, "null");
  else { /* the shortest of %.15g..%.17g that reads back exactly: stable and readable */
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
      snprintf(buf, sizeof buf, "%.*g", prec, v);
      if (strtod(buf, NULL) == v)
        break;
    }
    sb_puts(j->b, buf);
  }
}

void json_bool(struct json *j, int v)
{
  json_value_start(j);
  sb_puts(j->b, v ? "true" : "false");
}

void json_null(struct json *j)
{
  json_value_start(j);
  sb_puts(j->b, "null");
}
