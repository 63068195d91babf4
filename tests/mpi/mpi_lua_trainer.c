/* The trainer in Lua (bindings/tycho_runtime.h) on 2 ranks: every rank runs the same snippets in
 * a Lua state of its own, as the REPL's ranks do, against the serial run of the same plan
 * (tests/plans/good/dp_small.lua, opened in C on each rank alone):
 *   - tp 2: t:param of a split weight shows the split (rows of q, columns of o, the tp rank's
 *     block), a norm gain replicated over tp; :gather() of the initial weights is the serial
 *     tensor bit for bit, and after 3 steps (losses within the bound of mpi_dp_equiv.c: 1e-5
 *     relative in fp32, 1e-10 in float64) within that bound too; t:comm shows the tp group's
 *     all-reduces in the records and the counters; t:memory's bill is exact (on a trainer
 *     alone in the process: the allocator's bill is the process's);
 *   - dp 2, zero 3: each rank's shard of q is its range of the flat layout, the two ranges
 *     cover the tensor once; the gathered parameters, gradients and moments after 2 steps are
 *     the serial ones within the bound;
 *   - pp 2: a weight of the second stage is not on the first pipeline rank (nothing to index),
 *     and :gather() brings it to both, the serial tensor bit for bit;
 *   - ep 2 (tests/plans/good/ep_small.lua, zero 1): an expert is held by one ep rank only, its
 *     layout says which; :gather() brings it to both, and after 2 steps it, its gradient and its
 *     exp_avg are the serial ones within the bound; the router stays replicated over dp; a
 *     replan to ep 1 under ZeRO-3 goes on with the serial run's losses;
 *   - t:set with a value that differs between the ranks is refused on both (the plan hashes
 *     differ) and changes nothing; the same value on both is taken;
 *   - t:replan from tp 2 to dp 2 zero 3 after 2 steps goes on with the serial run's losses; a
 *     replan to another model is refused and leaves the trainer usable. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mpi_check.h"
#include "plan_fixture.h"
#include "runtime/train/train.h"
#include "tycho_runtime.h"

#if REAL_IS_DOUBLE
static const double tol = 1e-10;
#else
static const double tol = 1e-5;
#endif

static int rank;
static char err[4096], plan_path[1024], ep_plan_path[1024];

static lua_State *new_state(void)
{
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaopen_tycho_runtime(L);
  lua_setglobal(L, "tycho");
  lua_pushstring(L, plan_path);
  lua_setglobal(L, "PLAN");
  lua_pushstring(L, ep_plan_path);
  lua_setglobal(L, "EP_PLAN");
  luaL_dostring(L, "printed = {}\n"
                   "print = function(...) printed[#printed + 1] = table.concat({...}, '\\t') end");
  return L;
}

static int run(lua_State *L, const char *code)
{
  lua_settop(L, 0);
  int rc = luaL_dostring(L, code);
  CHECK_MSG(rc == LUA_OK, "rank %d: %s\n  in: %s", rank, lua_tostring(L, -1), code);
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

static const char *string(lua_State *L, const char *expr)
{
  static char out[2048];
  char code[1024];
  snprintf(code, sizeof code, "return tostring(%s)", expr);
  out[0] = 0;
  if (run(L, code) == 0)
    snprintf(out, sizeof out, "%s", lua_tostring(L, -1));
  return out;
}

/* The serial trainer of the plan with `sets`, on this rank alone. */
static int serial_of(const char *plan, struct trainer *t, const char *const *sets, int n_sets)
{
  struct plan p;
  if (fixture_compile(plan, 1, sets, n_sets, &p))
    return 1;
  int rc = trainer_open(t, &p, NULL, err, sizeof err);
  plan_free(&p);
  CHECK_MSG(rc == TRAIN_OK, "%s", err);
  return rc;
}

static int serial(struct trainer *t, const char *const *sets, int n_sets)
{
  return serial_of("tests/plans/good/dp_small.lua", t, sets, n_sets);
}

static double serial_step(struct trainer *t)
{
  struct train_step_stats st;
  CHECK_MSG(trainer_step(t, &st, err, sizeof err) == 0, "%s", err);
  return st.loss;
}

/* ‖lua − want‖ / ‖want‖ for the list `expr` evaluates to (n elements), or -1 when it is not one;
 * *exact: every element equal. */
