/* The JSON parser of util/json.h. */
#define _POSIX_C_SOURCE 200809L
#include "util/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

__attribute__((format(printf, 3, 4)))
static int json_fail(struct json_doc *j, size_t pos, const char *fmt, ...)
{
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return errf(j->err, j->err_size, "%s: bad JSON at byte %zu: %s", j->name, j->base + pos, what);
}

static int json_peek(const struct json_doc *j) { return j->i < j->n ? (unsigned char)j->text[j->i] : -1; }

static void json_skip_space(struct json_doc *j)
{
  while (j->i < j->n && (j->text[j->i] == ' ' || j->text[j->i] == '\t' ||
                         j->text[j->i] == '\n' || j->text[j->i] == '\r'))
    j->i++;
}

static int json_new_node(struct json_doc *j, enum json_type type)
{
  if (j->n_nodes == j->cap_nodes) {
    int cap = j->cap_nodes ? 2 * j->cap_nodes : 64;
    struct json_node *nodes = realloc(j->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return -1;
    j->nodes = nodes;
    j->cap_nodes = cap;
  }
  struct json_node *nd = &j->nodes[j->n_nodes];
  *nd = (struct json_node){ .type = type, .first = -1, .next = -1, .pos = j->i };
  return j->n_nodes++;
}

size_t json_utf8_length(const unsigned char *s, size_t n)
{
  unsigned char c = s[0];
  size_t len;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c < 0x80) return 1;
  else if (c >= 0xc2 && c <= 0xdf) len = 2;
  else if (c >= 0xe0 && c <= 0xef) { len = 3; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
  else if (c >= 0xf0 && c <= 0xf4) { len = 4; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
  else return 0;
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k < len; k++)
    if (s[k] < 0x80 || s[k] > 0xbf) return 0;
  return len;
}

static int json_hex4(struct json_doc *j, size_t at, unsigned *out)
{
  unsigned v = 0;
  if (at + 4 > j->n) return json_fail(j, at, "truncated \\u escape");
  for (int k = 0; k < 4; k++) {
    char c = j->text[at + k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return json_fail(j, at, "bad hex digit in \\u escape");
  }
  *out = v;
  return 0;
}

static int json_string(struct json_doc *j, const char **out)
{
  size_t start = j->i++;
  char *dst = j->strings + j->n_strings;
  *out = dst;
  for (;;) {
    if (j->i >= j->n) return json_fail(j, start, "unterminated string");
    unsigned char c = (unsigned char)j->text[j->i];
    if (c == '"') { j->i++; break; }
    if (c < 0x20) return json_fail(j, j->i, "control character 0x%02x in string", c);
    if (c != '\\') {
      size_t len = json_utf8_length((const unsigned char *)j->text + j->i, j->n - j->i);
      if (!len) return json_fail(j, j->i, "invalid UTF-8 in string");
      memcpy(dst, j->text + j->i, len);
      dst += len;
      j->i += len;
      continue;
    }
    size_t esc = j->i++;
    if (j->i >= j->n) return json_fail(j, start, "unterminated string");
    char e = j->text[j->i++];
    switch (e) {
    case '"': case '\\': case '/': *dst++ = e; continue;
    case 'b': *dst++ = '\b'; continue;
    case 'f': *dst++ = '\f'; continue;
    case 'n': *dst++ = '\n'; continue;
    case 'r': *dst++ = '\r'; continue;
    case 't': *dst++ = '\t'; continue;
    case 'u': break;
    default: return json_fail(j, esc, "bad escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
    }
    unsigned cp, lo;
    if (json_hex4(j, j->i, &cp)) return 1;
    j->i += 4;
    if (cp >= 0xdc00 && cp <= 0xdfff) return json_fail(j, esc, "lone low surrogate \\u%04x", cp);
    if (cp >= 0xd800 && cp <= 0xdbff) {
      if (j->i + 2 > j->n || j->text[j->i] != '\\' || j->text[j->i + 1] != 'u')
        return json_fail(j, esc, "high surrogate \\u%04x without a low one", cp);
      if (json_hex4(j, j->i + 2, &lo)) return 1;
      if (lo < 0xdc00 || lo > 0xdfff)
        return json_fail(j, esc, "high surrogate \\u%04x without a low one", cp);
      j->i += 6;
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    if (cp == 0) return json_fail(j, esc, "\\u0000 in a string is not supported");
    if (cp < 0x80) {
      *dst++ = (char)cp;
    } else if (cp < 0x800) {
      *dst++ = (char)(0xc0 | (cp >> 6));
      *dst++ = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      *dst++ = (char)(0xe0 | (cp >> 12));
      *dst++ = (char)(0x80 | ((cp >> 6) & 0x3f));
      *dst++ = (char)(0x80 | (cp & 0x3f));
    } else {
      *dst++ = (char)(0xf0 | (cp >> 18));
      *dst++ = (char)(0x80 | ((cp >> 12) & 0x3f));
      *dst++ = (char)(0x80 | ((cp >> 6) & 0x3f));
      *dst++ = (char)(0x80 | (cp & 0x3f));
    }
  }
  *dst++ = '\0';
  j->n_strings = (size_t)(dst - j->strings);
  return 0;
}

static bool json_is_digit(int c) { return c >= '0' && c <= '9'; }

static int json_number(struct json_doc *j, int id)
{
  size_t start = j->i;
  if (json_peek(j) == '-') j->i++;
  if (json_peek(j) == '0') j->i++;
  else if (json_is_digit(json_peek(j)) ) while (json_is_digit(json_peek(j))) j->i++;
  else return json_fail(j, start, "bad number");
  if (json_peek(j) == '.') {
    j->i++;
    if (!json_is_digit(json_peek(j))) return json_fail(j, start, "bad number");
    while (json_is_digit(json_peek(j))) j->i++;
  }
  if (json_peek(j) == 'e' || json_peek(j) == 'E') {
    j->i++;
    if (json_peek(j) == '+' || json_peek(j) == '-') j->i++;
    if (!json_is_digit(json_peek(j))) return json_fail(j, start, "bad number");
    while (json_is_digit(json_peek(j))) j->i++;
  }
  j->nodes[id].len = j->i - start;
  return 0;
}

static int compare_strings(const void *a, const void *b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Refuse an object with two members of one name; O(k log k) for k members. */
static int json_check_unique_keys(struct json_doc *j, int id)
{
  int k = j->nodes[id].n_children, m = 0;
  if (k < 2) return 0;
  const char **keys = malloc((size_t)k * sizeof *keys);
  if (!keys) return json_fail(j, j->nodes[id].pos, "out of memory");
  for (int c = j->nodes[id].first; c >= 0; c = j->nodes[c].next) keys[m++] = j->nodes[c].key;
  qsort(keys, (size_t)k, sizeof *keys, compare_strings);
  for (int a = 1; a < k; a++) {
    if (strcmp(keys[a - 1], keys[a]) == 0) {
      int rc = json_fail(j, j->nodes[id].pos, "duplicate key \"%.100s\" in object", keys[a]);
      free(keys);
      return rc;
    }
  }
  free(keys);
  return 0;
}

static int json_value(struct json_doc *j, int depth);

static int json_container(struct json_doc *j, int id, int depth, bool is_object)
{
  char close = is_object ? '}' : ']';
  int prev = -1;
  if (depth >= JSON_MAX_DEPTH)
    return json_fail(j, j->i, "nesting deeper than %d levels", JSON_MAX_DEPTH);
  j->i++;
  json_skip_space(j);
  if (json_peek(j) == close) { j->i++; return 0; }
  for (;;) {
    const char *key = NULL;
    json_skip_space(j);
    if (is_object) {
      if (json_peek(j) != '"') return json_fail(j, j->i, "expected a string key in object");
      if (json_string(j, &key)) return 1;
      json_skip_space(j);
      if (json_peek(j) != ':') return json_fail(j, j->i, "expected ':' after object key");
      j->i++;
    }
    int child = json_value(j, depth + 1);
    if (child < 0) return 1;
    j->nodes[child].key = key;
    if (prev < 0) j->nodes[id].first = child;
    else j->nodes[prev].next = child;
    prev = child;
    j->nodes[id].n_children++;
    json_skip_space(j);
    int c = json_peek(j);
    if (c == ',') { j->i++; continue; }
    if (c == close) { j->i++; break; }
    return json_fail(j, j->i, "expected ',' or '%c'", close);
  }
  return is_object ? json_check_unique_keys(j, id) : 0;
}

static int json_literal(struct json_doc *j, const char *word)
{
  size_t len = strlen(word);
  if (j->n - j->i < len || memcmp(j->text + j->i, word, len) != 0)
    return json_fail(j, j->i, "unexpected character");
  j->i += len;
  return 0;
}

/* Parse one value; returns its node index, or -1 with the message written. */
static int json_value(struct json_doc *j, int depth)
{
  json_skip_space(j);
  int c = json_peek(j);
  if (c < 0) { json_fail(j, j->i, "unexpected end of JSON"); return -1; }
  enum json_type type = c == '{' ? JSON_OBJECT : c == '[' ? JSON_ARRAY : c == '"' ? JSON_STRING
                      : c == 't' ? JSON_TRUE : c == 'f' ? JSON_FALSE : c == 'n' ? JSON_NULL
                      : JSON_NUMBER;
  int id = json_new_node(j, type);
  if (id < 0) { json_fail(j, j->i, "out of memory"); return -1; }
  int rc;
  switch (type) {
  case JSON_OBJECT: rc = json_container(j, id, depth, true); break;
  case JSON_ARRAY: rc = json_container(j, id, depth, false); break;
  case JSON_STRING: rc = json_string(j, &j->nodes[id].str); break;
  case JSON_TRUE: rc = json_literal(j, "true"); break;
  case JSON_FALSE: rc = json_literal(j, "false"); break;
  case JSON_NULL: rc = json_literal(j, "null"); break;
  default:
    if (c != '-' && !json_is_digit(c)) {
      if (c >= 0x20 && c < 0x7f) json_fail(j, j->i, "unexpected character '%c'", c);
      else json_fail(j, j->i, "unexpected byte 0x%02x", (unsigned)c);
      return -1;
    }
    rc = json_number(j, id);
  }
  return rc ? -1 : id;
}

int json_parse(struct json_doc *j, const char *text, size_t n, const char *name, size_t base,
                      char *err, size_t err_size)
{
  *j = (struct json_doc){ .text = text, .n = n, .name = name, .base = base, .err = err,
                      .err_size = err_size };
  j->strings = malloc(n + 1);
  if (!j->strings) return errf(err, err_size, "%s: out of memory for a %zu-byte header", name, n);
  if (json_value(j, 0) < 0) return 1;
  json_skip_space(j);
  if (j->i != j->n) return json_fail(j, j->i, "trailing characters after the JSON value");
  return 0;
}

void json_free(struct json_doc *j)
{
  free(j->nodes);
  free(j->strings);
  j->nodes = NULL;
  j->strings = NULL;
}

bool json_uint64(const struct json_doc *j, int id, uint64_t *out)
{
  const struct json_node *nd = &j->nodes[id];
  uint64_t v = 0;
  if (nd->type != JSON_NUMBER) return false;
  for (size_t k = 0; k < nd->len; k++) {
    char c = j->text[nd->pos + k];
    if (!json_is_digit(c)) return false;
    if (v > (UINT64_MAX - (uint64_t)(c - '0')) / 10) return false;
    v = v * 10 + (uint64_t)(c - '0');
  }
  *out = v;
  return true;
}

bool json_double(const struct json_doc *j, int id, double *out)
{
  const struct json_node *nd = &j->nodes[id];
  char buf[64];
  if (nd->type != JSON_NUMBER || nd->len >= sizeof buf) return false;
  memcpy(buf, j->text + nd->pos, nd->len);
  buf[nd->len] = 0;
  char *end;
  *out = strtod(buf, &end);
  return *end == 0;
}

int json_member(const struct json_doc *j, int id, const char *key)
{
  if (id < 0 || j->nodes[id].type != JSON_OBJECT) return -1;
  for (int c = j->nodes[id].first; c >= 0; c = j->nodes[c].next)
    if (j->nodes[c].key && strcmp(j->nodes[c].key, key) == 0) return c;
  return -1;
}
