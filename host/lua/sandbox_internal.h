/* Inside the sandbox: what sandbox.c, sandbox_patterns.c (bounded pattern matching) and
 * sandbox_charge.c (the C library's work charged to the instruction count) share. Not for use
 * outside host/lua/. */
#ifndef TYCHO_SANDBOX_INTERNAL_H
#define TYCHO_SANDBOX_INTERNAL_H
#include <lua.h>

#include "sandbox.h"

/* What C work costs in the instruction count (see sandbox_charge.c),
 * measured against a VM instruction's ~10 ns: filling allocated bytes runs at about 4 bytes an
 * instruction's time, parsing byte by byte (utf8.len, tonumber, string.packsize) at about 1, and
 * a table element moved through the API (metamethods included) takes about 10. */
#define ALLOC_BYTES_PER_INSTRUCTION 4.0
#define SCAN_BYTES_PER_INSTRUCTION 1.0
#define ELEMENT_COST 10.0
#define FORMAT_BYTE_COST 2.0

/* The count hook (sandbox.c); sandbox_charge installs it on every instruction once the limit
 * fires. */
void sandbox_count_hook(lua_State *L, lua_Debug *ar);

/* Whether msg starts with "file:line:" already (sandbox_patterns.c). */
int sandbox_has_position(const char *msg);

/* Replaces string.find, match, gmatch and gsub in the string library at strlib by their
 * bounded versions (sandbox_patterns.c). */
void sandbox_guard_patterns(lua_State *L, int strlib);

/* Installs the charged library functions in the real library tables (sandbox_charge.c). */
void sandbox_charge_libraries(lua_State *L);

#endif
