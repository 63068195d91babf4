/* The trainer in Lua (bindings/tycho_runtime.h) on one rank, in a world of one (MPI as a
 * singleton, no mpirun): a Lua state with the standard libraries and the runtime module, driven
 * by snippets, held against a trainer opened in C on the same plan
 * (tests/plans/good/dp_small.lua, evaluation off unless said):
 *   - 3 steps of t:step give bitwise the C trainer's losses, with `tycho run`'s progress lines
 *     through print; t:eval gives the C evaluation's numbers;
 *   - t:set{optimizer = {lr, weight_decay}} trains as a C trainer whose plan copy and optimizer
 *     got those values; a field that is not live is refused naming it and t:replan, a value out
 *     of range naming its range, and a refused call changes nothing;
 *   - t:set refuses exactly what the compiler refuses (inf, a value out of a number's or an
 *     integer's range, a misspelt name), with the compiler's message after "t:set: ";
 *   - t:param("layers.0.q"): shape, layout, norm and elements equal the C trainer's; short and
 *     Hugging Face names; gradients and AdamW moments after a step; a ZeRO-3 shard's layout;
 *     :gather() equals the tensor;
 *   - t:memory(): the predicted bill equals the allocator's peaks in every category;
 *   - t:save, then a new trainer's t:load, resumes to the same losses;
 *   - close is idempotent (twice, then __gc; <close>), leaves no block or group, and use after
 *     close is an error; the stop hook interrupts t:step between steps;
 *   - t:replan{ zero = 3 } after 2 steps goes on from step 2 with the C trainer's losses. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm/comm.h"
#include "plan_fixture.h"
#include "runtime/model/alloc.h"
#include "runtime/train/train.h"
#include "tycho_runtime.h"

static char err[4096];
static char plan_path[1024];

/* A REPL-like state: standard libraries, tycho with the runtime, PLAN the plan's path, and print
 * collecting its lines in the global list `printed`. */
static lua_State *new_state(void)
{
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaopen_tycho_runtime(L);
  lua_setglobal(L, "tycho");
  lua_pushstring(L, plan_path);
  lua_setglobal(L, "PLAN");
  if (luaL_dostring(L, "printed = {}\n"
                       "print = function(...) printed[#printed + 1] = table.concat({...}, '\\t') end"))
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
  return L;
}

/* Runs code; its results stay on the stack (none on an error, which is a CHECK failure). */
static int run(lua_State *L, const char *code)
{
  lua_settop(L, 0);
  int rc = luaL_dostring(L, code);
  CHECK_MSG(rc == LUA_OK, "%s\n  in: %s", lua_tostring(L, -1), code);
  if (rc)
    lua_settop(L, 0);
  return rc;
}

static double number(lua_State *L, const char *expr)
{
  char code[1024];
  snprintf(code, sizeof code, "return %s", expr);
  if (run(L, code))
    return -1e300;
  CHECK_MSG(lua_type(L, -1) == LUA_TNUMBER, "%s is a %s", expr, luaL_typename(L, -1));
  return lua_tonumber(L, -1);
}

/* The error `code` raises (it must raise one). */
static const char *error_of(lua_State *L, const char *code)
{
  lua_settop(L, 0);
  int rc = luaL_dostring(L, code);
  CHECK_MSG(rc != LUA_OK, "no error from: %s", code);
  static char msg[4096];
  snprintf(msg, sizeof msg, "%s", rc ? lua_tostring(L, -1) : "");
  lua_settop(L, 0);
  return msg;
}

static int c_trainer(struct trainer *t, const char *const *sets, int n_sets)
{
  struct plan p;
  if (fixture_compile("tests/plans/good/dp_small.lua", 1, sets, n_sets, &p))
    return 1;
  int rc = trainer_open(t, &p, NULL, err, sizeof err);
  plan_free(&p);
  CHECK_MSG(rc == TRAIN_OK, "%s", err);
  return rc;
}

