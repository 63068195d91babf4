/* The plan compiler: plan.lua → (sandboxed Lua) → plan table → struct plan (docs/design.md, "Plans
 * are compiled once"). This is the only part of the plan pipeline that touches Lua; what it returns
 * is data. */
#ifndef TYCHO_PLAN_COMPILE_H
#define TYCHO_PLAN_COMPILE_H
#include <stddef.h>
#include <stdio.h>

#include "plan.h"

struct plan_compile_options {
  int world;                   /* ranks in the job; 0 when unknown (then dp must be a number) */
  int unsafe;                  /* lift the sandbox (--unsafe) */
  size_t memory_limit;         /* Lua heap cap in bytes; 0: default */
  long long instruction_limit; /* Lua instruction cap; 0: default */
  int n_sets;
  const char *const *sets;     /* "path.to.field=value" overrides (--set), applied in order */
};

/* Compiles the plan file at `path`. 0 ok; -1 with the one-line message in err (it starts with
 * the file and line of the offending field). On success `out` owns its memory (plan_free). */
int plan_compile(const char *path, const struct plan_compile_options *opt, struct plan *out,
                 char *err, size_t err_size);

/* Writes to f a Lua statement that does to the table in the local `plan` what `--set set` does
 * to a plan (the same path, the same value by the same rules), through the function `set` the
 * caller has written (tycho tune, whose plan files keep the --set it was given). */
void plan_set_as_lua(FILE *f, const char *set);

#endif
