/* The plan compiler's per-layer fields (see compile.c): stages, tp_split and recompute, each a
 * value for every layer or a function the compiler calls once per layer or (layer, module). */
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

int compile_read_stages(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  int L = p->model.n_layers, S = p->mesh.pp * p->virtual_stages;
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, root, "stages", path, sizeof path, where, sizeof where);
  p->stages_kind = PLAN_STAGES_EVEN;
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type == LUA_TSTRING) {
    static const char *const kinds[] = { "even", "balanced", NULL };
    int k;
    if (compile_match_enum(r, -1, kinds, path, where, "", &k))
      return -1;
    p->stages_kind = k ? PLAN_STAGES_BALANCED : PLAN_STAGES_EVEN;
  } else if (type == LUA_TFUNCTION) {
    p->stages_kind = PLAN_STAGES_FUNCTION;
    p->stages_is_function = 1;
    int f = lua_gettop(r->L);
    for (int l = 0; l < L; l++) {
      char what[96];
      snprintf(what, sizeof what, "the stages function, called for layer %d", l);
      lua_pushinteger(r->L, l);
      if (compile_call_plan_function(r, f, 1, what))
        return -1;
      long long s;
      if (!compile_is_integral(r->L, -1, &s) || s < 0 || s >= S) {
        compile_describe(r->L, -1, v, sizeof v);
        return compile_rfail(r, where, "stages: the function returned %s for layer %d; it must return a stage "
                             "index in 0..%d (pp %d × virtual_stages %d)", v, l, S - 1, p->mesh.pp, p->virtual_stages);
      }
      p->layers[l].stage = (int)s;
      lua_pop(r->L, 1);
    }
  } else if (type == LUA_TTABLE) {
    p->stages_kind = PLAN_STAGES_LIST;
    struct tbl t = { lua_gettop(r->L), "stages", "" };
    snprintf(t.where, sizeof t.where, "%s", where);
    int n = (int)lua_rawlen(r->L, t.idx);
    if (n != S)
      return compile_rfail(r, where, "stages: %d entries, but pp %d × virtual_stages %d = %d stages; give one "
                           "list of layers per stage", n, p->mesh.pp, p->virtual_stages, S);
    int next_layer = 0;
    for (int s = 0; s < S; s++) {
      char ewhere[PLAN_PATH_MAX + 32];
      if (!sandbox_where(r->L, t.idx, NULL, s + 1, ewhere, sizeof ewhere))
        snprintf(ewhere, sizeof ewhere, "%s", where);
      lua_rawgeti(r->L, t.idx, s + 1);
      if (!lua_istable(r->L, -1)) {
        compile_describe(r->L, -1, v, sizeof v);
        return compile_rfail(r, ewhere, "stages[%d] = %s: each stage is a list of layer indices (0-based) and "
                             "\"embed\" / \"head\"", s + 1, v);
      }
      int e = lua_gettop(r->L), m = (int)lua_rawlen(r->L, e), items = 0;
      for (int i = 1; i <= m; i++) {
        lua_rawgeti(r->L, e, i);
        long long layer;
        if (lua_type(r->L, -1) == LUA_TSTRING && strcmp(lua_tostring(r->L, -1), "embed") == 0) {
          if (s != 0 || next_layer != 0)
            return compile_rfail(r, ewhere, "stages[%d]: \"embed\" belongs at the start of the first stage", s + 1);
        } else if (lua_type(r->L, -1) == LUA_TSTRING && strcmp(lua_tostring(r->L, -1), "head") == 0) {
          if (s != S - 1 || i != m)
            return compile_rfail(r, ewhere, "stages[%d]: \"head\" belongs at the end of the last stage "
                                 "(stages[%d])", s + 1, S);
        } else if (compile_is_integral(r->L, -1, &layer)) {
          if (layer < 0 || layer >= L)
            return compile_rfail(r, ewhere, "stages[%d]: layer %lld does not exist; layers are 0..%d", s + 1, layer, L - 1);
          if (layer < next_layer)
            return compile_rfail(r, ewhere, "stages[%d]: layer %lld appears twice or out of order; every layer "
                                 "goes to exactly one stage, in order", s + 1, layer);
          if (layer > next_layer)
            return compile_rfail(r, ewhere, "stages[%d]: layer %d is missing (the list jumps to %lld); every "
                                 "layer goes to exactly one stage, in order", s + 1, next_layer, layer);
          p->layers[next_layer++].stage = s;
        } else {
          compile_describe(r->L, -1, v, sizeof v);
          return compile_rfail(r, ewhere, "stages[%d][%d] = %s: must be a layer index (0-based), \"embed\" or "
                               "\"head\"", s + 1, i, v);
        }
        items++;
        lua_pop(r->L, 1);
      }
      if (items == 0)
        return compile_rfail(r, ewhere, "stages[%d]: empty; every stage holds at least one layer (or embed/head)", s + 1);
      lua_pop(r->L, 1);
    }
    if (next_layer != L)
      return compile_rfail(r, where, "stages: layers %d..%d are in no stage; every layer goes to exactly one stage",
                           next_layer, L - 1);
  } else {
    compile_describe(r->L, -1, v, sizeof v);
    return compile_rfail(r, where, "stages = %s: must be \"even\", \"balanced\", a list of stages or a "
                         "function(layer) -> stage", v);
  }
  lua_pop(r->L, 1);
  return 0;
}