static double c_step(struct trainer *t)
{
  struct train_step_stats st;
  int rc = trainer_step(t, &st, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  return st.loss;
}

static void test_step_matches_the_c_trainer(void)
{
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN, { train = { eval_every = 0 } })\n"
             "losses = {}\n"
             "for i = 1, 2 do losses[i] = t:step() end\n"
             "losses[3] = t:step(1)")) {
    lua_close(L);
    return;
  }
  CHECK(number(L, "t.step") == 3);
  CHECK(number(L, "t.rank") == 0 && number(L, "t.world") == 1);
  CHECK(number(L, "t.tp") == 0 && number(L, "t.dp") == 0 && number(L, "t.pp") == 0);
  struct trainer c;
  const char *sets[] = { "train.eval_every=0" };
  if (c_trainer(&c, sets, 1) == 0) {
    for (int s = 0; s < 3; s++) {
      const double want = c_step(&c);
      char expr[64];
      snprintf(expr, sizeof expr, "losses[%d]", s + 1);
      CHECK_MSG(number(L, expr) == want, "step %d: %.17g in Lua, %.17g in C", s, number(L, expr), want);
    }
    CHECK(number(L, "t:loss()") == number(L, "losses[3]"));
    /* evaluation now, as the C trainer's */
    struct train_eval_stats ev;
    trainer_eval(&c, &ev);
    if (run(L, "return t:eval()") == 0) {
      CHECK(lua_gettop(L) == 2);
      CHECK(ev.has_val_loss && lua_tonumber(L, 1) == ev.val_loss);
      CHECK(ev.has_accuracy && lua_tonumber(L, 2) == ev.accuracy);
    }
    trainer_close(&c);
  }
  /* progress lines as `tycho run` prints them, the total being where the call ends: each call's
   * first and last step (log.every 5) */
  CHECK(number(L, "#printed") == 3);
  if (run(L, "return printed[1], printed[2], printed[3]") == 0) {
    CHECK_STR_CONTAINS(lua_tostring(L, 1), "step 1/1 | loss ");
    CHECK_STR_CONTAINS(lua_tostring(L, 2), "step 2/2 | loss ");
    CHECK_STR_CONTAINS(lua_tostring(L, 3), "step 3/3 | loss ");
    CHECK_STR_CONTAINS(lua_tostring(L, 3), "tok/s | ");
  }
  /* the plan's evaluation cadence: eval_every 2 evaluates after step 4 */
  run(L, "printed = {}; t:set{ train = { eval_every = 2 } }; t:step(2)");
  CHECK(number(L, "#printed") == 3);
  if (run(L, "return printed[1], printed[2], printed[3]") == 0) {
    CHECK_STR_CONTAINS(lua_tostring(L, 1), "step 4/5 | loss ");
    CHECK_STR_CONTAINS(lua_tostring(L, 2), "eval at step 4: val loss ");
    CHECK_STR_CONTAINS(lua_tostring(L, 3), "step 5/5 | loss ");
  }
  run(L, "t:close()");
  lua_close(L);
}

static void test_set_changes_what_the_steps_use(void)
{
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN, { train = { eval_every = 0 } })\n"
             "t:step(2)\n"
             "t:set{ optimizer = { lr = 1e-3, weight_decay = 0 }, log = { every = 1 } }\n"
             "a = t:step(); b = t:step()")) {
    lua_close(L);
    return;
  }
  struct trainer c;
  const char *sets[] = { "train.eval_every=0" };
  if (c_trainer(&c, sets, 1) == 0) {
    c_step(&c);
    c_step(&c);
    c.own_plan.optimizer.lr = 1e-3;
    c.opt.weight_decay = 0.0;
    const double a = c_step(&c), b = c_step(&c);
    CHECK_MSG(number(L, "a") == a && number(L, "b") == b, "after t:set: %.17g %.17g in Lua, %.17g %.17g in C",
              number(L, "a"), number(L, "b"), a, b);
    trainer_close(&c);
  }
  CHECK(number(L, "t:plan().optimizer.lr") == 1e-3);
  CHECK(number(L, "t:plan().optimizer.weight_decay") == 0);
  /* dotted keys too */
  run(L, "t:set{ ['optimizer.grad_clip'] = 0.5 }");
  CHECK(number(L, "t:plan().optimizer.grad_clip") == 0.5);
  /* refusals: the field and t:replan named; out of range; all or nothing */
  const char *e = error_of(L, "t:set{ model = { dim = 64 } }");
  CHECK_STR_CONTAINS(e, "model.dim = 64 cannot change between steps");
  CHECK_STR_CONTAINS(e, "t:replan{ model = { dim = 64 } }");
  CHECK_STR_CONTAINS(e, "optimizer.lr");
  e = error_of(L, "t:set{ zero = 3 }");
  CHECK_STR_CONTAINS(e, "zero = 3 cannot change between steps");
  CHECK_STR_CONTAINS(e, "t:replan{ zero = 3 }");
  CHECK_STR_CONTAINS(error_of(L, "t:set{ optimizer = { lr = -1 } }"), "optimizer.lr = -1: must be a number > 0");
  CHECK_STR_CONTAINS(error_of(L, "t:set{ optimizer = 3 }"), "optimizer = 3: a section is a table of fields");
  CHECK_STR_CONTAINS(error_of(L, "t:set{ train = { eval_every = 2.5 } }"), "train.eval_every = 2.5: must be an integer");
  CHECK_STR_CONTAINS(error_of(L, "t:set{ lr_schedule = { min_lr = 1 } }"), "larger than optimizer.lr");
  error_of(L, "t:set{ optimizer = { lr = 5e-4 }, mesh = { tp = 2 } }");
  CHECK(number(L, "t:plan().optimizer.lr") == 1e-3);
  CHECK(number(L, "#printed") == 4); /* t:step(2)'s two lines, then log.every 1: one a step */
  run(L, "t:close()");
  lua_close(L);
}

