/* How the REPL shows a returned value (repl/repl_value.h), text for text: a table by its
 * contents with keys sorted (the list part first), strings quoted inside it, a short table on one
 * line and a long one indented, the same text whatever order the table was filled in (so ranks'
 * lines collapse), no addresses inside tables, cycles, depth and size held, and top-level values
 * other than tables as print shows them. */
#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "repl/repl_value.h"

static char text[1 << 18];

/* The text repl_format_values gives for the values `code` returns. */
static const char *shown(const char *code)
{
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  text[0] = 0;
  lua_pushcfunction(L, repl_format_values);
  if (luaL_loadstring(L, code) || lua_pcall(L, 0, LUA_MULTRET, 0)) {
    snprintf(text, sizeof text, "error: %s", lua_tostring(L, -1));
  } else if (lua_pcall(L, lua_gettop(L) - 1, 1, 0)) {
    snprintf(text, sizeof text, "error: %s", lua_tostring(L, -1));
  } else {
    snprintf(text, sizeof text, "%s", lua_tostring(L, -1));
  }
  lua_close(L);
  return text;
}

#define CHECK_SHOWN(code, want) do { const char *g_ = shown(code), *w_ = (want); \
  CHECK_MSG(strcmp(g_, w_) == 0, "%s\n  got  \"%s\"\n  want \"%s\"", (code), g_, w_); } while (0)

static void test_short_tables_on_one_line_keys_sorted(void)
{
  CHECK_SHOWN("return { tp = 1, dp = 4, pp = 1, ep = 1, zero = 0 }", "{ dp = 4, ep = 1, pp = 1, tp = 1, zero = 0 }\n");
  CHECK_SHOWN("return {}", "{}\n");
  CHECK_SHOWN("return { 1, 2, 'x', n = 3, [10] = true, ['a b'] = 1.5, [false] = 0, [2.5] = 'h' }",
              "{ 1, 2, \"x\", [2.5] = \"h\", [10] = true, [\"a b\"] = 1.5, n = 3, [false] = 0 }\n");
  CHECK_SHOWN("return { ['end'] = 1, _x1 = 2, ['1a'] = 3 }", "{ [\"1a\"] = 3, _x1 = 2, [\"end\"] = 1 }\n");
  CHECK_SHOWN("return { s = 'a\"b\\n\\t\\1\\\\' }", "{ s = \"a\\\"b\\n\\t\\001\\\\\" }\n");
  CHECK_SHOWN("return { lr = 5e-4, steps = 2.0, big = 2^63, inf = 1/0 }",
              "{ big = 9.2233720368548e+18, inf = inf, lr = 0.0005, steps = 2.0 }\n");
}

static void test_long_tables_indented(void)
{
  CHECK_SHOWN("return { model = { dim = 128, n_layers = 4, family = 'llama', n_heads = 8, n_kv_heads = 4, "
              "ffn_dim = 384, vocab = 64 }, zero = 0, mesh = { tp = 1, dp = 4 }, "
              "list = { 'aaaaaaaaaa', 'bbbbbbbbbb', 'cccccccccc', 'dddddddddd', 'eeeeeeeeee', 'ffffffffff' } }",
              "{\n"
              "  list = {\n"
              "    \"aaaaaaaaaa\",\n"
              "    \"bbbbbbbbbb\",\n"
              "    \"cccccccccc\",\n"
              "    \"dddddddddd\",\n"
              "    \"eeeeeeeeee\",\n"
              "    \"ffffffffff\",\n"
              "  },\n"
              "  mesh = { dp = 4, tp = 1 },\n"
              "  model = {\n"
              "    dim = 128,\n"
              "    family = \"llama\",\n"
              "    ffn_dim = 384,\n"
              "    n_heads = 8,\n"
              "    n_kv_heads = 4,\n"
              "    n_layers = 4,\n"
              "    vocab = 64,\n"
              "  },\n"
              "  zero = 0,\n"
              "}\n");
  /* 80 columns: a line of exactly 80 stays one line, 81 does not */
  CHECK_SHOWN("return { s = '" "0123456789012345678901234567890123456789012345678901234567890123456789" "' }",
              "{ s = \"0123456789012345678901234567890123456789012345678901234567890123456789\" }\n");
  CHECK_SHOWN("return { s = '" "01234567890123456789012345678901234567890123456789012345678901234567890" "' }",
              "{\n  s = \"01234567890123456789012345678901234567890123456789012345678901234567890\",\n}\n");
}

static void test_same_contents_same_text(void)
{
  const char *a = "local t = {} for i = 1, 40 do t['k' .. i] = i end return t";
  const char *b = "local t = {} for i = 40, 1, -1 do t['k' .. i] = i end t.x = nil return t";
  char first[1 << 14];
  snprintf(first, sizeof first, "%s", shown(a));
  CHECK(strcmp(first, shown(b)) == 0);
  CHECK_STR_CONTAINS(first, "  k1 = 1,\n  k10 = 10,\n  k11 = 11,\n");
}

static void test_no_addresses_cycles_and_limits(void)
{
  CHECK_SHOWN("return { f = print, co = coroutine.create(print) }", "{ co = <thread>, f = <function> }\n");
  /* a userdata with __tostring inside a table: as print shows it */
  CHECK_STR_CONTAINS(shown("return { u = io.stdout }"), "{ u = file (0x");
  CHECK_SHOWN("local a = { x = 1 } a.self = a a.inner = { up = a } return a",
              "{ inner = { up = <cycle> }, self = <cycle>, x = 1 }\n");
  CHECK_SHOWN("local shared = { 1 } return { a = shared, b = shared }", "{ a = { 1 }, b = { 1 } }\n");
  CHECK_SHOWN("return setmetatable({ 1 }, { __tostring = function() return 'T' end }), { setmetatable({}, "
              "{ __tostring = function() return 'U' end }) }", "T\t{ U }\n");
  /* deeper than REPL_VALUE_MAX_DEPTH: {...} */
  const char *deep = shown("local t = {} local c = t for i = 1, 30 do c.n = {} c = c.n end return t");
  CHECK_STR_CONTAINS(deep, "{...}");
  CHECK(strlen(deep) < 2000);
  /* a huge table stops near REPL_VALUE_MAX_BYTES, still closed */
  const char *huge = shown("local t = {} for i = 1, 100000 do t['key' .. i] = i end return t");
  CHECK(strlen(huge) > REPL_VALUE_MAX_BYTES && strlen(huge) < REPL_VALUE_MAX_BYTES + 200);
  CHECK(strlen(huge) > 8 && strcmp(huge + strlen(huge) - 8, "  ...\n}\n") == 0);
}

static void test_top_level_values_as_print(void)
{
  CHECK_SHOWN("return 'hi', 3, 0.5, 2.0, nil, true", "hi\t3\t0.5\t2.0\tnil\ttrue\n");
  CHECK_SHOWN("return 1, { a = 1 }, 'x'", "1\t{ a = 1 }\tx\n");
  CHECK_STR_CONTAINS(shown("return print"), "function: ");
  CHECK_SHOWN("return setmetatable({}, { __tostring = function() error('boom', 0) end })", "error: boom");
}

TEST_MAIN(TEST(test_short_tables_on_one_line_keys_sorted), TEST(test_long_tables_indented),
          TEST(test_same_contents_same_text), TEST(test_no_addresses_cycles_and_limits),
          TEST(test_top_level_values_as_print))
