/* The plan-field table (host/plan/fields.h) is self-consistent:
 *   - every path resolves to its own row, once; every row lies inside struct plan with the size
 *     of its type; enumerations have names; only numbers are checked finite;
 *   - every default is a value the row's own check accepts (written back through the check);
 *   - the resume names are the EQUAL rows (0 .. PLAN_N_RESUME_FIELDS-1) then the PARENT rows,
 *     each index once; a derived value names a PARENT row it follows and the flag that says so;
 *   - the live rows (t:set's reach) are not layout fields and take their compiled value back
 *     through the check t:set uses (finite included), leaving the plan's bytes as they were;
 *     so does every other row that holds a value in a compiled plan. */
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "plan/fields.h"
#include "plan_fixture.h"

static int n_names(const char *const *names)
{
  int n = 0;
  while (names && names[n])
    n++;
  return n;
}

/* Pushes field f of p as a Lua value (what a plan would have written). */
static void push_field(lua_State *L, const struct plan_field *f, const struct plan *p)
{
  const void *v = (const char *)p + f->offset;
  switch (f->type) {
  case PLAN_FIELD_NUMBER: lua_pushnumber(L, *(const double *)v); break;
  case PLAN_FIELD_INT: lua_pushinteger(L, *(const int *)v); break;
  case PLAN_FIELD_LONG: lua_pushinteger(L, *(const long long *)v); break;
  case PLAN_FIELD_BOOL: lua_pushboolean(L, *(const int *)v); break;
  case PLAN_FIELD_ENUM: lua_pushstring(L, f->names[*(const int *)v]); break;
  case PLAN_FIELD_NAME: case PLAN_FIELD_TEXT: lua_pushstring(L, v); break;
  }
}

static void test_rows_resolve_and_fit(void)
{
  for (int i = 0; i < plan_n_fields; i++) {
    const struct plan_field *f = &plan_fields[i];
    CHECK_MSG(plan_field_find(f->path) == f, "%s does not resolve to its own row", f->path);
    CHECK_MSG(f->offset + f->size <= sizeof(struct plan), "%s lies outside struct plan", f->path);
    size_t want = f->type == PLAN_FIELD_NUMBER ? sizeof(double)
                  : f->type == PLAN_FIELD_LONG ? sizeof(long long)
                  : f->type == PLAN_FIELD_NAME || f->type == PLAN_FIELD_TEXT ? f->size : sizeof(int);
    CHECK_MSG(f->size == want && f->size > 1, "%s: %zu bytes for its type", f->path, f->size);
    const int named = f->type == PLAN_FIELD_ENUM || f->type == PLAN_FIELD_NAME;
    CHECK_MSG(named == (n_names(f->names) > 0), "%s: names for an enumeration, and only there", f->path);
    CHECK_MSG(!(f->flags & PLAN_FIELD_FINITE) || f->type == PLAN_FIELD_NUMBER, "%s: finite, not a number", f->path);
    CHECK_MSG(f->type != PLAN_FIELD_NUMBER || (f->flags & PLAN_FIELD_FINITE), "%s: a number not checked finite",
              f->path);
  }
}

static void test_defaults_are_in_range(void)
{
  lua_State *L = luaL_newstate();
  struct plan d, q;
  plan_init(&d);
  plan_fields_default(&d, NULL);
  plan_fields_default(&d, "model.moe");
  for (int i = 0; i < plan_n_fields; i++) {
    const struct plan_field *f = &plan_fields[i];
    if (f->flags & (PLAN_FIELD_REQUIRED | PLAN_FIELD_DERIVED))
      continue; /* no default of its own */
    if (f->type == PLAN_FIELD_TEXT || (f->type == PLAN_FIELD_NAME && !f->def_text)) {
      CHECK_MSG(((const char *)&d + f->offset)[0] == 0, "%s: a text default", f->path);
      continue; /* empty: not given */
    }
    char msg[1536] = "";
    plan_init(&q);
    push_field(L, f, &d);
    CHECK_MSG(plan_field_from_lua(L, -1, f, &q, 1, msg, sizeof msg) == 0, "%s: its default is refused: %s",
              f->path, msg);
    lua_pop(L, 1);
    CHECK_MSG(memcmp((const char *)&q + f->offset, (const char *)&d + f->offset, f->size) == 0,
              "%s: the default does not read back as itself", f->path);
  }
  lua_close(L);
}