/* t:set refuses exactly what the compiler refuses, with the compiler's message: the same text
 * after the place (the compiler's --set, t:set's "t:set", which follows the Lua chunk's own
 * position). A refused call changes nothing. */
#define CHECK_SAME(got, want) do { const char *g_ = strstr((got), "t:set: ") ? strstr((got), "t:set: ") : (got), \
  *w_ = (want); \
  CHECK_MSG(strcmp(g_, w_) == 0, "\n  got  \"%s\"\n  want \"%s\"", g_, w_); } while (0)
static void test_set_refuses_what_the_compiler_refuses(void)
{
  static const struct { const char *set, *code, *msg; } cases[] = {
    { "optimizer.lr=inf", "t:set{ optimizer = { lr = 1/0 } }", "optimizer.lr = inf: must be a finite number" },
    { "optimizer.lr=-1", "t:set{ optimizer = { lr = -1 } }", "optimizer.lr = -1: must be a number > 0" },
    { "log.every=0", "t:set{ log = { every = 0 } }", "log.every = 0: must be an integer in 1..1073741824" },
    { "train.steps=2.5", "t:set{ train = { steps = 2.5 } }", "train.steps = 2.5: must be an integer ≥ 1" },
    { "lr_schedule.decay=cosin", "t:set{ lr_schedule = { decay = 'cosin' } }",
      "lr_schedule.decay = \"cosin\": must be one of \"constant\", \"cosine\", \"linear\" (did you mean \"cosine\"?)" },
  };
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN, { train = { eval_every = 0 } })")) {
    lua_close(L);
    return;
  }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char want[512], compiler[1024];
    const char *sets[] = { cases[i].set };
    struct plan_compile_options opt = { 1, 0, 0, 0, 1, sets };
    struct plan q;
    CHECK(plan_compile(plan_path, &opt, &q, compiler, sizeof compiler) != 0);
    snprintf(want, sizeof want, "--set %s: %s", cases[i].set, cases[i].msg);
    CHECK_SAME(compiler, want);
    snprintf(want, sizeof want, "t:set: %s", cases[i].msg);
    CHECK_SAME(error_of(L, cases[i].code), want);
  }
  CHECK_SAME(error_of(L, "t:set{ model = { dim = 64 } }"),
            "t:set: model.dim = 64 cannot change between steps (the fields t:set changes: checkpoint.dir, log.every, "
            "lr_schedule.decay, lr_schedule.decay_steps, lr_schedule.min_lr, lr_schedule.warmup, optimizer.beta1, "
            "optimizer.beta2, optimizer.eps, optimizer.grad_clip, optimizer.lr, optimizer.weight_decay, "
            "train.eval_batches, train.eval_every, train.steps); re-plan instead: t:replan{ model = { dim = 64 } }");
  CHECK(number(L, "t:plan().optimizer.lr") == 3e-3); /* the plan's: every call was refused */
  CHECK(number(L, "t:plan().log.every") == 5);
  run(L, "t:close()");
  lua_close(L);
}