static double compare_list(lua_State *L, const char *expr, const real *want, size_t n, int *exact)
{
  char code[1024];
  snprintf(code, sizeof code, "return %s", expr);
  if (run(L, code))
    return -1;
  CHECK_MSG(lua_istable(L, -1) && lua_rawlen(L, -1) == n, "%s: %zu elements wanted", expr, n);
  if (!lua_istable(L, -1) || lua_rawlen(L, -1) != n)
    return -1;
  double num = 0, den = 0;
  *exact = 1;
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, -1, (lua_Integer)i + 1);
    const double got = lua_tonumber(L, -1), w = want[i];
    lua_pop(L, 1);
    *exact &= got == w;
    num += (got - w) * (got - w);
    den += w * w;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static const struct model_param *find(const struct trainer *t, const char *name)
{
  const struct model_param *p = model_find(&t->model, name);
  CHECK_MSG(p != NULL, "%s", name);
  return p;
}

static void test_tp2_split_gather_and_comm(void)
{
  lua_State *L = new_state();
  struct trainer s;
  const char *sets[] = { "train.eval_every=0" };
  if (run(L, "t = tycho.open(PLAN, { mesh = { tp = 2 }, train = { eval_every = 0 } })\n"
             "q = t:param('layers.0.q'); o = t:param('layers.0.o'); g = t:param('layers.0.attn_norm')") ||
      serial(&s, sets, 1)) {
    lua_close(L);
    return;
  }
  const int tp = (int)number(L, "t.tp");
  CHECK(number(L, "t.world") == 2 && number(L, "t.rank") == rank && number(L, "t.mesh.tp") == 2);
  /* q: rows split; o: columns split; the norm gain whole on both */
  CHECK(number(L, "q.layout.tp.dim") == 1 && number(L, "q.layout.tp.start") == 16 * tp + 1);
  CHECK(number(L, "q.layout.tp.length") == 16 && number(L, "q.layout.tp.of") == 32 && number(L, "q.layout.tp.size") == 2);
  CHECK(number(L, "q.local_shape[1]") == 16 && number(L, "q.local_shape[2]") == 32 && number(L, "#q") == 512);
  CHECK(number(L, "q.shape[1]") == 32 && number(L, "q.shape[2]") == 32);
  CHECK(number(L, "o.layout.tp.dim") == 2 && number(L, "o.layout.tp.start") == 16 * tp + 1 && number(L, "o.local_shape[2]") == 16);
  char want[128];
  snprintf(want, sizeof want, "rows %d-%d of 32 (tp rank %d of 2)", 16 * tp + 1, 16 * tp + 16, tp);
  CHECK_STR_CONTAINS(string(L, "q.layout.text"), want);
  CHECK_STR_CONTAINS(string(L, "g.layout.text"), "the whole tensor; replicated over tp (2 ranks)");
  CHECK(number(L, "#g") == 32 && !strcmp(string(L, "g.layout.replicated[1]"), "tp"));
  /* the block is the serial tensor's rows: element 1 of rank 1 is row 17's first */
  const struct model_param *sq = find(&s, "model.layers.0.self_attn.q_proj.weight");
  const struct model_param *so = find(&s, "model.layers.0.self_attn.o_proj.weight");
  if (!sq || !so)
    return;
  CHECK(number(L, "q[1]") == sq->data[16 * 32 * tp] && number(L, "q[33]") == sq->data[16 * 32 * tp + 32]);
  CHECK(number(L, "o[17]") == so->data[32 + 16 * tp]); /* row 2, first column of the block */
  int exact = 0;
  compare_list(L, "q:gather():table()", sq->data, 1024, &exact);
  CHECK_MSG(exact, "rank %d: the gathered initial q is not the serial one bit for bit", rank);
  compare_list(L, "o:gather():table()", so->data, 1024, &exact);
  CHECK_MSG(exact, "rank %d: the gathered initial o is not the serial one bit for bit", rank);
  /* 3 steps: losses and the gathered weights within the bound */
  run(L, "losses = { t:step(), t:step(), t:step() }");
  for (int i = 0; i < 3; i++) {
    const double w = serial_step(&s);
    char expr[32];
    snprintf(expr, sizeof expr, "losses[%d]", i + 1);
    CHECK_MSG(fabs(number(L, expr) - w) <= tol * w, "step %d: %.17g at tp 2, %.17g serial", i, number(L, expr), w);
  }
  double e = compare_list(L, "q:gather():table()", sq->data, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "q after 3 steps: relative L2 %.3g", e);
  e = compare_list(L, "t:grad('layers.0.o'):gather():table()", so->grad, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "o's gradient after 3 steps: relative L2 %.3g", e);
  /* the tp group's traffic: the last records and the counters */
  CHECK(number(L, "(function() local n = 0\n"
                  "  for _, r in ipairs(t:comm(64).records) do\n"
                  "    if r.group == 'tp' and r.op == 'all-reduce' and r.step == 2 and r.bytes > 0 then n = n + 1 end\n"
                  "  end return n end)()") > 0);
  CHECK(number(L, "t:comm().counters.tp.all_reduce.calls") > 0 && number(L, "t:comm().counters.tp.all_reduce.bytes") > 0);
  CHECK(number(L, "t:comm().counters.tp.size") == 2 && number(L, "t:comm().counters.dp.size") == 1);
  run(L, "t:close()");
  trainer_close(&s);
  lua_close(L);
}

