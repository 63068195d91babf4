/* Source maps for plan files (see srcmap.h): a Lua 5.4 tokenizer just good enough to find
 * table constructors, their field keys and lines, and a rewriter that wraps each constructor
 * in `__tycho_tc(ID, ...)` without moving any text to another line. */
#define _POSIX_C_SOURCE 200809L
#include "srcmap.h"

#include "util/strbuf.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srcmap_init(struct srcmap *m)
{
  memset(m, 0, sizeof *m);
}

void srcmap_free(struct srcmap *m)
{
  for (int i = 0; i < m->n_records; i++) {
    for (int j = 0; j < m->records[i].n_fields; j++)
      free(m->records[i].fields[j].key);
    free(m->records[i].fields);
  }
  free(m->records);
  for (int i = 0; i < m->n_names; i++)
    free(m->names[i]);
  free(m->names);
  memset(m, 0, sizeof *m);
}

const char *srcmap_intern(struct srcmap *m, const char *name)
{
  for (int i = 0; i < m->n_names; i++)
    if (strcmp(m->names[i], name) == 0)
      return m->names[i];
  if (m->n_names == m->cap_names) {
    int cap = m->cap_names ? 2 * m->cap_names : 16;
    char **names = realloc(m->names, (size_t)cap * sizeof *names);
    if (!names)
      return NULL;
    m->names = names;
    m->cap_names = cap;
  }
  char *copy = strdup(name);
  if (!copy)
    return NULL;
  m->names[m->n_names++] = copy;
  return copy;
}

int srcmap_new_record(struct srcmap *m, const char *where, int line)
{
  if (m->n_records == m->cap_records) {
    int cap = m->cap_records ? 2 * m->cap_records : 64;
    struct srcmap_record *records = realloc(m->records, (size_t)cap * sizeof *records);
    if (!records)
      return -1;
    m->records = records;
    m->cap_records = cap;
  }
  struct srcmap_record *r = &m->records[m->n_records];
  memset(r, 0, sizeof *r);
  r->where = where;
  r->line = line;
  return m->n_records++;
}

const struct srcmap_record *srcmap_get(const struct srcmap *m, int id)
{
  return (id >= 0 && id < m->n_records) ? &m->records[id] : NULL;
}

static struct srcmap_field *find_field(struct srcmap_record *r, const char *key, long index)
{
  for (int i = 0; i < r->n_fields; i++) {
    struct srcmap_field *f = &r->fields[i];
    if (key ? (f->key && strcmp(f->key, key) == 0) : (!f->key && f->index == index))
      return f;
  }
  return NULL;
}

const struct srcmap_field *srcmap_find_field(const struct srcmap *m, int id, const char *key, long index)
{
  if (id < 0 || id >= m->n_records)
    return NULL;
  return find_field(&m->records[id], key, index);
}

int srcmap_add_field(struct srcmap *m, int id, const char *key, long index, const char *where, int line)
{
  if (id < 0 || id >= m->n_records)
    return -1;
  struct srcmap_record *r = &m->records[id];
  if (r->n_fields == r->cap_fields) {
    int cap = r->cap_fields ? 2 * r->cap_fields : 8;
    struct srcmap_field *fields = realloc(r->fields, (size_t)cap * sizeof *fields);
    if (!fields)
      return -1;
    r->fields = fields;
    r->cap_fields = cap;
  }
  struct srcmap_field *f = &r->fields[r->n_fields];
  f->key = NULL;
  if (key && !(f->key = strdup(key)))
    return -1;
  f->index = index;
  f->where = where;
  f->line = line;
  r->n_fields++;
  return 0;
}

int srcmap_set_field(struct srcmap *m, int id, const char *key, long index, const char *where, int line)
{
  if (id < 0 || id >= m->n_records)
    return -1;
  struct srcmap_field *f = find_field(&m->records[id], key, index);
  if (!f)
    return srcmap_add_field(m, id, key, index, where, line);
  f->where = where;
  f->line = line;
  return 0;
}