static double c_norm(const struct trainer *t, const real *x, size_t n)
{
  (void)t; /* the CPU backend: host memory */
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
  return sqrt(s);
}

static void test_param_grad_moment_inspection(void)
{
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN, { train = { eval_every = 0 } })\n"
             "q = t:param('layers.0.q')")) {
    lua_close(L);
    return;
  }
  struct trainer c;
  const char *sets[] = { "train.eval_every=0" };
  if (c_trainer(&c, sets, 1)) {
    lua_close(L);
    return;
  }
  const struct model_param *p = model_find(&c.model, "model.layers.0.self_attn.q_proj.weight");
  CHECK(p != NULL);
  if (!p)
    return;
  if (run(L, "return q.name, q.kind, q.shape[1], q.shape[2], q.local_shape[1], q.local_shape[2], #q, q.count, "
             "q.layout.text, q.dtype, q.device, q.layout.tp, q.layout.zero") == 0) {
    CHECK(!strcmp(lua_tostring(L, 1), "model.layers.0.self_attn.q_proj.weight"));
    CHECK(!strcmp(lua_tostring(L, 2), "param"));
    CHECK(lua_tointeger(L, 3) == 32 && lua_tointeger(L, 4) == 32 && lua_tointeger(L, 5) == 32 && lua_tointeger(L, 6) == 32);
    CHECK(lua_tointeger(L, 7) == 1024 && lua_tointeger(L, 8) == 1024);
    CHECK(!strcmp(lua_tostring(L, 9), "the whole tensor"));
    CHECK(!strcmp(lua_tostring(L, 10), tensor_dtype_name(REAL_TENSOR_DTYPE)));
    CHECK(!strcmp(lua_tostring(L, 11), "host"));
    CHECK(lua_isnil(L, 12) && lua_isnil(L, 13));
  }
  CHECK(number(L, "q:norm()") == c_norm(&c, p->data, p->n_elems));
  CHECK(number(L, "q[1]") == p->data[0] && number(L, "q[1024]") == p->data[1023] && number(L, "q[33]") == p->data[32]);
  CHECK(number(L, "q:stats().count") == 1024);
  CHECK(number(L, "q:stats().max") >= number(L, "q:stats().min"));
  CHECK(number(L, "#q:table()") == 1024 && number(L, "q:table()[5]") == p->data[4]);
  CHECK_STR_CONTAINS(error_of(L, "return q[1025]"), "index 1025 out of range 1..1024");
  CHECK_STR_CONTAINS(error_of(L, "q[1] = 0"), "read-only");
  /* names */
  CHECK(number(L, "t:param('model.layers.0.self_attn.q_proj.weight'):norm()") == number(L, "q:norm()"));
  CHECK(number(L, "t:param('layers.0.self_attn.q_proj.weight')[7]") == number(L, "q[7]"));
  CHECK(number(L, "t:param('embed').shape[1]") == 64 && number(L, "t:param('layers.1.mlp_norm').shape[1]") == 32);
  CHECK(number(L, "#t:param('layers.1.mlp_norm').shape") == 1 && number(L, "t:param('norm')[1]") == 1);
  CHECK(number(L, "t:param('head').shape[2]") == 32 && number(L, "t:param('layers.1.down').shape[2]") == 64);
  CHECK_STR_CONTAINS(error_of(L, "t:param('layers.9.q')"), "no parameter \"layers.9.q\"");
  /* gather on one rank: the tensor itself, a host copy */
  CHECK(number(L, "q:gather():norm()") == number(L, "q:norm()"));
  CHECK(number(L, "q:gather()[1000]") == number(L, "q[1000]"));
  if (run(L, "return q:gather().kind, tostring(q:gather())") == 0) {
    CHECK(!strcmp(lua_tostring(L, 1), "host"));
    CHECK_STR_CONTAINS(lua_tostring(L, 2), "(32 × 32), a gathered host copy");
  }
  /* after a step: gradients and moments, as the C trainer's */
  run(L, "t:step()");
  c_step(&c);
  CHECK(number(L, "q:norm()") == c_norm(&c, p->data, p->n_elems)); /* a view: the new values */
  CHECK(number(L, "t:grad('layers.0.q'):norm()") == c_norm(&c, p->grad, p->n_elems));
  CHECK(number(L, "t:moment('layers.0.q', 1):norm()") == c_norm(&c, c.opt.m + p->offset, p->n_elems));
  CHECK(number(L, "t:moment('layers.0.q', 2)[3]") == c.opt.v[p->offset + 2]);
  CHECK(number(L, "t:grad('layers.0.q'):norm()") > 0);
  run(L, "t:close()");
  trainer_close(&c);

  /* ZeRO 3 on one rank: the shard is the whole block, described as one */
  if (run(L, "z = tycho.open(PLAN, { zero = 3, train = { eval_every = 0 } })\n"
             "zq = z:param('layers.0.q')\n"
             "return zq.layout.zero.stage, zq.layout.zero.first, zq.layout.zero.count, zq.layout.zero.of, zq.layout.text") == 0) {
    CHECK(lua_tointeger(L, 1) == 3 && lua_tointeger(L, 2) == 1 && lua_tointeger(L, 3) == 1024 && lua_tointeger(L, 4) == 1024);
    CHECK_STR_CONTAINS(lua_tostring(L, 5), "elements 1-1024 of its 1024 (row-major): the ZeRO-3 shard of dp rank 0 of 1");
  }
  CHECK_STR_CONTAINS(error_of(L, "return q:norm()"), "attempt to use a closed trainer");
  struct trainer c0;
  if (c_trainer(&c0, sets, 1) == 0) {
    const struct model_param *p0 = model_find(&c0.model, "model.layers.0.self_attn.q_proj.weight");
    CHECK(number(L, "zq:norm()") == c_norm(&c0, p0->data, p0->n_elems));
    CHECK(number(L, "zq[100]") == p0->data[99]);
    run(L, "z:step()");
    c_step(&c0);
    /* after a step the two differ by rounding: ZeRO 0 runs gate and up as one product, ZeRO 3
     * as two (model_gate_up_fused), so their sums are ordered differently (measured < 1e-9) */
    CHECK_NEAR(number(L, "zq:norm()"), c_norm(&c0, p0->data, p0->n_elems), REAL_IS_DOUBLE ? 1e-12 : 1e-6);
    trainer_close(&c0);
  }
  run(L, "z:close()");
  lua_close(L);
}

