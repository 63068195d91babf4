/* The plan-field table: each scalar field of a plan described once (its path, type, range,
 * default, whether a running trainer may change it, what a resume compares), and the checks and
 * conversions every reader of a field goes through: the compiler, --set (whose values the
 * compiler reads), t:set, the plan JSON and the resume comparison. Pure C except
 * plan_field_from_lua, which the compiler and t:set share (it lives in compile_read.c). */
#ifndef TYCHO_PLAN_FIELDS_H
#define TYCHO_PLAN_FIELDS_H
#include <stddef.h>

#include "plan.h"

struct lua_State;
struct json;

enum plan_field_type {
  PLAN_FIELD_NUMBER, /* double */
  PLAN_FIELD_INT,    /* int */
  PLAN_FIELD_LONG,   /* long long */
  PLAN_FIELD_BOOL,   /* int, 0 or 1 */
  PLAN_FIELD_ENUM,   /* an enum, the index of its name in `names` */
  PLAN_FIELD_NAME,   /* one of `names`, kept as its text (char[size]) */
  PLAN_FIELD_TEXT    /* a non-empty UTF-8 string (char[size]); empty: not given */
};

/* What a resume does with the field (docs/design.md, "Checkpoints"). */
enum plan_field_resume {
  PLAN_RESUME_FREE,   /* not compared: how the run is driven (cadences, files written, device) */
  PLAN_RESUME_LAYOUT, /* may differ: the checkpoint reshards (mesh, ZeRO, schedule, micro-batch) */
  PLAN_RESUME_EQUAL,  /* must equal the checkpoint's, unless checkpoint.allow_changes names it */
  PLAN_RESUME_PARENT  /* not compared itself; derived fields follow it, and allowing it allows them */
};

enum {
  PLAN_FIELD_MIN_OPEN = 1 << 0, /* min excluded */
  PLAN_FIELD_MAX_OPEN = 1 << 1, /* max excluded */
  PLAN_FIELD_FINITE = 1 << 2,   /* inf and -inf refused (plan_validate, and t:set) */
  PLAN_FIELD_LIVE = 1 << 3,     /* t:set may change it between steps: the runtime reads it afresh */
  PLAN_FIELD_REQUIRED = 1 << 4, /* required when its section is given: no default */
  PLAN_FIELD_DERIVED = 1 << 5,  /* no default: when not written it follows another field */
  PLAN_FIELD_IN_SECTION = 1 << 6 /* its default applies when its section is given (model.moe) */
};

struct plan_field {
  const char *path;
  enum plan_field_type type;
  size_t offset, size;       /* where in struct plan, and how many bytes */
  double min, max;           /* NUMBER, INT, LONG */
  unsigned flags;
  const char *const *names;  /* ENUM, NAME: the names, NULL-terminated */
  double def;                /* the default (an ENUM's index) */
  const char *def_text;      /* NAME, TEXT: the default text, or NULL for none */
  enum plan_field_resume resume;
  int resume_index;          /* EQUAL, PARENT: its name's index (plan_resume_field_name), else -1 */
  long derived_at;           /* EQUAL: offset of an int that is 1 when the value follows `follows`, or -1 */
  const char *follows;       /* the PARENT field a derived value follows, or NULL */
};

extern const struct plan_field plan_fields[];
extern const int plan_n_fields;

/* The row of a dotted path, or NULL. */
const struct plan_field *plan_field_find(const char *path);

/* Sets every field that has a default (not REQUIRED, DERIVED or IN_SECTION) to it; with a
 * section ("model.moe"), the IN_SECTION fields under it. */
void plan_fields_default(struct plan *p, const char *section);

/* The closest of names to word by spelling (a swap of neighbours is one edit), or NULL when
 * none is close enough to suggest. */
const char *plan_field_closest(const char *word, const char *const *names);

/* Checks the Lua value at idx against row f and writes it into p. 0, or -1 with
 * "<path> = <value>: must be ..." in err (no place prefix: the caller adds where). The finite
 * check (FINITE rows) only with `finite`: the compiler leaves it to plan_validate. */
int plan_field_from_lua(struct lua_State *L, int idx, const struct plan_field *f, struct plan *p, int finite,
                        char *err, size_t err_size);

/* 0 when the FINITE field f of p is finite, else -1 with "<path> = inf: must be a finite number". */
int plan_field_check_finite(const struct plan_field *f, const struct plan *p, char *err, size_t err_size);

/* Field f of p as the plan JSON writes it: its key (the path's last part) and value. */
void plan_field_json(const struct plan_field *f, const struct plan *p, struct json *j);
/* Every field directly under section (e.g. "optimizer"), in table order. */
void plan_fields_json(const char *section, const struct plan *p, struct json *j);

/* Field f of p as a resume compares it: numbers with all their digits, text quoted ("none" when
 * empty), names quoted. */
void plan_field_text(const struct plan_field *f, const struct plan *p, char *buf, size_t n);

#endif
