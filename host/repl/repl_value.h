/* How the REPL shows the values a chunk returns (`=expr`, an expression line): a table by its
 * contents, the same text on every rank for the same contents, so ranks' lines collapse. */
#ifndef TYCHO_REPL_VALUE_H
#define TYCHO_REPL_VALUE_H
#include <lua.h>

#include "util/strbuf.h"

/* Limits: tables deeper than this show as {...}; a value's text stops near this many bytes
 * with " ..." (a table of a million entries costs its first few thousand, not a million lines). */
#define REPL_VALUE_MAX_DEPTH 16
#define REPL_VALUE_MAX_BYTES (64 * 1024)
#define REPL_VALUE_WIDTH 80 /* a table whose one-line form fits stays on one line */

/* Appends the value at idx to out. A table (without __tostring) shows its contents as Lua
 * source: the list part first in order, then the other keys sorted (numbers, strings, booleans),
 * strings quoted, nested tables indented by two spaces, a table that fits in REPL_VALUE_WIDTH
 * columns on one line; a table met again inside itself is <cycle>, a function, thread or
 * userdata without __tostring inside a table <function>, <thread>, <userdata> (an address
 * differs on every rank). Anything else, and a value with __tostring, as print shows it. Never
 * calls metamethods but __tostring (an error in one shows as <__tostring failed>). May raise a
 * Lua memory error: call it in protected mode. */
void repl_format_value(lua_State *L, int idx, struct strbuf *out);

/* A lua_CFunction: its arguments formatted by repl_format_value, tab-separated and ended by a
 * newline, returned as one string. */
int repl_format_values(lua_State *L);

#endif
