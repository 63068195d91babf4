/* t:generate(prompt_ids [, opts]): tokens from the live trainer's weights, as `tycho generate`
 * chooses them (runtime/model/generate.h: the key/value cache, greedy or sampled). Local: each rank
 * that runs it generates on its own from the weights it holds, so it needs a rank holding the
 * whole model (one tensor-parallel rank, one pipeline stage, ZeRO below 3, on the CPU), and never
 * waits for another rank. Between steps, like every trainer call. */
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/model/generate.h"
#include "runtime/train/train.h"
#include "tycho_runtime_internal.h"

/* opts[key] as a number in [lo, hi], or def when absent. */
static double opt_number(lua_State *L, int opts, const char *key, double def, double lo, double hi)
{
  if (opts == 0)
    return def;
  lua_getfield(L, opts, key);
  double v = def;
  if (!lua_isnil(L, -1)) {
    int ok;
    v = lua_tonumberx(L, -1, &ok);
    if (!ok || !(v >= lo && v <= hi))
      luaL_error(L, "t:generate: %s must be a number in [%g, %g]", key, lo, hi);
  }
  lua_pop(L, 1);
  return v;
}

/* Frees the buffers of one call when the call ends, even by an error. */
struct gen_buffers {
  int *prompt, *out;
};

static int buffers_gc(lua_State *L)
{
  struct gen_buffers *b = lua_touserdata(L, 1);
  free(b->prompt);
  free(b->out);
  b->prompt = b->out = NULL;
  return 0;
}

int tycho_trainer_generate(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  const struct model *m = &t->model;
  luaL_checktype(L, 2, LUA_TTABLE);
  const int opts = lua_isnoneornil(L, 3) ? 0 : 3;
  if (opts)
    luaL_checktype(L, 3, LUA_TTABLE);
  const lua_Integer P = luaL_len(L, 2);
  if (P < 1 || P > m->config.max_seq)
    return luaL_error(L, "t:generate: the prompt has %d ids; 1 to model.max_seq (%d) are allowed", (int)P,
                      m->config.max_seq);
  struct gen_request r = { 0 };
  r.max_tokens = (long long)opt_number(L, opts, "max_tokens", 64, 1, 1e6);
  r.s.temperature = opt_number(L, opts, "temperature", 0, 0, 1e6);
  r.s.top_k = (int)opt_number(L, opts, "top_k", 0, 0, 1 << 30);
  r.s.top_p = opt_number(L, opts, "top_p", 1, 0, 1);
  r.s.seed = (uint64_t)opt_number(L, opts, "seed", 0, 0, 9007199254740992.0);
  if (r.s.top_p <= 0)
    return luaL_error(L, "t:generate: top_p must be above 0 (1: off)");
  int eos = (int)opt_number(L, opts, "eos", -1, -1, m->config.vocab - 1);
  r.eos = &eos;
  r.n_eos = eos >= 0;
  struct gen_buffers *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->prompt = b->out = NULL;
  lua_newtable(L);
  lua_pushcfunction(L, buffers_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  const long long budget = gen_budget(m, (int)P, r.max_tokens);
  b->prompt = malloc((size_t)P * sizeof *b->prompt);
  b->out = malloc((size_t)budget * sizeof *b->out);
  if (!b->prompt || !b->out)
    return luaL_error(L, "t:generate: out of memory");
  for (lua_Integer i = 1; i <= P; i++) {
    int ok;
    lua_Integer id = (lua_geti(L, 2, i), lua_tointegerx(L, -1, &ok));
    lua_pop(L, 1);
    if (!ok || id < 0 || id >= m->config.vocab)
      return luaL_error(L, "t:generate: prompt_ids[%d] is not a token id below the vocabulary (%d)", (int)i,
                        m->config.vocab);
    b->prompt[i - 1] = (int)id;
  }
  r.prompt = b->prompt;
  r.P = (int)P;
  char err[ERR_MAX];
  long long n = gen_run(m, &r, b->out, err, sizeof err);
  if (n < 0)
    return luaL_error(L, "t:generate: %s", err);
  lua_createtable(L, (int)n, 0);
  for (long long i = 0; i < n; i++) {
    lua_pushinteger(L, b->out[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}
