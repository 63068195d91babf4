/* The source-map rewriter (lua/srcmap.h) against plain Lua: every snippet, valid Lua written
 * the many ways Lua allows (keywords against a brace, call syntax `f{...}`, strings, long
 * strings and comments beside braces, CRLF), must load after rewriting and give the same values
 * as the original text, and a snippet that fails at run time must fail with the same message,
 * file:line included. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lua/srcmap.h"

static struct srcmap *current_map;

/* __tycho_tc(id, t): the table, once the id names a record of the map. */
static int tc(lua_State *L)
{
  lua_Integer id = luaL_checkinteger(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  if (!srcmap_get(current_map, (int)id))
    return luaL_error(L, "no record %d", (int)id);
  lua_settop(L, 2);
  return 1;
}

/* A canonical text of any value the snippets return (sorted keys, strings quoted). */
static const char serializer[] =
  "local function ser(v)\n"
  "  if type(v) ~= 'table' then return type(v) == 'string' and string.format('%q', v) or tostring(v) end\n"
  "  local keys = {}\n"
  "  for k in pairs(v) do keys[#keys + 1] = k end\n"
  "  table.sort(keys, function(a, b) return type(a) .. tostring(a) < type(b) .. tostring(b) end)\n"
  "  local out = {}\n"
  "  for _, k in ipairs(keys) do out[#out + 1] = ser(k) .. '=' .. ser(v[k]) end\n"
  "  return '{' .. table.concat(out, ',') .. '}'\n"
  "end\n"
  "return function(ok, ...) return tostring(ok) .. ' ' .. ser(table.pack(...)) end\n";

/* Loads and runs `src` (rewritten when `rewrite`), returns "true {values}" or "false {message}";
 * NULL when the text does not load. */
static char *run(const char *src, size_t n, int rewrite)
{
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  struct srcmap map;
  srcmap_init(&map);
  current_map = &map;
  lua_pushcfunction(L, tc);
  lua_setglobal(L, "__tycho_tc");
  char *result = NULL;
  if (luaL_loadstring(L, serializer) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK) {
    fprintf(stderr, "serializer: %s\n", lua_tostring(L, -1));
    goto out;
  }
  const char *text = src;
  size_t len = n;
  char *rewritten = NULL;
  if (rewrite) {
    rewritten = srcmap_rewrite(&map, "snippet.lua", src, n, &len);
    if (!rewritten)
      goto out;
    text = rewritten;
  }
  lua_pushboolean(L, 0); /* serializer's `ok`, set below */
  int loaded = luaL_loadbufferx(L, text, len, "@snippet.lua", "t");
  free(rewritten);
  if (loaded != LUA_OK) {
    fprintf(stderr, "%s does not load: %s\n", rewrite ? "rewritten" : "original", lua_tostring(L, -1));
    goto out;
  }
  int base = lua_gettop(L) - 1; /* the boolean */
  int ok = lua_pcall(L, 0, LUA_MULTRET, 0) == LUA_OK;
  lua_pushboolean(L, ok);
  lua_replace(L, base);
  if (lua_pcall(L, lua_gettop(L) - base + 1, 1, 0) != LUA_OK) {
    fprintf(stderr, "serialize: %s\n", lua_tostring(L, -1));
    goto out;
  }
  result = strdup(lua_tostring(L, -1));
out:
  lua_close(L);
  srcmap_free(&map);
  return result;
}

static void same_as_plain(const char *src)
{
  size_t n = strlen(src);
  char *plain = run(src, n, 0), *ours = run(src, n, 1);
  CHECK_MSG(plain != NULL, "the snippet itself does not load: %s", src);
  CHECK_MSG(ours && plain && strcmp(plain, ours) == 0, "snippet [%s]: plain Lua gives %s, rewritten %s", src,
            plain ? plain : "(none)", ours ? ours : "(does not load)");
  free(plain);
  free(ours);
}

/* Keywords written against a brace stay keywords. */
static void test_keywords_against_braces(void)
{
  static const char *const snippets[] = {
    "return{1,2,3}",
    "return{}",
    "local a = true return a and{1} or{2}",
    "local a = false return a and{x=1}or{y=2}",
    "local a = nil return a or{'default'}",
    "return not{}",
    "local t = {} for k, v in pairs{a=1, b=2} do t[k] = v end return t",
    "local n = 0 for _ in next,{1,2,3} do n = n + 1 end return n",
    "local i = 0 repeat i = i + 1 until{} return i",
    "if{} then return 'if' end",
    "if false then elseif{} then return 'elseif' end",
    "while{} do return 'while' end",
    "do return{8} end",
    "return#{1,2}",
    "return -#{1}",
    "local a = {} local b = a or{} return b == a",
    "return 1,{2},{{3}},{{{}}}",
    "local function f(...) return{...} end return f(1, nil, 3)",
    "return{...}",
    "local t = {f = function() return{7} end} return t.f()",
    "local function g() return{[1]={},['k']={x={}},[2+1]={}} end return g()",
    "local x = {y = {z = {}}} x.y.z[1] = {}; return x",
    "goto skip do return{'no'} end ::skip:: return{'yes'}",
    "local t <const> = {1} return t",
    "return{a=1;b=2;3,4;}",
  };
  for (size_t i = 0; i < sizeof snippets / sizeof snippets[0]; i++)
    same_as_plain(snippets[i]);
}

/* Call syntax and literals, long strings and comments right beside braces. */
static void test_calls_strings_comments(void)
{
  static const char *const snippets[] = {
    "local function f(t) return t end return f{1,2}, f'x', f[[y]], f{}",
    "local function f(t) return function(u) return {t, u} end end return f{1}{2}",
    "local function f(s) return function(t) return {s, t} end end return f'a'{3}, f[[b]]{4}",
    "local o = {v = 1} function o:m(t) return self.v + #t end return o:m{1,2}",
    "local o = {v = {w = function(t) return t end}} return o.v.w{9}, o['v'].w{10}",
    "local f = function(t) return t end return (f){11}",
    "local s = 'a' .. '{' .. '}' return s, '{', [[}]], [==[{]]{]==]",
    "return{\"\\\"{\", '\\'}', \"\\z\n   }\"}",
    "return --[[c]]{1}",
    "return--[[c]]{2}",
    "return--[==[{]==]{3}",
    "return -- {\n{4}",
    "return{--[[}]]5}",
    "return{[[}]]}",
    "return{[ [[k]] ]=1}",
    "local x={y=1}return x.y",
    "local t = {} t.x={} t['y']={} return t",
    "return{0x1p-2, 1e+2, 3.5e-1, 0xA}",
    "local a = 1 return{a//1, a~1, a<<1, a>>1, a..'', a==1, a~=2, a<=1, a>=1}",
  };
  for (size_t i = 0; i < sizeof snippets / sizeof snippets[0]; i++)
    same_as_plain(snippets[i]);
}

/* Errors keep their file:line, also beside rewritten constructors and across CRLF, long
 * strings and escaped newlines. */
static void test_error_lines(void)
{
  static const char *const snippets[] = {
    "local t = {\n  a = 1,\n}\nerror('boom')",
    "return{\n  x = nil + 1 }",
    "local x = true and{\n}\n or{}\nerror('after and/or')",
    "return{\n1,\n2,\n} + 1",
    "local t = {}\nt.a.b = 1",
    "local a = 1\r\nreturn{\r\n b = undefined_global.d }",
    "local a = 1\n\rreturn{\n\r b = undefined_global.d }",
    "local s = [[\n{\n]] error('after a long string')",
    "local s = 'a\\\nb' error('after an escaped newline')",
    "local s = 'a\\z\n\n   b' error('after \\\\z')",
    "--[==[\n{\n]==] return{\nerror('in a constructor')}",
    "return{\n  f = function()\n  end,\n  g = (nil)(),\n}",
    "if{} then\n  error('in if{}')\nend",
  };
  for (size_t i = 0; i < sizeof snippets / sizeof snippets[0]; i++)
    same_as_plain(snippets[i]);
  /* the run itself: the error message names the line */
  static const char bad[] = "return{\n  a = 1,\n  b = nil .. 'x',\n}";
  char *r = run(bad, sizeof bad - 1, 1);
  CHECK_STR_CONTAINS(r, "snippet.lua:3:");
  free(r);
}

/* The records: one per constructor, at the line of its brace, each key at its own line. */
static void test_records(void)
{
  struct srcmap m;
  srcmap_init(&m);
  static const char src[] = "local big = false\n"
                            "local m = big and{ n = 4 } or{\n"
                            "  n = 2,\n"
                            "}\n"
                            "return{\n"
                            "  name = 'x',\n"
                            "  model = m,\n"
                            "}\n";
  size_t n = 0;
  char *out = srcmap_rewrite(&m, "p.lua", src, sizeof src - 1, &n);
  CHECK(out != NULL);
  CHECK(m.n_records == 3);
  const struct srcmap_record *r0 = srcmap_get(&m, 0), *r1 = srcmap_get(&m, 1), *r2 = srcmap_get(&m, 2);
  CHECK(r0 && r0->line == 2 && r1 && r1->line == 2 && r2 && r2->line == 5);
  const struct srcmap_field *f = srcmap_find_field(&m, 1, "n", 0);
  CHECK(f && f->line == 3);
  f = srcmap_find_field(&m, 2, "model", 0);
  CHECK(f && f->line == 7);
  /* no line moved: the rewritten text has as many newlines as the source */
  int nl_src = 0, nl_out = 0;
  for (size_t i = 0; i < sizeof src - 1; i++) nl_src += src[i] == '\n';
  for (size_t i = 0; out && i < n; i++) nl_out += out[i] == '\n';
  CHECK(nl_src == nl_out);
  free(out);
  srcmap_free(&m);
}

int main(void)
{
  const struct test_case tests[] = {
    TEST(test_keywords_against_braces),
    TEST(test_calls_strings_comments),
    TEST(test_error_lines),
    TEST(test_records),
  };
  return test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
}
