/* The REPL's reading (repl.h): rank selectors (`@0`, `@2-3`, `@dp=0`), rank 0's reading of a
 * chunk (readline on a terminal, else lines; continuation lines while the chunk is incomplete)
 * readline's tab completion, the REPL's own commands as help() lists them, and the chunk that
 * opens the plan. */
#define _POSIX_C_SOURCE 200809L
#include "repl/repl.h"

#include <errno.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TYCHO_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

#include "repl/repl_internal.h"
#include "util/err.h"
#include "util/strbuf.h"

/* ---- rank sets and selectors ---- */

static int parse_int(const char **s, int *v)
{
  char *end;
  long x = strtol(*s, &end, 10);
  if (end == *s || x < 0 || x > 1 << 30)
    return -1;
  *v = (int)x;
  *s = end;
  return 0;
}

int repl_parse_selector(const char *sel, int n, unsigned char *members, char *err, size_t err_size)
{
  if (strchr(sel, '='))
    return 1;
  memset(members, 0, (size_t)n);
  const char *s = sel;
  if (!*s)
    return errf(err, err_size, "@: a selector needs ranks (@0, @2-3, @0,2) or coordinates (@dp=0, @tp=1,pp=0)"), -1;
  while (*s) {
    int a, b;
    if (parse_int(&s, &a))
      return errf(err, err_size, "@%s: '%s' is not a rank, a range a-b or axis=value", sel, s), -1;
    b = a;
    if (*s == '-') {
      s++;
      if (parse_int(&s, &b) || b < a)
        return errf(err, err_size, "@%s: a range is a-b with a ≤ b", sel), -1;
    }
    if (b >= n)
      return errf(err, err_size, "@%s: rank %d is not in the job (ranks 0-%d)", sel, b, n - 1), -1;
    for (int r = a; r <= b; r++) members[r] = 1;
    if (*s == ',')
      s++;
    else if (*s)
      return errf(err, err_size, "@%s: '%s' is not a rank, a range a-b or axis=value", sel, s), -1;
  }
  return 0;
}

int repl_selector_match(const char *sel, int tp, int dp, int pp, char *err, size_t err_size)
{
  const char *s = sel;
  int match = 1;
  while (*s) {
    const char *eq = strchr(s, '=');
    if (!eq)
      return errf(err, err_size, "@%s: '%s' is not axis=value", sel, s), -1;
    const size_t len = (size_t)(eq - s);
    int have;
    if (len == 2 && !strncmp(s, "tp", 2))
      have = tp;
    else if (len == 2 && !strncmp(s, "dp", 2))
      have = dp;
    else if (len == 2 && !strncmp(s, "pp", 2))
      have = pp;
    else
      return errf(err, err_size, "@%s: the axes are tp, dp and pp ('%.*s' is none)", sel, (int)len, s), -1;
    s = eq + 1;
    int v;
    if (parse_int(&s, &v))
      return errf(err, err_size, "@%s: %.*s needs a number", sel, (int)len, eq - len), -1;
    match = match && have == v;
    if (*s == ',')
      s++;
    else if (*s)
      return errf(err, err_size, "@%s: '%s' is not axis=value", sel, s), -1;
  }
  return match;
}


/* ---- reading (rank 0) ---- */

/* One line without its newline into line (LINE_MAX_BYTES); 0, or −1 at the end of input. */
static int read_line(struct reader *r, const char *prompt, char *line)
{
#ifdef TYCHO_HAVE_READLINE
  if (r->tty) {
    repl_state->at_prompt = 1; /* Ctrl-C now empties readline's line (on_sigint) and reading goes on */
    char *s = readline(prompt);
    repl_state->at_prompt = 0;
    if (!s)
      return -1;
    snprintf(line, LINE_MAX_BYTES, "%s", s);
    free(s);
    return 0;
  }
#endif
  for (;;) {
    if (r->tty) {
      fputs(prompt, stdout);
      fflush(stdout);
    }
    repl_state->at_prompt = 1;
    errno = 0;
    char *s = fgets(line, LINE_MAX_BYTES, r->in);
    int cleared = repl_state->at_prompt == 2;
    repl_state->at_prompt = 0;
    if (!s) {
      if (errno == EINTR || cleared) {
        clearerr(r->in);
        continue;
      }
      return -1;
    }
    size_t n = strlen(line);
    if (n && line[n - 1] == '\n')
      line[--n] = 0;
    if (r->echo) {
      printf("%s%s\n", prompt, line);
      fflush(stdout);
    }
    return 0;
  }
}

/* Whether `code` is a complete chunk: 1 yes (or an error that more lines cannot fix), 0 when it
 * ends early (a syntax error at <eof>). */
static int complete(lua_State *L, const char *code, size_t n)
{
  int status = luaL_loadbuffer(L, code, n, "=stdin");
  int incomplete = 0;
  if (status == LUA_ERRSYNTAX) {
    size_t len;
    const char *msg = lua_tolstring(L, -1, &len);
    incomplete = len >= 5 && strcmp(msg + len - 5, "<eof>") == 0;
  }
  lua_pop(L, 1);
  return !incomplete;
}

