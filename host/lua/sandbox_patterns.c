/* Bounded pattern matching for the sandbox (see sandbox.c): string.find, match, gmatch and
 * gsub charge an upper bound of the matcher's work to the instruction count before they run,
 * and refuse a match whose bound exceeds what the limit has left. */
#include <ctype.h>
#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

#include "sandbox_internal.h"

/* Lua matches patterns in C, where the count hook never runs, and its backtracking can take
 * time exponential in the pattern: string.find(("a"):rep(3000), (".-"):rep(15) .. "b") would
 * run for ages. Before each find, match, gmatch or gsub the sandbox bounds the matcher's work
 * from the pattern and the subject: the start positions (one when anchored), times the
 * branching of each repetition item (the longest run of subject bytes its class matches, plus
 * one; two for '?'), times the steps along one branch. That bound is charged to the
 * instruction count (PATTERN_STEPS_PER_INSTRUCTION steps a VM instruction), so the limit stays
 * deterministic, alike on every rank, and a match whose bound exceeds what is left is refused
 * before it runs. Ordinary patterns are cheap under it: a class like %w or %s branches only as
 * far as the subject has runs of such bytes. */
#define PATTERN_STEPS_PER_INSTRUCTION 8.0

static int class_matches(int c, int cl)
{
  int res;
  switch (tolower(cl)) {
  case 'a': res = isalpha(c); break;
  case 'c': res = iscntrl(c); break;
  case 'd': res = isdigit(c); break;
  case 'g': res = isgraph(c); break;
  case 'l': res = islower(c); break;
  case 'p': res = ispunct(c); break;
  case 's': res = isspace(c); break;
  case 'u': res = isupper(c); break;
  case 'w': res = isalnum(c); break;
  case 'x': res = isxdigit(c); break;
  default: return cl == c;
  }
  if (isupper(cl))
    res = !res;
  return res != 0;
}

/* A bracket class p[0, n) with p[0] == '[' and p[n - 1] == ']'. */
static int set_matches(int c, const unsigned char *p, size_t n)
{
  int sig = 1;
  size_t i = 1, end = n - 1;
  if (i < end && p[i] == '^') {
    sig = 0;
    i++;
  }
  for (; i < end; i++) {
    if (p[i] == '%' && i + 1 < end) {
      i++;
      if (class_matches(c, p[i]))
        return sig;
    } else if (i + 2 < end && p[i + 1] == '-') {
      if (p[i] <= c && c <= p[i + 2])
        return sig;
      i += 2;
    } else if (p[i] == c) {
      return sig;
    }
  }
  return !sig;
}

/* Whether the single-character class cls[0, n) may match c (a malformed one: yes). */
static int single_matches(int c, const unsigned char *cls, size_t n)
{
  if (cls[0] == '.')
    return 1;
  if (cls[0] == '%')
    return n < 2 || class_matches(c, cls[1]);
  if (cls[0] == '[')
    return n < 2 || cls[n - 1] != ']' || set_matches(c, cls, n);
  return cls[0] == c;
}

static double longest_run(const unsigned char *s, size_t n, const unsigned char *cls, size_t cn)
{
  if (cls[0] == '.')
    return (double)n;
  size_t best = 0, run = 0;
  for (size_t i = 0; i < n; i++) {
    run = single_matches(s[i], cls, cn) ? run + 1 : 0;
    if (run > best)
      best = run;
  }
  return (double)best;
}

/* The index just past the set that starts at p[i] == '['; pl when it is not closed. */
static size_t set_end(const unsigned char *p, size_t pl, size_t i)
{
  size_t j = i + 1;
  if (j < pl && p[j] == '^')
    j++;
  for (;;) {
    if (j >= pl)
      return pl;
    if (p[j++] == '%' && j < pl)
      j++;
    if (j >= pl)
      return pl;
    if (p[j] == ']')
      return j + 1;
  }
}