static void test_memory_bill_is_exact(void)
{
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN)\n t:step(2)\n m = t:memory()")) {
    lua_close(L);
    return;
  }
  static const char *const categories[] = { "params", "grads", "optimizer", "activations", "comm", "workspace", "total" };
  for (int c = 0; c < 7; c++) {
    char a[64], b[64];
    snprintf(a, sizeof a, "m.predicted.%s", categories[c]);
    snprintf(b, sizeof b, "m.measured.%s", categories[c]);
    CHECK_MSG(number(L, a) == number(L, b), "%s: predicted %.0f, measured %.0f", categories[c], number(L, a), number(L, b));
  }
  CHECK(number(L, "m.predicted.params") > 0 && number(L, "m.in_use.total") > 0);
  if (run(L, "return m.device") == 0)
    CHECK(!strcmp(lua_tostring(L, 1), "host"));
  /* the plan, the schedule, the comm layer's records */
  CHECK(number(L, "t:plan().model.dim") == 32 && number(L, "t:plan().batch.global") == 16);
  if (run(L, "return t:schedule()") == 0)
    CHECK_STR_CONTAINS(lua_tostring(L, 1), "F0");
  CHECK(number(L, "#t:comm(3).records") <= 3);
  CHECK(number(L, "t:comm().counters.tp.size") == 1 && number(L, "t:comm().counters.world.size") == 1);
  run(L, "t:close()");
  lua_close(L);
}