/* The next chunk into b: the selector (without '@'; empty for every rank) into sel. 0, or −1 at
 * the end of input. */
int repl_read_chunk(struct reader *r, lua_State *L, struct strbuf *b, char *sel, size_t sel_size)
{
  static char line[LINE_MAX_BYTES];
  struct strbuf typed; /* as typed, for the history */
  sb_init(&typed);
  b->n = 0;
  sel[0] = 0;
  for (;;) {
    if (read_line(r, "> ", line)) {
      sb_free(&typed);
      return -1;
    }
    sb_puts(&typed, line);
    const char *s = line;
    while (*s == ' ' || *s == '\t')
      s++;
    if (!*s) {
      typed.n = 0;
      continue; /* an empty line */
    }
    if (*s == '@') {
      size_t k = 0;
      s++;
      while (*s && *s != ' ' && *s != '\t' && k + 1 < sel_size)
        sel[k++] = *s++;
      sel[k] = 0;
      while (*s == ' ' || *s == '\t')
        s++;
    }
    if (*s == '=') { /* =expr: return expr */
      sb_puts(b, "return ");
      sb_puts(b, s + 1);
    } else {
      /* a line that is an expression prints its values, as lua.c's addreturn */
      struct strbuf ret;
      sb_init(&ret);
      sb_puts(&ret, "return ");
      sb_puts(&ret, s);
      int ok = !ret.failed && luaL_loadbuffer(L, ret.s, ret.n, "=stdin") == LUA_OK;
      lua_pop(L, 1);
      sb_puts(b, ok ? ret.s : s);
      sb_free(&ret);
      if (ok)
        break;
    }
    break;
  }
  while (!b->failed && !complete(L, b->s ? b->s : "", b->n)) {
    if (read_line(r, ">> ", line))
      break; /* the end of input: run what there is, its error says what is missing */
    sb_puts(b, "\n");
    sb_puts(b, line);
    sb_puts(&typed, "\n");
    sb_puts(&typed, line);
  }
#ifdef TYCHO_HAVE_READLINE
  if (r->tty && typed.n && !typed.failed) {
    add_history(typed.s);
    /* kept at once, so a session that dies keeps it (append fails on a file not there yet) */
    if (r->history && append_history(1, r->history) != 0)
      write_history(r->history);
    if (r->history)
      history_truncate_file(r->history, 1000);
  }
#endif
  sb_free(&typed);
  return 0;
}


/* ---- the REPL's commands, as help() lists them: the registry's "tycho.help.repl" in the shape
 * of the module's and the trainer's entries (bindings/tycho_help.c prints them all) ---- */

static const struct {
  const char *name, *usage, *help;
} repl_commands[] = {
  { "=", "=expr", "print the values of expr (a line that is an expression prints them too)" },
  { "@", "@0 / @2-3 / @dp=0 ...", "before a chunk: run it on those ranks only (@tp=1,pp=0: every coordinate holds)" },
  { "quit", "quit([code])", "end the session on every rank after this chunk, with that exit code (also Ctrl-D)" },
  { "detach", "detach()", "(tycho repl --attach) leave the job, which goes on training" },
  { "Ctrl-C", "Ctrl-C", "stop a chunk at the next step boundary on every rank; twice within 2 s ends the job" },
};

void repl_install_help(lua_State *L)
{
  const int top = lua_gettop(L);
  if (lua_getglobal(L, "tycho") == LUA_TTABLE && lua_getfield(L, -1, "help") == LUA_TFUNCTION)
    lua_setglobal(L, "help"); /* the module's (bindings), which prints these lines too */
  lua_settop(L, top);
  const int n = (int)(sizeof repl_commands / sizeof repl_commands[0]);
  lua_createtable(L, n, 1);
  lua_pushliteral(L, "the REPL");
  lua_setfield(L, -2, "title");
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 4);
    lua_pushstring(L, repl_commands[i].name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, repl_commands[i].usage);
    lua_setfield(L, -2, "usage");
    lua_pushstring(L, repl_commands[i].help);
    lua_setfield(L, -2, "help");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "method");
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, LUA_REGISTRYINDEX, "tycho.help.repl");
}

/* ---- completion (rank 0, or the rank a front-end asks): the names of globals, of a table's
 * fields after '.', of an object's fields and methods after '.', of its methods after ':' ---- */

struct completion {
  char prefix[256], stem[256];
  int method;
  char **names;
  int n;
};

static void push_path(lua_State *L, const char *path)
{
  lua_pushglobaltable(L);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = strtok(buf, ".:"); p && !lua_isnil(L, -1); p = strtok(NULL, ".:")) {
    if (lua_type(L, -1) != LUA_TTABLE && lua_type(L, -1) != LUA_TUSERDATA) {
      lua_pop(L, 1);
      lua_pushnil(L);
      break;
    }
    lua_getfield(L, -1, p); /* metamethods may run: this rank's own values only */
    lua_remove(L, -2);
  }
}