int srcmap_copy_record(struct srcmap *m, int from, const char *where, int line)
{
  int id = srcmap_new_record(m, where, line);
  if (id < 0 || from < 0 || from >= m->n_records)
    return id;
  /* Index, not pointer: srcmap_set_field may not move records, but new_record above did. */
  for (int i = 0; i < m->records[from].n_fields; i++) {
    struct srcmap_field f = m->records[from].fields[i];
    const char *fw = f.where ? f.where : m->records[from].where;
    if (srcmap_add_field(m, id, f.key, f.index, fw, f.line) < 0) /* keys are unique in `from` */
      return -1;
  }
  return id;
}

/* ---- tokenizer ---------------------------------------------------------------------- */

enum tok_kind { TOK_EOF, TOK_NAME, TOK_KEYWORD, TOK_STRING, TOK_NUMBER, TOK_PUNCT, TOK_ERROR };

struct token {
  enum tok_kind kind;
  size_t start, end; /* byte range in the source */
  int line;          /* line where the token starts */
  char punct[4];     /* for TOK_PUNCT */
};

struct lexer {
  const char *s;
  size_t n, pos;
  int line;
};

static const char *const keywords[] = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
  "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
};

static int is_keyword(const char *s, size_t n)
{
  for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
    if (strlen(keywords[i]) == n && memcmp(keywords[i], s, n) == 0)
      return 1;
  return 0;
}

static void lex_newline(struct lexer *x)
{
  /* \n, \r, \r\n and \n\r each count as one line, as in Lua's llex.c */
  char c = x->s[x->pos++];
  if (x->pos < x->n && (x->s[x->pos] == '\n' || x->s[x->pos] == '\r') && x->s[x->pos] != c)
    x->pos++;
  x->line++;
}

/* At '[': returns the level of a long bracket `[==[` (>= 0) or -1 when it is not one. */
static int long_bracket_level(const struct lexer *x)
{
  size_t p = x->pos + 1;
  int level = 0;
  while (p < x->n && x->s[p] == '=') {
    level++;
    p++;
  }
  return (p < x->n && x->s[p] == '[') ? level : -1;
}

/* Skips a long string or comment body starting at '[' of level `level`; 0 ok, -1 unterminated. */
static int skip_long(struct lexer *x, int level)
{
  x->pos += (size_t)level + 2;
  while (x->pos < x->n) {
    char c = x->s[x->pos];
    if (c == '\n' || c == '\r') {
      lex_newline(x);
    } else if (c == ']') {
      size_t p = x->pos + 1;
      int l = 0;
      while (p < x->n && x->s[p] == '=') {
        l++;
        p++;
      }
      if (l == level && p < x->n && x->s[p] == ']') {
        x->pos = p + 1;
        return 0;
      }
      x->pos++;
    } else {
      x->pos++;
    }
  }
  return -1;
}

static int skip_quoted(struct lexer *x)
{
  char q = x->s[x->pos++];
  while (x->pos < x->n) {
    char c = x->s[x->pos];
    if (c == q) {
      x->pos++;
      return 0;
    }
    if (c == '\n' || c == '\r')
      return -1; /* unfinished string: let Lua say so */
    if (c == '\\') {
      x->pos++;
      if (x->pos >= x->n)
        return -1;
      char e = x->s[x->pos];
      if (e == '\n' || e == '\r') {
        lex_newline(x);
      } else if (e == 'z') {
        x->pos++;
        while (x->pos < x->n && isspace((unsigned char)x->s[x->pos])) {
          if (x->s[x->pos] == '\n' || x->s[x->pos] == '\r')
            lex_newline(x);
          else
            x->pos++;
        }
      } else {
        x->pos++;
      }
      continue;
    }
    x->pos++;
  }
  return -1;
}