static void test_resume_names(void)
{
  int seen[PLAN_N_RESUME_NAMES] = { 0 };
  for (int i = 0; i < plan_n_fields; i++) {
    const struct plan_field *f = &plan_fields[i];
    if (f->resume == PLAN_RESUME_EQUAL) {
      CHECK_MSG(f->resume_index >= 0 && f->resume_index < PLAN_N_RESUME_FIELDS, "%s: index %d", f->path,
                f->resume_index);
    } else if (f->resume == PLAN_RESUME_PARENT) {
      CHECK_MSG(f->resume_index >= PLAN_N_RESUME_FIELDS && f->resume_index < PLAN_N_RESUME_NAMES, "%s: index %d",
                f->path, f->resume_index);
    } else {
      CHECK_MSG(f->resume_index == -1, "%s: a resume index, not compared", f->path);
      continue;
    }
    if (f->resume_index >= 0 && f->resume_index < PLAN_N_RESUME_NAMES)
      seen[f->resume_index]++;
    CHECK_MSG((f->follows != NULL) == (f->derived_at >= 0), "%s: follows a parent without its flag", f->path);
    if (f->follows) {
      const struct plan_field *parent = plan_field_find(f->follows);
      CHECK_MSG(parent && parent->resume == PLAN_RESUME_PARENT, "%s follows %s, not a parent", f->path, f->follows);
    }
  }
  for (int i = 0; i < PLAN_N_RESUME_NAMES; i++) {
    CHECK_MSG(seen[i] == 1, "resume index %d named %d times", i, seen[i]);
    CHECK(plan_resume_field_name(i) != NULL);
  }
  CHECK(plan_resume_field_name(PLAN_N_RESUME_NAMES) == NULL);
}

static void test_compiled_values_read_back(void)
{
  struct plan p;
  if (fixture_compile("tests/plans/good/dp_small.lua", 0, NULL, 0, &p))
    return;
  lua_State *L = luaL_newstate();
  int live = 0;
  for (int i = 0; i < plan_n_fields; i++) {
    const struct plan_field *f = &plan_fields[i];
    live += (f->flags & PLAN_FIELD_LIVE) != 0;
    CHECK_MSG(!(f->flags & PLAN_FIELD_LIVE) || f->resume != PLAN_RESUME_LAYOUT, "%s: live, but shapes the layout",
              f->path);
    if ((f->type == PLAN_FIELD_TEXT || f->type == PLAN_FIELD_NAME) && !((const char *)&p + f->offset)[0])
      continue; /* not given */
    if (strncmp(f->path, "model.moe.", 10) == 0 && p.model.moe.experts == 0)
      continue; /* a dense model: no model.moe section */
    struct plan q = p;
    memset((char *)&q + f->offset, 0, f->size);
    char msg[1536] = "";
    push_field(L, f, &p);
    CHECK_MSG(plan_field_from_lua(L, -1, f, &q, 1, msg, sizeof msg) == 0, "%s: refused: %s", f->path, msg);
    lua_pop(L, 1);
    CHECK_MSG(memcmp(&q, &p, sizeof q) == 0, "%s: its value does not read back as itself", f->path);
  }
  CHECK(live == 15);
  lua_close(L);
  plan_free(&p);
}

int main(void)
{
  static const struct test_case tests[] = {
    TEST(test_rows_resolve_and_fit),
    TEST(test_defaults_are_in_range),
    TEST(test_resume_names),
    TEST(test_compiled_values_read_back),
  };
  return test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
}
