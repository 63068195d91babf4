/* A small strict JSON parser (RFC 8259: UTF-8 checked, \uXXXX with surrogate pairs, nesting
 * depth capped, duplicate keys refused), for input that cannot be trusted: safetensors headers,
 * checkpoint manifests. The text is parsed into a flat array of nodes linked first-child /
 * next-sibling; decoded strings go to one arena sized to the text (a decoded string plus its NUL
 * is never longer than its quoted source), so names can point into it for the parse's life.
 * Errors are one line: "NAME: bad JSON at byte N: what". */
#ifndef TYCHO_UTIL_JSON_H
#define TYCHO_UTIL_JSON_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 64

enum json_type { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY,
                 JSON_OBJECT };

struct json_node {
  enum json_type type;
  int first;        /* first child, -1 if none */
  int next;         /* next sibling, -1 if none */
  int n_children;
  size_t pos;       /* offset of the value in the text */
  size_t len;       /* numbers: length of the literal */
  const char *key;  /* object member key, or NULL */
  const char *str;  /* string value */
};

struct json_doc {
  const char *text;
  size_t n, i;
  struct json_node *nodes;
  int n_nodes, cap_nodes;
  char *strings;
  size_t n_strings;
  const char *name; /* file name for messages */
  size_t base;      /* file offset of text[0], for messages */
  char *err;
  size_t err_size;
};

/* Parses text[0, n) as one JSON value; the root is node 0. `name` and `base` (the file offset of
 * text[0]) are for messages. 0 ok; nonzero with the message in err. */
int json_parse(struct json_doc *j, const char *text, size_t n, const char *name, size_t base,
               char *err, size_t err_size);
void json_free(struct json_doc *j);
/* A number node that is a non-negative integer fitting in 64 bits. */
bool json_uint64(const struct json_doc *j, int id, uint64_t *out);
/* A number node as a double (strtod of its literal). */
bool json_double(const struct json_doc *j, int id, double *out);
/* The length of the valid UTF-8 sequence at s (n bytes available), or 0 if invalid. */
size_t json_utf8_length(const unsigned char *s, size_t n);
/* The member `key` of object node id, or -1. */
int json_member(const struct json_doc *j, int id, const char *key);

#endif
