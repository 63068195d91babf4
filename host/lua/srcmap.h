/* Source maps for plan files: where each field of each table constructor was written.
 *
 * Lua does not tell a program on which line a table field was written, yet every plan error
 * must name that line. Before a plan chunk is compiled, srcmap_rewrite scans its text with a
 * small Lua tokenizer and wraps every table constructor `{ ... }` in a call
 * `__tycho_tc(ID, { ... })` on the same line (line numbers are kept exactly; a space goes before
 * the call where a keyword is written against the brace, as in `return{`). Record ID holds
 * the file, the line of the `{` and the line of each field key. At run time __tycho_tc ties the
 * new table to its record (see sandbox.h), so the plan compiler can ask "on which line was
 * key `tp` of this table written?". Pure C: no Lua here. */
#ifndef TYCHO_SRCMAP_H
#define TYCHO_SRCMAP_H
#include <stddef.h>

struct srcmap_field {
  char *key;      /* field name or literal string key; NULL for positional or integer keys */
  long index;     /* positional index (1-based) or literal integer key when key == NULL */
  const char *where; /* NULL: the record's file; else where this one field was set */
  int line;
};

struct srcmap_record {
  const char *where; /* file name, or a description such as "--set mesh.tp=2" */
  int line;          /* line of the constructor; 0 when it has none (command line) */
  int n_fields, cap_fields;
  struct srcmap_field *fields;
};

struct srcmap {
  int n_records, cap_records;
  struct srcmap_record *records;
  int n_names, cap_names;
  char **names;      /* interned file names / descriptions, owned */
};

void srcmap_init(struct srcmap *m);
void srcmap_free(struct srcmap *m);

/* Interns a file name or description; the pointer lives as long as the map. */
const char *srcmap_intern(struct srcmap *m, const char *name);

/* New empty record; returns its id or -1 when out of memory. */
int srcmap_new_record(struct srcmap *m, const char *where, int line);
/* Copies record `from` (or makes an empty one when from < 0) into a new record. */
int srcmap_copy_record(struct srcmap *m, int from, const char *where, int line);
/* Adds or replaces where a key was written (key NULL: integer key `index`; where NULL: the
 * record's own file). 0 ok, -1 no memory. */
int srcmap_set_field(struct srcmap *m, int id, const char *key, long index, const char *where, int line);
/* Appends a field the record does not have yet (the caller knows: no search, so building a
 * record of n fields takes time linear in n). 0 ok, -1 no memory. */
int srcmap_add_field(struct srcmap *m, int id, const char *key, long index, const char *where, int line);
/* The field of a key in record id, or NULL when the record does not know the key. */
const struct srcmap_field *srcmap_find_field(const struct srcmap *m, int id, const char *key, long index);
const struct srcmap_record *srcmap_get(const struct srcmap *m, int id);

/* Rewrites Lua source `src` (length n) of file `where` as described above. Returns a newly
 * allocated NUL-terminated string (its length in *out_len), or NULL when the text cannot be
 * tokenized (unterminated string or comment): the caller then loads the original text and
 * lets Lua report the syntax error. */
char *srcmap_rewrite(struct srcmap *m, const char *where, const char *src, size_t n, size_t *out_len);

#endif