static void test_save_then_load_resumes(void)
{
  char dir[] = "/tmp/tycho-lua-trainer-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  lua_State *L = new_state();
  lua_pushstring(L, dir);
  lua_setglobal(L, "DIR");
  if (run(L, "local t <close> = tycho.open(PLAN, { train = { eval_every = 0 } })\n"
             "t:step(3)\n"
             "saved = t:save(DIR)\n"
             "after = { t:step(), t:step(), t:step() }") == 0) {
    char want[512];
    snprintf(want, sizeof want, "%s/step_00000003", dir);
    if (run(L, "return saved") == 0)
      CHECK(!strcmp(lua_tostring(L, 1), want));
    /* a new trainer, from the folder of checkpoints and from the checkpoint itself */
    CHECK(number(L, "(function() local u <close> = tycho.open(PLAN, { train = { eval_every = 0 } })\n"
                    "  local step = u:load(DIR)\n"
                    "  again = { u:step(), u:step(), u:step() }\n"
                    "  return step end)()") == 3);
    CHECK(number(L, "(function() local u <close> = tycho.open(PLAN, { train = { eval_every = 0 } })\n"
                    "  u:load(saved)\n"
                    "  return u.step end)()") == 3);
    for (int i = 1; i <= 3; i++) {
      char a[32], b[32];
      snprintf(a, sizeof a, "after[%d]", i);
      snprintf(b, sizeof b, "again[%d]", i);
      CHECK_MSG(number(L, a) == number(L, b), "step %d after the load: %.17g, %.17g straight on", 3 + i,
                number(L, b), number(L, a));
    }
    CHECK_STR_CONTAINS(error_of(L, "local u <close> = tycho.open(PLAN); u:load(DIR .. '/nothing')"), "no checkpoint in");
  }
  lua_close(L);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

static void test_close_is_idempotent_and_use_after_close_fails(void)
{
  const size_t live = alloc_bill()->n_live;
  const int groups = comm_groups_held();
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN); x = t:param('embed'); t:step()") == 0) {
    CHECK(comm_groups_held() == groups + PLAN_N_AXES);
    run(L, "t:close(); t:close()");
    CHECK(alloc_bill()->n_live == live && comm_groups_held() == groups);
    CHECK_STR_CONTAINS(error_of(L, "t:step()"), "attempt to use a closed trainer");
    CHECK_STR_CONTAINS(error_of(L, "return t.step"), "attempt to use a closed trainer");
    CHECK_STR_CONTAINS(error_of(L, "t:save('/tmp/never')"), "attempt to use a closed trainer");
    CHECK_STR_CONTAINS(error_of(L, "return x[1]"), "attempt to use a closed trainer");
    if (run(L, "return tostring(t), t.closed, tostring(x)") == 0) {
      CHECK(!strcmp(lua_tostring(L, 1), "trainer (closed)") && lua_toboolean(L, 2));
      CHECK_STR_CONTAINS(lua_tostring(L, 3), "(trainer closed)");
    }
    run(L, "t = nil; x = nil; collectgarbage(); collectgarbage()"); /* __gc after close: nothing */
  }
  /* <close>, then __gc of a trainer never closed */
  run(L, "do local u <close> = tycho.open(PLAN) end");
  CHECK(alloc_bill()->n_live == live && comm_groups_held() == groups);
  run(L, "v = tycho.open(PLAN); v = nil; collectgarbage(); collectgarbage()");
  CHECK(alloc_bill()->n_live == live && comm_groups_held() == groups);
  /* errors of open: the compiler's message; a bad override */
  CHECK_STR_CONTAINS(error_of(L, "tycho.open(PLAN, { batch = { micro = 5 } })"), "batch");
  CHECK_STR_CONTAINS(error_of(L, "tycho.open(PLAN, { train = { steps = print } })"), "override train.steps: a function");
  CHECK_STR_CONTAINS(error_of(L, "tycho.open('/nonexistent/plan.lua')"), "/nonexistent/plan.lua");
  /* a list of --set strings, numbers callable only with a trainer */
  CHECK(number(L, "(function() local u <close> = tycho.open(PLAN, { 'zero=1', 'train.eval_every=0' })\n"
                  "  return u.mesh.zero end)()") == 1);
  CHECK_STR_CONTAINS(error_of(L, "local n = 3; n()"), "attempt to call a number value");
  lua_close(L);
  CHECK(alloc_bill()->n_live == live && comm_groups_held() == groups);
}

/* t:replan on one rank: zero 0 → zero 3 in memory after 2 steps, then the C trainer's losses
 * within the bound mpi_reopen.c holds a reopened run to (1e-5 relative in fp32, 1e-10 in
 * float64: ZeRO-3's update runs over the shard's ranges, which may round apart). */
