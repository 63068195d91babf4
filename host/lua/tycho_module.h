/* The `tycho` Lua module as plan files see it: tycho.plan{...}, tycho.extend(base, overrides),
 * tycho.models.from_hf(dir) (the model table of a Hugging Face folder's config.json),
 * tycho.version. docs/plans.md gives the schema these tables follow. */
#ifndef TYCHO_MODULE_H
#define TYCHO_MODULE_H
#include <lua.h>

/* Pushes the module table. */
int luaopen_tycho(lua_State *L);

/* 1 when the table at idx was made by tycho.plan (or tycho.extend of a plan). */
int tycho_is_plan(lua_State *L, int idx);

/* 1 when the table at idx is a list: non-empty, its keys exactly 1..#t. */
int tycho_is_list(lua_State *L, int idx);

/* Deep-merges the table at `over` into a deep copy of the table at `base` and pushes the
 * result: nested tables merge, lists (tables with keys 1..n only) and other values replace.
 * Every key of the result keeps the source line it was written on. */
void tycho_extend(lua_State *L, int base, int over);

#endif
