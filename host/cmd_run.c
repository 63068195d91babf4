/* `tycho run` (training on the MPI world, optionally serving an attachable REPL) and `tycho repl`
 * (the session on the ranks, and its front-end at the terminal that starts the ranks or attaches
 * to a running job): the commands that drive the trainer and the REPL (host/repl/, bindings/). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "comm/comm.h"
#include "lua/tycho_module.h"
#include "mesh/mesh.h"
#include "repl/frontend.h"
#include "repl/link.h"
#include "repl/repl.h"
#include "runtime/train/train.h"
#include "tycho_runtime.h"
#include "util/launch.h"

static void repl_libs(lua_State *L);

/* run --listen: the attached REPL's turn between two steps, and its t (the job's trainer). */
static int attach_between(void *ctx, struct trainer *t, char *err, size_t n)
{
  (void)ctx;
  return repl_attach_between_steps(t, &t->step, err, n);
}

static void attach_bind(lua_State *L, void *trainer)
{
  tycho_runtime_bind_borrowed(L, trainer, "t");
}

int cmd_run(lua_State *L, const struct cli *c)
{
  struct comm_group *world = comm_world();
  if (c->world && c->world != world->size)
    return host_fail(L, EXIT_USAGE, "--world %d: tycho run takes the world from MPI (%d rank%s "
                     "here); start %d ranks with mpirun -np %d", c->world, world->size,
                     world->size == 1 ? "" : "s", c->world, c->world);
  struct plan *p;
  char err[COMM_AGREE_MSG_MAX];
  int bad = compile_plan(L, c, world->size, &p, err, sizeof err);
  agree_or_fail(L, bad ? EXIT_USAGE : 0, "plan error: ", err);
  if (comm_check_plan_hash(plan_hash(p), err, sizeof err))
    return host_fail(L, EXIT_USAGE, "plan error: %s (compiled from %s on each rank: the plan "
                     "file and --set arguments must be the same everywhere, and the plan may not depend on "
                     "what differs between ranks: os.getenv, os.time, os.clock, os.date, or the order "
                     "of pairs())", err, c->plan);
  struct comm_group *groups[PLAN_N_AXES];
  if (comm_build_mesh_groups(&p->mesh, groups, err, sizeof err))
    return host_fail(L, EXIT_RUNTIME, "%s", err);
  struct train_between between = { attach_between, NULL };
  if (c->listen) { /* the attachable REPL: it listens before the run's header, served between steps */
    struct repl_attach_options ao = { c->listen, world->rank == 0 ? stdout : NULL, repl_libs, attach_bind,
                                      tycho_runtime_collected, tycho_runtime_close_collected };
    struct link_addr la;
    if (c->listen_public && world->rank == 0 && link_parse_addr(c->listen, &la, NULL, 0) == 0 && link_addr_public(&la))
      fprintf(stderr, "tycho: warning: --listen %s --listen-public: other machines can connect to this job; only "
              "its token (in %s) keeps them out\n", c->listen, la.token_file);
    int failed = repl_attach_open(&ao, err, sizeof err);
    if (failed)
      return host_fail(L, EXIT_USAGE, "%s", err);
    train_run_set_between(&between);
    tycho_runtime_set_stop_hook(repl_stop_requested, NULL); /* the front-end's Ctrl-C stops t:step */
  }
  int rc = train_run(p, groups, stdout, err, sizeof err);
  if (c->listen) {
    train_run_set_between(NULL);
    repl_attach_close();
  }
  if (rc == TRAIN_PLAN_ERROR)
    return host_fail(L, EXIT_USAGE, "plan error: %s", err);
  if (rc == TRAIN_INPUT_ERROR) /* bad content in a file the user gave (util/err.h) */
    return host_fail(L, EXIT_USAGE, "%s", err);
  if (rc == 130 || rc == 143) /* stopped by SIGINT / SIGTERM after a step (train_run) */
    return host_fail(L, rc, "%s", err);
  if (rc != TRAIN_OK)
    return host_fail(L, EXIT_RUNTIME, "%s", err);
  return 0;
}

/* The libraries a REPL chunk sees: the standard ones and the tycho module (plan helpers and
 * the trainer: tycho.open). */
static void repl_libs(lua_State *L)
{
  luaL_openlibs(L);
  luaL_requiref(L, "tycho", luaopen_tycho, 1); /* plan helpers: tycho.plan, tycho.extend */
  luaopen_tycho_runtime(L);                    /* the trainer: tycho.open */
  lua_pop(L, 1);
}