static void test_replan_goes_on_from_the_same_step(void)
{
  const double tol = TOL(1e-5, 1e-10);
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN, { train = { eval_every = 0 } }); t:step(2)\n"
             "t:replan{ zero = 3 }\n"
             "a = t:step(); b = t:step()") == 0) {
    CHECK(number(L, "t.step") == 4 && number(L, "t.mesh.zero") == 3);
    CHECK(number(L, "t:param('layers.0.q').layout.zero.count") == 1024);
    struct trainer c;
    const char *sets[] = { "train.eval_every=0" };
    if (c_trainer(&c, sets, 1) == 0) {
      c_step(&c);
      c_step(&c);
      const double a = c_step(&c), b = c_step(&c);
      CHECK_NEAR(number(L, "a"), a, tol * a);
      CHECK_NEAR(number(L, "b"), b, tol * b);
      trainer_close(&c);
    }
    CHECK_STR_CONTAINS(error_of(L, "t:replan{ model = { dim = 48 } }"), "model");
    CHECK(number(L, "t.step") == 4); /* refused: the trainer as it was */
    run(L, "t:close()");
  }
  lua_close(L);
}

/* t:replan starts from the live plan: a t:set before it survives it, and the replan's own
 * overrides (later) win over it. */
static void test_replan_keeps_the_live_settings(void)
{
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN, { train = { eval_every = 0 } })\n"
             "t:set{ optimizer = { lr = 5e-4 }, log = { every = 7 }, lr_schedule = { decay = 'linear' } }\n"
             "t:replan{ zero = 3 }") == 0) {
    CHECK(number(L, "t.mesh.zero") == 3);
    CHECK(number(L, "t:plan().optimizer.lr") == 5e-4);
    CHECK(number(L, "t:plan().log.every") == 7);
    if (run(L, "return t:plan().lr_schedule.decay") == 0)
      CHECK_STR_CONTAINS(lua_tostring(L, -1), "linear");
    lua_settop(L, 0);
    run(L, "t:set{ optimizer = { lr = 6e-4 } }; t:replan{ zero = 0, optimizer = { lr = 4e-4 } }");
    CHECK(number(L, "t:plan().optimizer.lr") == 4e-4 && number(L, "t.mesh.zero") == 0);
    CHECK(number(L, "t:plan().log.every") == 7);
    run(L, "t:close()");
  }
  lua_close(L);
}

static int stop_calls, stop_after;
static int stop_when(void *ctx)
{
  (void)ctx;
  return ++stop_calls > stop_after;
}

static void test_stop_hook_interrupts_between_steps(void)
{
  lua_State *L = new_state();
  stop_calls = 0;
  stop_after = 2;
  tycho_runtime_set_stop_hook(stop_when, NULL);
  if (run(L, "t = tycho.open(PLAN, { train = { eval_every = 0 } }); loss = t:step(5)") == 0) {
    CHECK(number(L, "t.step") == 2 && stop_calls == 3);
    CHECK(number(L, "loss") == number(L, "t:loss()"));
    if (run(L, "return printed[#printed]") == 0)
      CHECK(!strcmp(lua_tostring(L, 1), "interrupted at step 2"));
    tycho_runtime_set_stop_hook(NULL, NULL);
    run(L, "t:step(1)");
    CHECK(number(L, "t.step") == 3); /* usable after */
    run(L, "t:close()");
  }
  tycho_runtime_set_stop_hook(NULL, NULL);
  lua_close(L);
}

int main(void)
{
  const char *src = getenv("TYCHO_SOURCE_DIR");
  snprintf(plan_path, sizeof plan_path, "%s/tests/plans/good/dp_small.lua", src ? src : ".");
  if (comm_init(NULL, NULL, err, sizeof err)) {
    printf("comm_init failed: %s\n", err);
    return 1;
  }
  static const struct test_case tests[] = {
    TEST(test_step_matches_the_c_trainer),
    TEST(test_set_changes_what_the_steps_use),
    TEST(test_set_refuses_what_the_compiler_refuses),
    TEST(test_param_grad_moment_inspection),
    TEST(test_memory_bill_is_exact),
    TEST(test_save_then_load_resumes),
    TEST(test_close_is_idempotent_and_use_after_close_fails),
    TEST(test_stop_hook_interrupts_between_steps),
    TEST(test_replan_goes_on_from_the_same_step),
    TEST(test_replan_keeps_the_live_settings),
  };
  int rc = test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  comm_finalize(err, sizeof err);
  return rc;
}