static struct token lex_next(struct lexer *x)
{
  struct token t = { TOK_EOF, 0, 0, 0, { 0 } };
  for (;;) {
    if (x->pos >= x->n) {
      t.start = t.end = x->n;
      t.line = x->line;
      return t;
    }
    char c = x->s[x->pos];
    if (c == '\n' || c == '\r') {
      lex_newline(x);
    } else if (isspace((unsigned char)c)) {
      x->pos++;
    } else if (c == '-' && x->pos + 1 < x->n && x->s[x->pos + 1] == '-') {
      x->pos += 2;
      int level = (x->pos < x->n && x->s[x->pos] == '[') ? long_bracket_level(x) : -1;
      if (level >= 0) {
        if (skip_long(x, level) < 0) {
          t.kind = TOK_ERROR;
          return t;
        }
      } else {
        while (x->pos < x->n && x->s[x->pos] != '\n' && x->s[x->pos] != '\r')
          x->pos++;
      }
    } else {
      break;
    }
  }
  char c = x->s[x->pos];
  t.start = x->pos;
  t.line = x->line;
  if (isalpha((unsigned char)c) || c == '_') {
    while (x->pos < x->n && (isalnum((unsigned char)x->s[x->pos]) || x->s[x->pos] == '_'))
      x->pos++;
    t.kind = is_keyword(x->s + t.start, x->pos - t.start) ? TOK_KEYWORD : TOK_NAME;
  } else if (isdigit((unsigned char)c) || (c == '.' && x->pos + 1 < x->n && isdigit((unsigned char)x->s[x->pos + 1]))) {
    int hex = c == '0' && x->pos + 1 < x->n && (x->s[x->pos + 1] == 'x' || x->s[x->pos + 1] == 'X');
    while (x->pos < x->n) {
      char d = x->s[x->pos], before = x->pos > t.start ? x->s[x->pos - 1] : 0;
      int exp_sign = (d == '+' || d == '-') && x->pos > t.start &&
                     (hex ? (before == 'p' || before == 'P') : (before == 'e' || before == 'E'));
      if (exp_sign || isalnum((unsigned char)d) || d == '.')
        x->pos++;
      else
        break;
    }
    t.kind = TOK_NUMBER;
  } else if (c == '"' || c == '\'') {
    if (skip_quoted(x) < 0) {
      t.kind = TOK_ERROR;
      return t;
    }
    t.kind = TOK_STRING;
  } else if (c == '[' && long_bracket_level(x) >= 0) {
    if (skip_long(x, long_bracket_level(x)) < 0) {
      t.kind = TOK_ERROR;
      return t;
    }
    t.kind = TOK_STRING;
  } else {
    static const char *const multi[] = { "...", "..", "==", "~=", "<=", ">=", "<<", ">>", "//", "::" };
    t.kind = TOK_PUNCT;
    size_t len = 1;
    for (size_t i = 0; i < sizeof multi / sizeof multi[0]; i++) {
      size_t l = strlen(multi[i]);
      if (x->pos + l <= x->n && memcmp(x->s + x->pos, multi[i], l) == 0) {
        len = l;
        break;
      }
    }
    memcpy(t.punct, x->s + x->pos, len);
    t.punct[len] = 0;
    x->pos += len;
  }
  t.end = x->pos;
  return t;
}

/* ---- rewriter ----------------------------------------------------------------------- */

enum ctx_kind { CTX_CTOR, CTX_PAREN, CTX_BRACKET, CTX_BLOCK };

struct ctx {
  enum ctx_kind kind;
  int record;     /* CTX_CTOR: its record id */
  int call_arg;   /* CTX_CTOR: `f{...}` form, closed with "})" plus ")" */
  long next_pos;  /* CTX_CTOR: next positional index */
  int field_start;/* CTX_CTOR: the next token starts a field */
};