/* Alone in the process (the allocator's bill is the process's): predicted = measured. */
static void test_tp2_memory_bill_is_exact(void)
{
  lua_State *L = new_state();
  if (run(L, "t = tycho.open(PLAN, { mesh = { tp = 2 } }); t:step(2); m = t:memory()") == 0) {
    static const char *const categories[] = { "params", "grads", "optimizer", "activations", "comm", "workspace", "total" };
    for (int c = 0; c < 7; c++) {
      char a[64], b[64];
      snprintf(a, sizeof a, "m.predicted.%s", categories[c]);
      snprintf(b, sizeof b, "m.measured.%s", categories[c]);
      CHECK_MSG(number(L, a) == number(L, b), "rank %d, %s: predicted %.0f, measured %.0f", rank, categories[c],
                number(L, a), number(L, b));
    }
    run(L, "t:close()");
  }
  lua_close(L);
}

static void test_ep2_experts(void)
{
  lua_State *L = new_state();
  struct trainer s;
  const char *sets[] = { "train.eval_every=0", "model.dropout=0", "zero=1" };
  if (run(L, "t = tycho.open(EP_PLAN, { mesh = { ep = 2 }, zero = 1, model = { dropout = 0 },\n"
             "                         train = { eval_every = 0 } })\n"
             "x = t:param('model.layers.1.block_sparse_moe.experts.3.w1.weight')\n"
             "r = t:param('model.layers.1.block_sparse_moe.gate.weight'); t:step(2)") ||
      serial_of("tests/plans/good/ep_small.lua", &s, sets, 3)) {
    lua_close(L);
    return;
  }
  serial_step(&s);
  serial_step(&s);
  /* experts 2 and 3 of 4 are ep rank 1's */
  CHECK(number(L, "x.layout.here and 1 or 0") == (rank == 1) && number(L, "#x") == (rank == 1 ? 1024 : 0));
  if (rank == 0)
    CHECK_STR_CONTAINS(string(L, "x.layout.text"), "another expert-parallel rank's expert (ep rank 1 of 2 holds it)");
  else
    CHECK_STR_CONTAINS(string(L, "x.layout.text"), "the whole tensor");
  CHECK_STR_CONTAINS(string(L, "r.layout.text"), "the whole tensor; replicated over dp (2 ranks)");
  const struct model_param *sx = find(&s, "model.layers.1.block_sparse_moe.experts.3.w1.weight");
  if (!sx)
    return;
  int exact;
  double e = compare_list(L, "x:gather():table()", sx->data, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "rank %d: expert 3's w1 after 2 steps, gathered over ep: relative L2 %.3g", rank, e);
  e = compare_list(L, "t:grad('model.layers.1.block_sparse_moe.experts.3.w1.weight'):gather():table()", sx->grad,
                   1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "rank %d: its gradient, gathered: relative L2 %.3g", rank, e);
  e = compare_list(L, "t:moment('model.layers.1.block_sparse_moe.experts.3.w1.weight', 1):gather():table()",
                   s.opt.m + sx->offset, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "rank %d: its exp_avg, gathered: relative L2 %.3g", rank, e);
  /* replanned in memory to ep 1 under ZeRO-3 (every rank then holds a shard of every expert), and
   * on with the serial run's losses */
  if (run(L, "t:replan{ mesh = { ep = 1 }, zero = 3 }\nlosses = { t:step(), t:step() }"))
    return;
  CHECK(number(L, "t.mesh.ep") == 1 && number(L, "x.layout.here and 1 or 0") == 1);
  double mine = number(L, "#x"), both[2];
  CHECK(comm_all_gather(comm_world(), &mine, both, 1, COMM_FP64, NULL) == 0);
  CHECK_MSG(both[0] + both[1] == 1024, "expert 3's w1 after the replan: %g + %g elements", both[0], both[1]);
  for (int i = 0; i < 2; i++) {
    const double w = serial_step(&s);
    char expr[32];
    snprintf(expr, sizeof expr, "losses[%d]", i + 1);
    CHECK_MSG(fabs(number(L, expr) - w) <= tol * w, "step %d after the replan to ep 1: %.17g, %.17g serial", i + 3,
              number(L, expr), w);
  }
  e = compare_list(L, "x:gather():table()", sx->data, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "rank %d: expert 3's w1 after the replan and 2 more steps: relative L2 %.3g", rank, e);
  run(L, "t:close()");
  trainer_close(&s);
  lua_close(L);
}

