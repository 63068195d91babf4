/* t:generate(prompt_ids [, opts]): tokens from the live trainer's weights, as `tycho generate`
 * chooses them (runtime/model/generate.h: the key/value cache, greedy or sampled). Between steps,
 * like every trainer call. t:generate(text [, opts]): the text through a tokenizer.json
 * (opts.tokenizer, else data.tokenizer, else init.from's; the codec the command layer gives, tycho_runtime.h), as
 * `tycho generate --prompt` encodes it; returns the continuation's text, then its ids; it stops
 * after the tokenizer's eos id (opts.eos, when given, wins: -1 for no stop).
 *
 * On a trainer of one rank it generates from the weights the rank holds. On a job of several
 * ranks it is collective over the trainer's world, whatever the layout (tensor and pipeline
 * parallel, ZeRO 1-3): the whole model's parameters are gathered to the job's rank 0 in the
 * serial model's order (trainer_gather_packed, the gather tycho rehearse compares with), a
 * one-rank model is built there from them, it generates, and the ids are broadcast, so every rank
 * returns the same list — the ids `tycho generate` gives from the same weights on one rank; with
 * experts over ranks (mesh.ep) too, every expert gathered. Refused by name on part of the job (a
 * chunk's selector). */
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "runtime/model/generate.h"
#include "runtime/train/packed.h"
#include "runtime/train/train.h"
#include "tycho_runtime.h"
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
  real *packed;     /* the gathered parameters (rank 0 of a job) */
  struct model one; /* the one-rank model built from them */
  int have_one;
  void *tok;        /* a text prompt's tokenizer (the codec's) */
};

static const struct tycho_text_codec *codec;

void tycho_runtime_set_text_codec(const struct tycho_text_codec *c)
{
  codec = c;
}

static int buffers_gc(lua_State *L)
{
  struct gen_buffers *b = lua_touserdata(L, 1);
  free(b->prompt);
  free(b->out);
  free(b->packed);
  if (b->have_one)
    model_free(&b->one);
  b->prompt = b->out = NULL;
  b->packed = NULL;
  b->have_one = 0;
  if (b->tok && codec)
    codec->close(b->tok);
  b->tok = NULL;
  return 0;
}

/* The job's generation: the parameters gathered to world rank 0, a one-rank model of them there
 * generating, the count and the ids broadcast over the world. The count, or −1 with the message,
 * the same on every rank. Collective over t's world. */
static long long generate_gathered(struct trainer *t, const struct gen_request *r, struct gen_buffers *b,
                                   long long budget, char *err, size_t err_size)
{
  struct comm_group *w = t->world;
  if (comm_restricted_check(w, "generation", err, err_size))
    return -1;
  size_t n_packed = 0;
  int rc = trainer_gather_packed(t, &b->packed, &n_packed, err, err_size);
  if (comm_agree_err(w, rc, err, err_size, COMM_AGREE_NAME_RANK))
    return -1;
  long long n = 0;
  if (w->rank == 0) {
    if (!b->packed) {
      rc = -1;
      snprintf(err, err_size, "the gather left rank 0 without the parameters");
    } else if (model_from_packed_sparse(&b->one, &t->model.config, t->model.moe, b->packed, n_packed, err,
                                        err_size)) {
      rc = -1;
    } else {
      b->have_one = 1;
      free(b->packed);
      b->packed = NULL;
      n = gen_run(&b->one, r, b->out, err, err_size);
      rc = n < 0 ? -1 : 0;
    }
  }
  if (comm_agree_err(w, rc, err, err_size, COMM_AGREE_PLAIN))
    return -1;
  long long count = n;
  if (comm_broadcast(w, &count, 1, COMM_INT64, 0, NULL) ||
      (count > 0 && count <= budget && comm_broadcast(w, b->out, (size_t)count, COMM_INT32, 0, NULL))) {
    snprintf(err, err_size, "broadcasting the ids: %s", comm_error());
    return -1;
  }
  return count;
}

/* A text prompt's ids into b->prompt (the tokenizer kept in b->tok for the decoding): the
 * tokenizer is opts.tokenizer (a tokenizer.json or the folder holding it), else the plan's
 * data.tokenizer, else its init.from folder's tokenizer.json. The count; a Lua error naming what is missing. */