/* Pushes a context; -1 when out of memory. */
static int push_ctx(struct ctx **stack, int *depth, int *cap, struct ctx c)
{
  if (*depth == *cap) {
    int ncap = *cap * 2;
    struct ctx *s2 = realloc(*stack, (size_t)ncap * sizeof **stack);
    if (!s2)
      return -1;
    *stack = s2;
    *cap = ncap;
  }
  (*stack)[(*depth)++] = c;
  return 0;
}

static int is_punct(const struct token *t, const char *p)
{
  return t->kind == TOK_PUNCT && strcmp(t->punct, p) == 0;
}

static int is_kw(const struct token *t, const char *src, const char *kw)
{
  size_t l = strlen(kw);
  return t->kind == TOK_KEYWORD && t->end - t->start == l && memcmp(src + t->start, kw, l) == 0;
}

/* The string value of a simple literal key token like "name" or 'name' (no escapes). */
static char *literal_key(const char *src, const struct token *t)
{
  if (t->kind != TOK_STRING || (src[t->start] != '"' && src[t->start] != '\''))
    return NULL;
  size_t n = t->end - t->start - 2;
  if (memchr(src + t->start + 1, '\\', n))
    return NULL;
  char *k = malloc(n + 1);
  if (k) {
    memcpy(k, src + t->start + 1, n);
    k[n] = 0;
  }
  return k;
}