static void test_dp2_zero3_shards(void)
{
  lua_State *L = new_state();
  struct trainer s;
  const char *sets[] = { "train.eval_every=0" };
  if (run(L, "t = tycho.open(PLAN, { zero = 3, train = { eval_every = 0 } })\n"
             "q = t:param('layers.0.q'); t:step(2)") ||
      serial(&s, sets, 1)) {
    lua_close(L);
    return;
  }
  serial_step(&s);
  serial_step(&s);
  CHECK(number(L, "t.dp") == rank && number(L, "t.mesh.dp") == 2 && number(L, "q.layout.zero.stage") == 3);
  /* the two ranges cover the 1024 elements once: summed over the ranks by the test */
  const double first = number(L, "q.layout.zero.first"), count = number(L, "#q");
  CHECK(count == number(L, "q.layout.zero.count") && number(L, "q.layout.zero.of") == 1024);
  double mine[2] = { first, count }, all[4];
  CHECK(comm_all_gather(comm_world(), mine, all, 2, COMM_FP64, NULL) == 0);
  const int lo = all[0] < all[2] ? 0 : 2, hi = 2 - lo;
  CHECK_MSG(all[lo] == 1 && all[lo] + all[lo + 1] == all[hi] && all[hi] + all[hi + 1] == 1025,
            "ranges %g+%g and %g+%g", all[0], all[1], all[2], all[3]);
  if (count > 0)
    CHECK_STR_CONTAINS(string(L, "q.layout.text"), "the ZeRO-3 shard of dp rank");
  const struct model_param *sq = find(&s, "model.layers.0.self_attn.q_proj.weight");
  if (!sq)
    return;
  int exact;
  double e = compare_list(L, "q:gather():table()", sq->data, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "q after 2 steps, gathered from ZeRO-3 shards: relative L2 %.3g", e);
  e = compare_list(L, "t:grad('layers.0.q'):gather():table()", sq->grad, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "q's gradient, gathered: relative L2 %.3g", e);
  e = compare_list(L, "t:moment('layers.0.q', 1):gather():table()", s.opt.m + sq->offset, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= tol, "q's exp_avg, gathered: relative L2 %.3g", e);
  e = compare_list(L, "t:moment('layers.0.q', 2):gather():table()", s.opt.v + sq->offset, 1024, &exact);
  CHECK_MSG(e >= 0 && e <= 2 * tol, "q's exp_avg_sq, gathered: relative L2 %.3g", e);
  /* t:set: a value that differs between the ranks is refused on both; the same one is taken */
  run(L, "ok, why = pcall(t.set, t, { optimizer = { lr = 1e-3 * (1 + t.rank) } })");
  CHECK(number(L, "ok and 1 or 0") == 0);
  CHECK_STR_CONTAINS(string(L, "why"), "the ranks' plans would differ");
  CHECK(number(L, "t:plan().optimizer.lr") == 3e-3);
  run(L, "t:set{ optimizer = { lr = 1e-3 } }");
  CHECK(number(L, "t:plan().optimizer.lr") == 1e-3);
  run(L, "t:close()");
  trainer_close(&s);
  lua_close(L);
}