static lua_Integer encode_prompt(lua_State *L, const struct trainer *t, int opts, struct gen_buffers *b)
{
  const char *path = NULL;
  if (opts) {
    lua_getfield(L, opts, "tokenizer");
    path = lua_isnil(L, -1) ? NULL : lua_tostring(L, -1);
    if (!path && !lua_isnil(L, -1))
      luaL_error(L, "t:generate: tokenizer must be a path (a tokenizer.json or the folder holding it)");
    lua_pop(L, 1); /* the string stays in opts */
  }
  char at[4200];
  const char *from = t->plan->init.from;
  if (!path && t->plan->data.tokenizer[0])
    path = t->plan->data.tokenizer; /* what the plan trains with */
  if (!path && from[0]) {
    snprintf(at, sizeof at, "%s/tokenizer.json", from);
    if (access(at, F_OK) == 0)
      path = at;
  }
  if (!codec)
    return luaL_error(L, "t:generate: text prompts need the tokenizers of the tycho command; give the ids");
  if (!path)
    return luaL_error(L, "t:generate: a text prompt needs a tokenizer, and %s; give opts.tokenizer (a "
                      "tokenizer.json or the folder holding it) or the ids",
                      from[0] ? "init.from's folder holds no tokenizer.json"
                              : "the plan has no data.tokenizer and no init.from folder");
  char err[ERR_MAX];
  if (!(b->tok = codec->load(path, err, sizeof err)))
    return luaL_error(L, "t:generate: %s", err);
  size_t len;
  const char *text = lua_tolstring(L, 2, &len);
  int n = 0;
  if (codec->encode(b->tok, text, len, &b->prompt, &n, err, sizeof err))
    return luaL_error(L, "t:generate: the prompt: %s", err);
  return n;
}

int tycho_trainer_generate(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  const struct model *m = &t->model;
  const int text = lua_type(L, 2) == LUA_TSTRING;
  if (!text)
    luaL_checktype(L, 2, LUA_TTABLE);
  const int opts = lua_isnoneornil(L, 3) ? 0 : 3;
  if (opts)
    luaL_checktype(L, 3, LUA_TTABLE);
  struct gen_request r = { 0 };
  r.max_tokens = (long long)opt_number(L, opts, "max_tokens", 64, 1, 1e6);
  r.s.temperature = opt_number(L, opts, "temperature", 0, 0, 1e6);
  r.s.top_k = (int)opt_number(L, opts, "top_k", 0, 0, 1 << 30);
  r.s.top_p = opt_number(L, opts, "top_p", 1, 0, 1);
  r.s.seed = (uint64_t)opt_number(L, opts, "seed", 0, 0, 9007199254740992.0);
  if (r.s.top_p <= 0)
    return luaL_error(L, "t:generate: top_p must be above 0 (1: off)");
  int eos = (int)opt_number(L, opts, "eos", -1, -1, m->config.vocab - 1), eos_given = 0;
  if (opts) {
    lua_getfield(L, opts, "eos");
    eos_given = !lua_isnil(L, -1);
    lua_pop(L, 1);
  }
  r.eos = &eos;
  r.n_eos = eos >= 0;
  struct gen_buffers *b = lua_newuserdatauv(L, sizeof *b, 0);
  memset(b, 0, sizeof *b);
  lua_newtable(L);
  lua_pushcfunction(L, buffers_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  const lua_Integer P = text ? encode_prompt(L, t, opts, b) : luaL_len(L, 2);
  /* a text prompt stops at its tokenizer's eos, as `tycho generate --prompt` does; opts.eos wins
   * (-1: no stop); an eos outside the vocabulary could never be chosen */
  const long long tok_eos = text && !eos_given && codec->eos ? codec->eos(b->tok) : -1;
  if (tok_eos >= 0 && tok_eos < m->config.vocab) {
    eos = (int)tok_eos;
    r.n_eos = 1;
  }
  if (P < 1 || P > m->config.max_seq)
    return luaL_error(L, "t:generate: the prompt has %d %s; 1 to model.max_seq (%d) are allowed", (int)P,
                      text ? "tokens" : "ids", m->config.max_seq);
  const long long budget = gen_budget(m, (int)P, r.max_tokens);
  if (!text)
    b->prompt = malloc((size_t)P * sizeof *b->prompt);
  b->out = malloc((size_t)budget * sizeof *b->out);
  if (!b->prompt || !b->out)
    return luaL_error(L, "t:generate: out of memory");
  for (lua_Integer i = 1; text && i <= P; i++)
    if (b->prompt[i - 1] < 0 || b->prompt[i - 1] >= m->config.vocab)
      return luaL_error(L, "t:generate: the prompt's token %d is id %d, not below the vocabulary (%d)", (int)i,
                        b->prompt[i - 1], m->config.vocab);
  for (lua_Integer i = 1; !text && i <= P; i++) {
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
  long long n = t->world && t->world->size > 1 ? generate_gathered(t, &r, b, budget, err, sizeof err)
                                               : gen_run(m, &r, b->out, err, sizeof err);
  if (n < 0)
    return luaL_error(L, "t:generate: %s", err);
  size_t len = 0;
  char *decoded = text ? codec->decode(b->tok, b->out, n, &len) : NULL;
  if (text && !decoded)
    return luaL_error(L, "t:generate: the tokenizer could not decode the %lld ids", n);
  if (text) {
    lua_pushlstring(L, decoded, len);
    free(decoded);
  }
  lua_createtable(L, (int)n, 0);
  for (long long i = 0; i < n; i++) {
    lua_pushinteger(L, b->out[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return text ? 2 : 1;
}