/* An upper bound on the matcher's steps for pattern p over subject s (see above). */
static double pattern_bound(const unsigned char *s, size_t n, const unsigned char *p, size_t pl, int may_anchor)
{
  size_t i = 0;
  int anchored = 0;
  if (may_anchor && pl && p[0] == '^') {
    anchored = 1;
    i = 1;
  }
  double branches = 1, steps = (double)pl + 1;
  while (i < pl) {
    unsigned char c = p[i];
    if (c == '(' || c == ')' || (c == '$' && i + 1 == pl)) {
      i++;
      continue;
    }
    size_t cls = i, end;
    if (c == '%') {
      if (i + 1 >= pl)
        break; /* malformed: Lua says so */
      unsigned char d = p[i + 1];
      if (d == 'b') { /* %bxy: one scan */
        steps += (double)n;
        i += 4;
        continue;
      }
      if (d == 'f') { /* %f[set]: one test */
        i = i + 2 < pl && p[i + 2] == '[' ? set_end(p, pl, i + 2) : i + 2;
        continue;
      }
      if (d >= '0' && d <= '9') { /* a back reference: one comparison */
        steps += (double)n;
        i += 2;
        continue;
      }
      end = i + 2;
    } else if (c == '[') {
      end = set_end(p, pl, i);
    } else {
      end = i + 1;
    }
    unsigned char q = end < pl ? p[end] : 0;
    if (q == '*' || q == '+' || q == '-') {
      double run = longest_run(s, n, p + cls, end - cls);
      branches *= run + 1;
      steps += run + 1;
      end++;
    } else if (q == '?') {
      branches *= 2;
      end++;
    }
    i = end;
  }
  return (anchored ? 1.0 : (double)n + 1) * branches * steps;
}

/* Charges the bound of a pattern call (subject and pattern at 1, 2) or refuses it. */
static void charge_pattern(lua_State *L, const char *what, int may_anchor, int plain)
{
  struct sandbox *sb = sandbox_of(L);
  size_t n, pl;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  const unsigned char *p = (const unsigned char *)luaL_checklstring(L, 2, &pl);
  if (!sb || !sb->instruction_limit)
    return;
  double bound = plain ? ((double)n + 1) * ((double)pl + 1) : pattern_bound(s, n, p, pl, may_anchor);
  double cost = bound / PATTERN_STEPS_PER_INSTRUCTION;
  double left = (double)sb->instruction_limit - (double)sb->instructions;
  if (cost > left) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: the pattern could backtrack up to %.3g steps on this %zu-byte "
             "subject, more than the plan's instruction limit has left (Lua matches patterns in C, "
             "outside the count); simplify the pattern (fewer '-', '*', '+' items, an anchor) or "
             "shorten the subject: \"%.40s%s\"", what, bound, n, (const char *)p, pl > 40 ? "..." : "");
    luaL_error(L, "%s", msg);
  }
  sb->instructions += (long long)cost;
}

/* "file:line: ..." already */
int sandbox_has_position(const char *msg)
{
  const char *c = strchr(msg, ':');
  if (!c || c == msg || !isdigit((unsigned char)c[1]))
    return 0;
  for (c++; isdigit((unsigned char)*c); c++)
    ;
  return *c == ':';
}

/* string.find, match, gmatch, gsub: the library's function (upvalue 1) after the charge. Its
 * own errors ("malformed pattern") get the plan line that called it, which a C function called
 * from C would not have. */
static int guarded_pattern(lua_State *L)
{
  const char *what = lua_tostring(L, lua_upvalueindex(2));
  int find = strcmp(what, "string.find") == 0, gmatch = strcmp(what, "string.gmatch") == 0;
  charge_pattern(L, what, !gmatch, find && lua_toboolean(L, 4));
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  if (status != LUA_OK) {
    struct sandbox *sb = sandbox_of(L);
    if (status != LUA_ERRMEM && !(sb && sb->limit_hit) && lua_type(L, -1) == LUA_TSTRING &&
        !sandbox_has_position(lua_tostring(L, -1))) {
      luaL_where(L, 1);
      lua_pushfstring(L, "%s: ", what);
      lua_rotate(L, -3, 2);
      lua_concat(L, 3);
    }
    return lua_error(L);
  }
  return lua_gettop(L);
}

void sandbox_guard_patterns(lua_State *L, int strlib)
{
  static const char *const names[] = { "find", "match", "gmatch", "gsub" };
  strlib = lua_absindex(L, strlib);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    lua_getfield(L, strlib, names[i]);
    lua_pushfstring(L, "string.%s", names[i]);
    lua_pushcclosure(L, guarded_pattern, 2);
    lua_setfield(L, strlib, names[i]);
  }
}