static void add_name(struct completion *c, const char *k)
{
  if (strncmp(k, c->stem, strlen(c->stem)) != 0 || k[0] == '_')
    return;
  char **grown = realloc(c->names, (size_t)(c->n + 1) * sizeof *c->names);
  if (!grown)
    return;
  c->names = grown;
  size_t len = strlen(c->prefix) + strlen(k) + 1;
  c->names[c->n] = malloc(len);
  if (c->names[c->n])
    snprintf(c->names[c->n++], len, "%s%s", c->prefix, k);
}

/* Under a protected call (a metamethod may raise): the names into the struct completion that
 * argument 1 (a light userdata) points to. */
static int collect_names(lua_State *L)
{
  struct completion *c = lua_touserdata(L, 1);
  lua_settop(L, 0);
  if (c->prefix[0])
    push_path(L, c->prefix);
  else
    lua_pushglobaltable(L);
  /* the value itself (a table), its metatable's __index table or "methods" (a trainer's), and
   * its metatable's __fields (the names its __index function answers) */
  for (int pass = 0; pass < 3; pass++) {
    lua_settop(L, 1);
    int t = 1;
    if (pass > 0) {
      if (!lua_getmetatable(L, 1))
        break;
      if (pass == 2) {
        if (c->method || lua_getfield(L, 2, "__fields") != LUA_TTABLE)
          continue;
        const lua_Integer n = luaL_len(L, 3);
        for (lua_Integer i = 1; i <= n; i++) {
          if (lua_rawgeti(L, 3, i) == LUA_TSTRING)
            add_name(c, lua_tostring(L, -1));
          lua_pop(L, 1);
        }
        continue;
      }
      if (lua_getfield(L, 2, "__index") != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_getfield(L, 2, "methods");
      }
      t = lua_gettop(L);
    }
    if (lua_type(L, t) != LUA_TTABLE)
      continue;
    lua_pushnil(L);
    while (lua_next(L, t)) {
      if (lua_type(L, -2) == LUA_TSTRING && (!c->method || lua_isfunction(L, -1)))
        add_name(c, lua_tostring(L, -2));
      lua_pop(L, 1);
    }
  }
  return 0;
}

static int compare_names(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int repl_completions(lua_State *L, const char *word, struct strbuf *out)
{
  struct completion c = { .n = 0 };
  /* split the word at its last '.' or ':' */
  const char *cut = strrchr(word, '.'), *colon = strrchr(word, ':');
  if (colon && (!cut || colon > cut))
    cut = colon;
  c.method = cut && *cut == ':';
  if (cut) {
    snprintf(c.prefix, sizeof c.prefix, "%.*s", (int)(cut - word + 1), word);
    snprintf(c.stem, sizeof c.stem, "%s", cut + 1);
  } else {
    snprintf(c.stem, sizeof c.stem, "%s", word);
  }
  int top = lua_gettop(L);
  lua_pushcfunction(L, collect_names);
  lua_pushlightuserdata(L, &c);
  lua_pcall(L, 1, 0, 0); /* an error (a metamethod's) leaves the names found before it */
  lua_settop(L, top);
  if (c.n > 1)
    qsort(c.names, (size_t)c.n, sizeof *c.names, compare_names);
  int kept = 0;
  for (int i = 0; i < c.n; i++) {
    if (!i || strcmp(c.names[i], c.names[i - 1]) != 0) {
      sb_puts(out, c.names[i]);
      sb_put(out, "\n", 1);
      kept++;
    }
  }
  for (int i = 0; i < c.n; i++) free(c.names[i]);
  free(c.names);
  return kept;
}

#ifdef TYCHO_HAVE_READLINE
/* readline's generator: the names of repl_completions, one per call. */
static char *completion_word(const char *text, int state)
{
  static struct strbuf names;
  static size_t at;
  if (!state) {
    sb_free(&names);
    sb_init(&names);
    repl_completions(repl_state->L, text, &names);
    at = 0;
  }
  if (!names.s || at >= names.n)
    return NULL;
  char *nl = memchr(names.s + at, '\n', names.n - at);
  size_t len = nl ? (size_t)(nl - (names.s + at)) : names.n - at;
  char *word = strndup(names.s + at, len);
  at += len + 1;
  return word;
}

char **repl_complete_names(const char *text, int start, int end)
{
  (void)start;
  (void)end;
  rl_attempted_completion_over = 1;
  return rl_completion_matches(text, completion_word);
}
#endif

/* ---- the plan's open ---- */

/* s as a Lua string literal. */
static void put_quoted(struct strbuf *b, const char *s)
{
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      sb_put(b, "\\", 1);
    if (*s == '\n') {
      sb_puts(b, "\\n");
      continue;
    }
    sb_put(b, s, 1);
  }
  sb_put(b, "\"", 1);
}

void repl_open_chunk(struct strbuf *b, const char *plan, const char *const *sets, int n_sets)
{
  sb_puts(b, "t = tycho.open(");
  put_quoted(b, plan);
  sb_puts(b, ", {");
  for (int i = 0; i < n_sets; i++) {
    if (i)
      sb_puts(b, ", ");
    put_quoted(b, sets[i]);
  }
  sb_puts(b, "})");
}