static void test_pp2_gather_from_the_other_stage(void)
{
  lua_State *L = new_state();
  struct trainer s;
  const char *sets[] = { "train.eval_every=0" };
  if (run(L, "t = tycho.open(PLAN, { mesh = { pp = 2 }, train = { eval_every = 0 } })\n"
             "d = t:param('layers.1.down')") ||
      serial(&s, sets, 1)) {
    lua_close(L);
    return;
  }
  const int pp = (int)number(L, "t.pp");
  CHECK(pp == rank);
  if (pp == 0) {
    CHECK(number(L, "#d") == 0 && !strcmp(string(L, "d.layout.here"), "false"));
    CHECK_STR_CONTAINS(string(L, "d.layout.text"), "not on this pipeline rank (pp rank 1 holds it)");
  } else {
    CHECK(number(L, "#d") == 32 * 64);
  }
  const struct model_param *sd = find(&s, "model.layers.1.mlp.down_proj.weight");
  int exact = 0;
  if (sd)
    compare_list(L, "d:gather():table()", sd->data, 32 * 64, &exact);
  CHECK_MSG(exact, "rank %d: layers.1.down gathered over pp is not the serial tensor bit for bit", rank);
  const double w = serial_step(&s);
  CHECK(fabs(number(L, "t:step()") - w) <= tol * w);
  run(L, "t:close()");
  trainer_close(&s);
  lua_close(L);
}

/* t:replan: tp 2 → dp 2 zero 3 in memory, the step kept, the losses the serial run's; a view made
 * before shows the new layout; a replan to another model is refused and the trainer goes on. */
static void test_replan_tp2_to_dp2_zero3(void)
{
  lua_State *L = new_state();
  struct trainer s;
  const char *sets[] = { "train.eval_every=0" };
  if (run(L, "t = tycho.open(PLAN, { mesh = { tp = 2 }, train = { eval_every = 0 } })\n"
             "q = t:param('layers.0.q'); t:step(2)\n"
             "t:replan{ mesh = { tp = 1 }, zero = 3 }\n"
             "losses = { t:step(), t:step() }") ||
      serial(&s, sets, 1)) {
    lua_close(L);
    return;
  }
  CHECK(number(L, "t.mesh.tp") == 1 && number(L, "t.mesh.dp") == 2 && number(L, "t.mesh.zero") == 3);
  CHECK(number(L, "t.step") == 4 && number(L, "t.dp") == rank && number(L, "q.layout.zero.stage") == 3);
  for (int i = 0; i < 4; i++) {
    const double w = serial_step(&s);
    if (i < 2)
      continue;
    char expr[32];
    snprintf(expr, sizeof expr, "losses[%d]", i - 1);
    CHECK_MSG(fabs(number(L, expr) - w) <= tol * w, "step %d after the replan: %.17g, %.17g serial", i,
              number(L, expr), w);
  }
  const struct model_param *sq = find(&s, "model.layers.0.self_attn.q_proj.weight");
  int exact;
  double e = sq ? compare_list(L, "q:gather():table()", sq->data, 1024, &exact) : -1;
  CHECK_MSG(e >= 0 && e <= tol, "q after the replan and 2 more steps: relative L2 %.3g", e);
  run(L, "ok, why = pcall(t.replan, t, { model = { dim = 48 } })");
  CHECK(number(L, "ok and 1 or 0") == 0 && strlen(string(L, "why")) > 0);
  CHECK(number(L, "t.step") == 4 && number(L, "t.mesh.zero") == 3);
  run(L, "t:step()");
  CHECK(number(L, "t.step") == 5);
  run(L, "t:close()");
  trainer_close(&s);
  lua_close(L);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  if (comm_world()->size != 2)
    comm_fatal("mpi_lua_trainer runs on 2 ranks");
  const char *src = getenv("TYCHO_SOURCE_DIR");
  snprintf(plan_path, sizeof plan_path, "%s/tests/plans/good/dp_small.lua", src ? src : ".");
  snprintf(ep_plan_path, sizeof ep_plan_path, "%s/tests/plans/good/ep_small.lua", src ? src : ".");
  static const struct test_case tests[] = {
    TEST(test_tp2_split_gather_and_comm),
    TEST(test_tp2_memory_bill_is_exact),
    TEST(test_dp2_zero3_shards),
    TEST(test_ep2_experts),
    TEST(test_pp2_gather_from_the_other_stage),
    TEST(test_replan_tp2_to_dp2_zero3),
  };
  int rc = mpi_test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  comm_finalize(err, sizeof err);
  return rc;
}