/* The options every form of `tycho repl` takes: --set path=value and --timeout S (default 30, or
 * TYCHO_REPL_TIMEOUT). 1 when argv[*i] was one of them (its value consumed). */
static double repl_default_timeout(lua_State *L)
{
  const char *env = getenv("TYCHO_REPL_TIMEOUT");
  return env && *env ? (double)parse_count(L, "TYCHO_REPL_TIMEOUT", env, 1, TIMEOUT_MAX) : 30.0;
}

static int repl_common_option(lua_State *L, int argc, char **argv, int *i, const char **sets, int *n_sets,
                              double *timeout)
{
  const char *a = argv[*i], *next = *i + 1 < argc ? argv[*i + 1] : NULL;
  if (strcmp(a, "--set") == 0) {
    sets[(*n_sets)++] = check_set(L, next);
    ++*i;
  } else if (strncmp(a, "--set=", 6) == 0) {
    sets[(*n_sets)++] = check_set(L, a + 6);
  } else if (strcmp(a, "--timeout") == 0) {
    *timeout = (double)parse_count(L, "--timeout", next, 1, TIMEOUT_MAX);
    ++*i;
  } else {
    return 0;
  }
  return 1;
}

/* A REPL's plan compiled before its session (for `world` ranks; agreed over the world when the
 * ranks run already): one that does not open is refused as `tycho run` refuses it, exit 2, before
 * a prompt shows or, for a front-end, before any rank starts. */
static void repl_check_plan(lua_State *L, const char *plan, const char **sets, int n_sets, int world, int agree)
{
  const struct cli c = { .plan = plan, .sets = sets, .n_sets = n_sets };
  struct plan *p;
  char err[COMM_AGREE_MSG_MAX];
  const int bad = compile_plan(L, &c, world, &p, err, sizeof err);
  if (agree)
    agree_or_fail(L, bad ? EXIT_USAGE : 0, "plan error: ", err);
  else if (bad)
    host_fail(L, EXIT_USAGE, "plan error: %s", err);
  lua_pop(L, 1); /* the plan: tycho.open compiles its own */
}

int cmd_repl(lua_State *L, int argc, char **argv)
{
  struct repl_options o = { 0 };
  const char **sets = lua_newuserdatauv(L, sizeof(char *) * (size_t)argc, 0);
  o.sets = sets;
  o.timeout = repl_default_timeout(L);
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (repl_common_option(L, argc, argv, &i, sets, &o.n_sets, &o.timeout)) {
      continue;
    } else if (strcmp(a, "--frontend") == 0) { /* hidden: a rank a front-end started (repl/repl.h) */
      if (!next)
        return host_fail(L, EXIT_USAGE, "--frontend needs the front-end's folder");
      o.frontend = next;
      i++;
    } else if (a[0] == '-' && a[1]) {
      return host_fail(L, EXIT_USAGE, "unknown option '%s' for 'repl'; see tycho --help", a);
    } else if (!o.plan) {
      o.plan = a;
    } else if (!o.script) {
      o.script = a;
    } else {
      return host_fail(L, EXIT_USAGE, "unexpected argument '%s' (repl takes PLAN.lua and FILE.lua); see tycho --help", a);
    }
  }
  if (o.n_sets && !o.plan)
    return host_fail(L, EXIT_USAGE, "--set needs a plan: tycho repl PLAN.lua --set path=value");
  if (o.frontend && o.plan)
    return host_fail(L, EXIT_USAGE, "unexpected argument '%s': a rank of a front-end takes no PLAN.lua or FILE.lua "
                     "(the front-end sends the plan's open)", o.plan);
  o.open_libs = repl_libs;
  o.collected = tycho_runtime_collected;
  o.close_collected = tycho_runtime_close_collected;
  tycho_runtime_set_stop_hook(repl_stop_requested, NULL); /* Ctrl-C stops t:step at a boundary */
  host_quiet_error = comm_world()->rank != 0;
  if (o.plan)
    repl_check_plan(L, o.plan, sets, o.n_sets, comm_world()->size, 1);
  char err[2048] = "";
  int code = repl_run(&o, err, sizeof err);
  fflush(stdout);
  if (code == 2 || (code && err[0]))
    return host_fail(L, code, "%s", err[0] ? err : "the session failed");
  host_exit_code = code;
  if (code && o.frontend)
    host_quiet_error = 1; /* the front-end's quit(code): it has shown why */
  if (code)
    return host_fail(L, code, "a chunk failed%s%s", err[0] ? ": " : "", err);
  return 0;
}

