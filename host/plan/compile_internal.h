/* Inside the plan compiler: the reader state and the helpers that compile.c (the sections and
 * the driver), compile_read.c (reading one field), compile_layers.c (the per-layer fields) and
 * compile_set.c (--set) share. Not for use outside host/plan/. */
#ifndef TYCHO_PLAN_COMPILE_INTERNAL_H
#define TYCHO_PLAN_COMPILE_INTERNAL_H
#include <lua.h>
#include <stddef.h>

#include "compile.h"
#include "lua/sandbox.h"

struct reader {
  lua_State *L;
  struct sandbox *sb;
  struct plan *p;
  char *err;
  size_t n;
  char field[128];                 /* the field being read, for a Lua error raised meanwhile */
  char field_where[PLAN_PATH_MAX + 32];
};

/* A table being read: its stack index, its dotted path and where it was written. */
struct tbl {
  int idx;
  char path[64];
  char where[PLAN_PATH_MAX + 32];
};

/* compile_read.c: one field of a table, checked against the schema; each returns 0, or -1 with
 * the message (it starts with the field's file and line) in r->err. */
int compile_rfail(struct reader *r, const char *where, const char *fmt, ...);
const char *compile_describe(lua_State *L, int idx, char *buf, size_t n);
int compile_check_fields(struct reader *r, const struct tbl *t, const char *const *known, const char *what);
int compile_get(struct reader *r, const struct tbl *t, const char *key, char *path, size_t pn,
                char *where, size_t wn);
int compile_is_integral(lua_State *L, int idx, long long *out);
/* A field of the plan-field table (fields.h), key of t: its type, range and message from the
 * table; *present (when not NULL) set to whether it was written. */
int compile_read_field(struct reader *r, const struct tbl *t, const char *key, int *present);
int compile_match_enum(struct reader *r, int idx, const char *const *names, const char *path,
                       const char *where, const char *context, int *out);
int compile_read_enum(struct reader *r, const struct tbl *t, const char *key, const char *const *names, int *out);
int compile_open_section(struct reader *r, const struct tbl *t, const char *key, struct tbl *sub, int *present);
int compile_call_plan_function(struct reader *r, int fidx, int nargs, const char *what);

/* compile_layers.c: stages, tp_split and recompute. */
int compile_read_stages(struct reader *r, const struct tbl *root);
int compile_read_tp_split(struct reader *r, const struct tbl *root);
int compile_read_recompute(struct reader *r, const struct tbl *root);

/* compile_set.c: applies one --set override ("path.to.field=value") to the plan table at plan_idx. */
int compile_apply_set(struct reader *r, int plan_idx, const char *set);

#endif