char *srcmap_rewrite(struct srcmap *m, const char *where, const char *src, size_t n, size_t *out_len)
{
  const char *file = srcmap_intern(m, where);
  struct lexer x = { src, n, 0, 1 };
  struct strbuf o;
  sb_init(&o);
  int cap = 64, depth = 0;
  struct ctx *stack = malloc((size_t)cap * sizeof *stack);
  if (!file || !stack) {
    free(stack);
    return NULL;
  }
  /* A first line starting with '#' is skipped by Lua; it is copied like any other gap. */
  if (n > 0 && src[0] == '#')
    while (x.pos < n && src[x.pos] != '\n' && src[x.pos] != '\r')
      x.pos++;
  size_t copied = 0; /* src[0, copied) is in the output */

  struct token prev = { TOK_EOF, 0, 0, 0, { 0 } };
  struct token t = lex_next(&x);
  int ok = 1;
  while (ok && t.kind != TOK_EOF) {
    if (t.kind == TOK_ERROR) {
      ok = 0;
      break;
    }
    struct token next_tok;
    int have_next = 0;
    struct ctx *top = depth ? &stack[depth - 1] : NULL;

    /* A field starts here: note its key and line. */
    if (top && top->kind == CTX_CTOR && top->field_start && !is_punct(&t, "}")) {
      top->field_start = 0;
      size_t save_pos = x.pos;
      int save_line = x.line;
      if (t.kind == TOK_NAME) {
        next_tok = lex_next(&x);
        have_next = 1;
        if (is_punct(&next_tok, "=")) {
          char *key = strndup(src + t.start, t.end - t.start);
          if (!key || srcmap_set_field(m, top->record, key, 0, NULL, t.line) < 0)
            ok = 0;
          free(key);
        } else {
          srcmap_set_field(m, top->record, NULL, top->next_pos++, NULL, t.line);
        }
      } else if (is_punct(&t, "[")) {
        /* [literal] = value: only simple string or integer literals are recorded */
        struct lexer look = x;
        struct token k = lex_next(&look), close = lex_next(&look), eq = lex_next(&look);
        if (is_punct(&close, "]") && is_punct(&eq, "=")) {
          char *key = literal_key(src, &k);
          if (key) {
            srcmap_set_field(m, top->record, key, 0, NULL, t.line);
            free(key);
          } else if (k.kind == TOK_NUMBER) {
            char *end;
            char *num = strndup(src + k.start, k.end - k.start);
            long v = num ? strtol(num, &end, 10) : 0;
            if (num && *end == 0)
              srcmap_set_field(m, top->record, NULL, v, NULL, t.line);
            free(num);
          }
        }
      } else {
        srcmap_set_field(m, top->record, NULL, top->next_pos++, NULL, t.line);
      }
      if (have_next) {
        /* rewind so the main loop sees next_tok again */
        x.pos = save_pos;
        x.line = save_line;
        have_next = 0;
      }
    }

    /* the gap before this token (spaces, comments, newlines) goes out verbatim */
    sb_put(&o, src + copied, t.start - copied);
    copied = t.end;
    if (is_punct(&t, "{")) {
      int call_arg = prev.kind == TOK_NAME || prev.kind == TOK_STRING ||
                     is_punct(&prev, ")") || is_punct(&prev, "]") || is_punct(&prev, "}");
      int id = srcmap_new_record(m, file, t.line);
      if (id < 0) {
        ok = 0;
        break;
      }
      /* A keyword written against the brace (`return{`, `and{`, `in{`) must stay a keyword: a
       * space keeps it from running into the call's name. */
      int glued = o.n > 0 && (isalnum((unsigned char)o.s[o.n - 1]) || o.s[o.n - 1] == '_');
      char head[48];
      int hl = snprintf(head, sizeof head, "%s%s__tycho_tc(%d,{", glued && !call_arg ? " " : "",
                        call_arg ? "(" : "", id);
      sb_put(&o, head, (size_t)hl);
      if (push_ctx(&stack, &depth, &cap, (struct ctx){ CTX_CTOR, id, call_arg, 1, 1 }) < 0) {
        ok = 0;
        break;
      }
    } else if (is_punct(&t, "}")) {
      if (!depth || stack[depth - 1].kind != CTX_CTOR) {
        ok = 0; /* unbalanced: Lua will report it */
        break;
      }
      sb_put(&o, stack[depth - 1].call_arg ? "}))" : "})", stack[depth - 1].call_arg ? 3 : 2);
      depth--;
    } else {
      sb_put(&o, src + t.start, t.end - t.start);
      if (is_punct(&t, "(") || is_punct(&t, "[")) {
        if (push_ctx(&stack, &depth, &cap,
                     (struct ctx){ is_punct(&t, "(") ? CTX_PAREN : CTX_BRACKET, -1, 0, 0, 0 }) < 0) {
          ok = 0;
          break;
        }
      } else if (is_punct(&t, ")") || is_punct(&t, "]")) {
        if (depth && stack[depth - 1].kind == (is_punct(&t, ")") ? CTX_PAREN : CTX_BRACKET))
          depth--;
        else {
          ok = 0;
          break;
        }
      } else if (is_kw(&t, src, "function") || is_kw(&t, src, "if") || is_kw(&t, src, "do") ||
                 is_kw(&t, src, "repeat")) {
        /* `while ... do` and `for ... do` open their block at `do` */
        if (push_ctx(&stack, &depth, &cap, (struct ctx){ CTX_BLOCK, -1, 0, 0, 0 }) < 0) {
          ok = 0;
          break;
        }
      } else if (is_kw(&t, src, "end") || is_kw(&t, src, "until")) {
        if (depth && stack[depth - 1].kind == CTX_BLOCK)
          depth--;
        /* an unmatched `end` at top level is a syntax error Lua will report */
      } else if ((is_punct(&t, ",") || is_punct(&t, ";")) && depth && stack[depth - 1].kind == CTX_CTOR) {
        stack[depth - 1].field_start = 1;
      }
    }
    prev = t;
    t = lex_next(&x);
  }
  if (ok)
    sb_put(&o, src + copied, n - copied);
  free(stack);
  if (ok && depth != 0)
    ok = 0; /* unbalanced: Lua will report it on the original text */
  if (!ok || o.failed) {
    sb_free(&o);
    return NULL;
  }
  if (!o.s) {
    sb_free(&o);
    o.s = calloc(1, 1);
    if (!o.s)
      return NULL;
  }
  *out_len = o.n;
  return o.s;
}