static const char *const split_names[] = { "replicate", "column", "row", "vocab", NULL };
static const char *const module_names[] = { "embed", "q", "k", "v", "o", "gate", "up", "down", "head", NULL };

static int default_split(int mod)
{
  switch (mod) {
  case PLAN_MOD_EMBED: case PLAN_MOD_HEAD: return PLAN_SPLIT_VOCAB;
  case PLAN_MOD_O: case PLAN_MOD_DOWN: return PLAN_SPLIT_ROW;
  default: return PLAN_SPLIT_COLUMN;
  }
}

/* Checks a split value (at stack top) for a module; nil gives the default. */
static int split_value(struct reader *r, int mod, const char *where, const char *context, uint8_t *out)
{
  char path[64];
  snprintf(path, sizeof path, "tp_split.%s", module_names[mod]);
  if (lua_isnil(r->L, -1)) {
    *out = (uint8_t)default_split(mod);
    return 0;
  }
  int s;
  if (compile_match_enum(r, -1, split_names, path, where, context, &s))
    return -1;
  int vocab_module = mod == PLAN_MOD_EMBED || mod == PLAN_MOD_HEAD;
  if (vocab_module && (s == PLAN_SPLIT_COLUMN || s == PLAN_SPLIT_ROW))
    return compile_rfail(r, where, "%s = \"%s\"%s: the %s splits as \"vocab\" (rows of the vocabulary) or "
                         "\"replicate\"", path, split_names[s], context, mod == PLAN_MOD_EMBED ? "embedding" : "LM head");
  if (!vocab_module && s == PLAN_SPLIT_VOCAB)
    return compile_rfail(r, where, "%s = \"vocab\"%s: only embed and head split by vocabulary; use \"column\", "
                         "\"row\" or \"replicate\"", path, context);
  *out = (uint8_t)s;
  return 0;
}

int compile_read_tp_split(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  int L = p->model.n_layers;
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, root, "tp_split", path, sizeof path, where, sizeof where);
  if (type == LUA_TTABLE) {
    struct tbl t = { lua_gettop(r->L), "tp_split", "" };
    snprintf(t.where, sizeof t.where, "%s", where);
    if (compile_check_fields(r, &t, module_names, "tp_split"))
      return -1;
    for (int mod = 0; mod < PLAN_N_MODULES; mod++) {
      char fpath[128], fwhere[PLAN_PATH_MAX + 32];
      compile_get(r, &t, module_names[mod], fpath, sizeof fpath, fwhere, sizeof fwhere);
      uint8_t s;
      if (split_value(r, mod, fwhere, "", &s))
        return -1;
      lua_pop(r->L, 1);
      if (mod == PLAN_MOD_EMBED)
        p->embed_split = s;
      else if (mod == PLAN_MOD_HEAD)
        p->head_split = s;
      else
        for (int l = 0; l < L; l++)
          p->layers[l].split[mod] = s;
    }
  } else if (type == LUA_TFUNCTION) {
    p->tp_split_is_function = 1;
    int f = lua_gettop(r->L);
    for (int l = -1; l <= L; l++) { /* -1: embed, L: head; both called with layer = nil */
      int first = l < 0 ? PLAN_MOD_EMBED : l == L ? PLAN_MOD_HEAD : PLAN_LAYER_MOD_FIRST;
      int last = l < 0 ? PLAN_MOD_EMBED : l == L ? PLAN_MOD_HEAD : PLAN_LAYER_MOD_LAST;
      for (int mod = first; mod <= last; mod++) {
        char what[128], ctx[128];
        if (l < 0 || l == L) {
          snprintf(what, sizeof what, "the tp_split function, called for (nil, \"%s\")", module_names[mod]);
          snprintf(ctx, sizeof ctx, " (returned by the tp_split function for module \"%s\")", module_names[mod]);
          lua_pushnil(r->L);
        } else {
          snprintf(what, sizeof what, "the tp_split function, called for (%d, \"%s\")", l, module_names[mod]);
          snprintf(ctx, sizeof ctx, " (returned by the tp_split function for layer %d)", l);
          lua_pushinteger(r->L, l);
        }
        lua_pushstring(r->L, module_names[mod]);
        if (compile_call_plan_function(r, f, 2, what))
          return -1;
        uint8_t s;
        if (split_value(r, mod, where, ctx, &s))
          return -1;
        lua_pop(r->L, 1);
        if (mod == PLAN_MOD_EMBED)
          p->embed_split = s;
        else if (mod == PLAN_MOD_HEAD)
          p->head_split = s;
        else
          p->layers[l].split[mod] = s;
      }
    }
  } else if (type == LUA_TNIL) {
    p->embed_split = PLAN_SPLIT_VOCAB;
    p->head_split = PLAN_SPLIT_VOCAB;
    for (int l = 0; l < L; l++)
      for (int mod = PLAN_LAYER_MOD_FIRST; mod <= PLAN_LAYER_MOD_LAST; mod++)
        p->layers[l].split[mod] = (uint8_t)default_split(mod);
  } else {
    compile_describe(r->L, -1, v, sizeof v);
    return compile_rfail(r, where, "tp_split = %s: must be a table of module = split (modules %s...) or a "
                         "function(layer, module) -> split", v, "embed, q, k, v, o, gate, up, down, head; ");
  }
  lua_pop(r->L, 1);
  return 0;
}