/* `tycho repl -n N` (or --ranks N, --launcher CMD): the front-end at the terminal, which starts
 * the ranks itself and never starts MPI here (main() asks before it would); and `tycho repl
 * --attach ADDR [--token FILE]`, the front-end of a running `tycho run --listen ADDR`. */
int repl_frontend_form(int argc, char **argv)
{
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--frontend") == 0) /* a rank a front-end started */
      return 0;
    if (strcmp(a, "-n") == 0 || strcmp(a, "--ranks") == 0 || strncmp(a, "--ranks=", 8) == 0 ||
        strcmp(a, "--launcher") == 0 || strcmp(a, "--attach") == 0 || strcmp(a, "--token") == 0)
      return 1;
    if (strcmp(a, "--set") == 0 || strcmp(a, "--timeout") == 0)
      i++; /* their values are not options */
  }
  return 0;
}

int cmd_repl_frontend(lua_State *L, int argc, char **argv)
{
  struct repl_frontend_options o = { 0 };
  const char **sets = lua_newuserdatauv(L, sizeof(char *) * (size_t)argc, 0);
  o.sets = sets;
  o.timeout = repl_default_timeout(L);
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (repl_common_option(L, argc, argv, &i, sets, &o.n_sets, &o.timeout)) {
      continue;
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--ranks") == 0) {
      o.ranks = (int)parse_count(L, a, next, 1, REPL_RANKS_MAX);
      i++;
    } else if (strncmp(a, "--ranks=", 8) == 0) {
      o.ranks = (int)parse_count(L, "--ranks", a + 8, 1, REPL_RANKS_MAX);
    } else if (strcmp(a, "--attach") == 0 || strcmp(a, "--token") == 0) {
      if (!next || !*next)
        return host_fail(L, EXIT_USAGE, "%s needs %s", a, a[2] == 'a' ? "the address a `tycho run --listen` gave" : "a file");
      *(a[2] == 'a' ? &o.attach : &o.token_file) = next;
      i++;
    } else if (strcmp(a, "--launcher") == 0) {
      if (!next || !*next)
        return host_fail(L, EXIT_USAGE, "--launcher needs a command, e.g. --launcher 'srun -n {n}'");
      if (!strstr(next, "{n}"))
        return host_fail(L, EXIT_USAGE, "--launcher '%s': write {n} where the rank count goes, e.g. --launcher 'srun -n {n}'",
                         next);
      o.launcher = next;
      i++;
    } else if (a[0] == '-' && a[1]) {
      return host_fail(L, EXIT_USAGE, "unknown option '%s' for 'repl'; see tycho --help", a);
    } else if (!o.plan) {
      o.plan = a;
    } else if (!o.script) {
      o.script = a;
    } else {
      return host_fail(L, EXIT_USAGE, "unexpected argument '%s' (repl takes PLAN.lua and FILE.lua); see tycho --help", a);
    }
  }
  if (o.attach && o.plan && !o.script) { /* --attach ADDR FILE.lua: chunks from the file */
    o.script = o.plan;
    o.plan = NULL;
  }
  if (o.attach && (o.ranks || o.launcher || o.plan || o.n_sets))
    return host_fail(L, EXIT_USAGE, "--attach takes no %s: the job it attaches to has its plan and ranks (tycho repl --attach ADDR [FILE.lua])",
                     o.ranks ? "-n" : o.launcher ? "--launcher" : o.n_sets ? "--set" : "PLAN.lua");
  if (o.token_file && !o.attach)
    return host_fail(L, EXIT_USAGE, "--token goes with --attach ADDR");
  if (!o.ranks && !o.attach)
    return host_fail(L, EXIT_USAGE, "--launcher needs -n N, the ranks to start: tycho repl [PLAN.lua] -n N --launcher CMD");
  if (o.n_sets && !o.plan)
    return host_fail(L, EXIT_USAGE, "--set needs a plan: tycho repl PLAN.lua --set path=value");
  if (o.plan)
    repl_check_plan(L, o.plan, sets, o.n_sets, o.ranks, 0);
  char self[4096];
  o.self = launch_self_path(self, sizeof self, argv[0]);
  char err[2048] = "";
  int code = repl_frontend_run(&o, err, sizeof err);
  fflush(stdout);
  host_exit_code = code;
  if (err[0])
    return host_fail(L, code, "%s", err);
  if (code) {
    host_quiet_error = 1; /* said already, or the code of quit(code) */
    return host_fail(L, code, "the session ended with code %d", code);
  }
  return 0;
}