/* The recompute value at stack top → mask. */
static int recompute_value(struct reader *r, const char *where, const char *context, uint8_t *out)
{
  static const char *const parts[] = { "attn_norm", "attn_core", "attn", "mlp_norm", "mlp_act", "mlp", NULL };
  static const char *const words[] = { "none", "full", "attn_norm", "attn_core", "attn", "mlp_norm",
                                       "mlp_act", "mlp", NULL };
  char v[96];
  lua_State *L = r->L;
  if (lua_type(L, -1) == LUA_TSTRING) {
    int w;
    if (compile_match_enum(r, -1, words, "recompute", where, context, &w))
      return -1;
    *out = w == 0 ? 0 : w == 1 ? PLAN_RC_FULL : (uint8_t)(1 << (w - 2));
    return 0;
  }
  if (lua_type(L, -1) == LUA_TTABLE) {
    int n = (int)lua_rawlen(L, -1);
    uint8_t mask = 0;
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      int part;
      char path[32];
      snprintf(path, sizeof path, "recompute[%d]", i);
      if (compile_match_enum(r, -1, parts, path, where, context, &part))
        return -1;
      mask |= (uint8_t)(1 << part);
      lua_pop(L, 1);
    }
    *out = mask;
    return 0;
  }
  compile_describe(L, -1, v, sizeof v);
  return compile_rfail(r, where, "recompute = %s%s: must be \"none\", \"full\", a list of parts (attn_norm, "
                       "attn_core, attn, mlp_norm, mlp_act, mlp) or a function(layer) -> one of those", v, context);
}

int compile_read_recompute(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  int L = p->model.n_layers;
  char path[128], where[PLAN_PATH_MAX + 32];
  int type = compile_get(r, root, "recompute", path, sizeof path, where, sizeof where);
  if (type == LUA_TFUNCTION) {
    p->recompute_is_function = 1;
    int f = lua_gettop(r->L);
    for (int l = 0; l < L; l++) {
      char what[96], ctx[96];
      snprintf(what, sizeof what, "the recompute function, called for layer %d", l);
      snprintf(ctx, sizeof ctx, " (returned by the recompute function for layer %d)", l);
      lua_pushinteger(r->L, l);
      if (compile_call_plan_function(r, f, 1, what))
        return -1;
      uint8_t mask = 0;
      if (!lua_isnil(r->L, -1) && recompute_value(r, where, ctx, &mask))
        return -1;
      p->layers[l].recompute = mask;
      lua_pop(r->L, 1);
    }
  } else if (type != LUA_TNIL) {
    uint8_t mask;
    if (recompute_value(r, where, "", &mask))
      return -1;
    for (int l = 0; l < L; l++)
      p->layers[l].recompute = mask;
  }
  lua_pop(r->L, 1);
  return 0;
}
