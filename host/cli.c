/* The command line's shared part (cli.h): the error every command raises, the strict parsers of
 * option values, the arguments of check, tune and run, and the plan and cluster file compiled into
 * Lua-owned userdata, so they are freed even when a later step raises. */
#include <lauxlib.h>
#include <lua.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "comm/comm.h"
#include "plan/compile.h"
#include "repl/link.h"
#include "util/launch.h"

int host_exit_code = EXIT_RUNTIME; /* the code of the error being raised */
int host_quiet_error;              /* rank 0 reports this error (the same on every rank) */

/* Raises an error that pmain's caller reports; `code` becomes the exit code. */
int host_fail(lua_State *L, int code, const char *fmt, ...)
{
  char msg[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  lua_pushstring(L, msg);
  host_exit_code = code;
  return lua_error(L);
}

/* Parses `value` as a decimal integer in [min, max], strictly: digits with an optional sign,
 * nothing before or after, checked in 64 bits before any narrowing. Anything else, a value
 * out of range included, is a usage error (exit 2) naming the option, the value and the
 * range. */
long long parse_count(lua_State *L, const char *opt, const char *value, long long min, long long max)
{
  char *end = NULL;
  long long v = 0;
  const char *why = NULL;
  if (!value || !*value) {
    why = "nothing";
  } else if (!(value[0] == '-' || value[0] == '+' || (value[0] >= '0' && value[0] <= '9'))) {
    why = "not an integer";
  } else {
    errno = 0;
    v = strtoll(value, &end, 10);
    if (end == value || *end)
      why = "not an integer";
    else if (errno == ERANGE || v < min || v > max)
      why = "out of range";
  }
  if (why)
    host_fail(L, EXIT_USAGE, "%s needs an integer in %lld..%lld (got %s%s%s); see tycho --help", opt, min, max,
              value && *value ? value : "", value && *value ? ": " : "", why);
  return v;
}

/* A --set argument: path.to.field=value where no component of the path is empty ("a..b",
 * ".a" and "a." are refused here, not read as "a.b" or "a"); the plan compiler checks the rest. */
const char *check_set(lua_State *L, const char *set)
{
  if (!set)
    host_fail(L, EXIT_USAGE, "--set needs path.to.field=value; see tycho --help");
  const char *eq = strchr(set, '=');
  if (!eq || eq == set)
    return set; /* the plan compiler refuses it: "--set: ...: expected path.to.field=value" */
  for (const char *c = set; c < eq; c++)
    if (*c == '.' && (c == set || c + 1 == eq || c[1] == '.'))
      host_fail(L, EXIT_USAGE, "--set %s: the path '%.*s' has an empty component; write "
                "path.to.field=value (e.g. --set mesh.tp=2)", set, (int)(eq - set), set);
  return set;
}

/* The options of every command that compiles a plan: --set (and --set=), --unsafe, --max-memory,
 * --max-instructions. When argv[*i] is one of them, stores it (a --set in sets[*n_sets]), moves
 * *i past its value and returns 1; otherwise 0. */
int plan_option(lua_State *L, int argc, char **argv, int *i, const struct plan_opts *o)
{
  const char *a = argv[*i], *next = *i + 1 < argc ? argv[*i + 1] : NULL;
  if (strcmp(a, "--set") == 0) {
    o->sets[(*o->n_sets)++] = check_set(L, next);
    ++*i;
  } else if (strncmp(a, "--set=", 6) == 0) {
    o->sets[(*o->n_sets)++] = check_set(L, a + 6);
  } else if (strcmp(a, "--unsafe") == 0) {
    *o->unsafe = 1;
  } else if (strcmp(a, "--max-memory") == 0) {
    *o->memory_limit = (size_t)parse_count(L, "--max-memory", next, 1, MEMORY_MAX_MIB) << 20;
    ++*i;
  } else if (strcmp(a, "--max-instructions") == 0) {
    *o->instruction_limit = parse_count(L, "--max-instructions", next, 1000, INSTRUCTIONS_MAX);
    ++*i;
  } else {
    return 0;
  }
  return 1;
}

/* The options of the commands that start their own ranks (rehearse, calibrate): --launcher CMD,
 * and --worker, which marks the ranks they start. 1 when argv[*i] is one of them. */
int launch_option(lua_State *L, int argc, char **argv, int *i, const char **launcher)
{
  const char *a = argv[*i], *next = *i + 1 < argc ? argv[*i + 1] : NULL;
  if (strcmp(a, "--worker") == 0)
    return 1;
  if (strcmp(a, "--launcher") != 0)
    return 0;
  if (!next || !*next)
    host_fail(L, EXIT_USAGE, "--launcher needs a command, e.g. --launcher 'srun -n {n}'");
  *launcher = next;
  ++*i;
  return 1;
}

void parse_args(lua_State *L, int argc, char **argv, struct cli *c)
{
  c->command = argv[1];
  c->sets = lua_newuserdatauv(L, sizeof(char *) * (size_t)argc, 0); /* freed by Lua */
  const struct plan_opts po = { c->sets, &c->n_sets, &c->unsafe, &c->memory_limit, &c->instruction_limit };
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (plan_option(L, argc, argv, &i, &po)) {
      continue;
    } else if (strcmp(a, "--world") == 0) {
      c->world = (int)parse_count(L, "--world", next, 1, WORLD_MAX);
      i++;
    } else if (strncmp(a, "--world=", 8) == 0) {
      c->world = (int)parse_count(L, "--world", a + 8, 1, WORLD_MAX);
    } else if (strcmp(a, "--json") == 0) {
      c->json = 1;
    } else if (strcmp(a, "--svg") == 0 && strcmp(c->command, "check") == 0) {
      if (!next || !*next)
        host_fail(L, EXIT_USAGE, "--svg needs a file to write, e.g. --svg step.svg");
      c->svg = next;
      i++;
    } else if (strcmp(a, "--sbatch") == 0 && strcmp(c->command, "check") == 0) {
      c->sbatch = 1;
    } else if (strcmp(a, "--cpus-per-task") == 0 && strcmp(c->command, "check") == 0) {
      c->cpus_per_task = (int)parse_count(L, "--cpus-per-task", next, 1, CPUS_PER_TASK_MAX);
      i++;
    } else if (strcmp(a, "--out") == 0 && next) {
      c->out = next;
      i++;
    } else if (strcmp(a, "--top") == 0) {
      c->top = (int)parse_count(L, "--top", next, 1, TOP_MAX);
      i++;
    } else if (strcmp(a, "--headroom") == 0) {
      c->headroom = (double)parse_count(L, "--headroom", next, 0, HEADROOM_MAX) / 100.0;
      c->headroom_given = 1;
      i++;
    } else if (strcmp(a, "--listen") == 0 && strcmp(c->command, "run") == 0) {
      if (!next || !*next)
        host_fail(L, EXIT_USAGE, "--listen needs an address: a Unix socket path or HOST:PORT");
      c->listen = next;
      i++;
    } else if (strcmp(a, "--listen-public") == 0 && strcmp(c->command, "run") == 0) {
      c->listen_public = 1;
    } else if (strcmp(a, "--cluster") == 0) {
      if (!next)
        host_fail(L, EXIT_USAGE, "--cluster needs a cluster file, e.g. plans/clusters/h100_80g_ib.lua");
      c->cluster = next;
      i++;
    } else if (a[0] == '-' && a[1]) {
      host_fail(L, EXIT_USAGE, "unknown option '%s' for '%s'; see tycho --help", a, c->command);
    } else if (!c->plan) {
      c->plan = a;
    } else {
      host_fail(L, EXIT_USAGE, "unexpected argument '%s' (the plan is %s); see tycho --help", a, c->plan);
    }
  }
  if (!c->plan)
    host_fail(L, EXIT_USAGE, "'%s' needs a plan file, e.g. tycho %s plans/tiny.lua", c->command, c->command);
  /* a TCP address other machines can reach is asked for by name: the token is the only guard */
  struct link_addr la;
  if (c->listen_public && !c->listen)
    host_fail(L, EXIT_USAGE, "--listen-public needs --listen HOST:PORT");
  if (c->listen && !c->listen_public && link_parse_addr(c->listen, &la, NULL, 0) == 0 && link_addr_public(&la))
    host_fail(L, EXIT_USAGE, "--listen %s: not a loopback address, so other machines could connect; give "
              "--listen-public too to listen there, or listen on localhost:%d or a Unix socket path", c->listen, la.port);
}

/* Compiles the plan; a plan error raises with exit code 2. The plan is owned by a userdata
 * on the stack, so it is freed even when a later step raises. */
static int plan_gc(lua_State *L)
{
  plan_free(lua_touserdata(L, 1));
  return 0;
}

/* Compiles the plan into a userdata left on the stack; 0 ok, else -1 with the message in err. */
int compile_plan(lua_State *L, const struct cli *c, int world, struct plan **out, char *err,
                        size_t err_size)
{
  struct plan *p = lua_newuserdatauv(L, sizeof *p, 0);
  plan_init(p);
  lua_newtable(L);
  lua_pushcfunction(L, plan_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  struct plan_compile_options opt = { world, c->unsafe, c->memory_limit, c->instruction_limit, c->n_sets, c->sets };
  *out = p;
  return plan_compile(c->plan, &opt, p, err, err_size) != 0 ? -1 : 0;
}

struct plan *compile_or_fail(lua_State *L, const struct cli *c, int world)
{
  struct plan *p;
  char err[2048];
  if (compile_plan(L, c, world, &p, err, sizeof err))
    host_fail(L, EXIT_USAGE, "plan error: %s", err);
  return p;
}

/* The --cluster file, or NULL; a bad file is a usage error (exit 2). */
const struct cluster *load_cluster(lua_State *L, const struct cli *c)
{
  if (!c->cluster)
    return NULL;
  struct cluster *cl = lua_newuserdatauv(L, sizeof *cl, 0);
  char err[2048];
  if (cluster_load(c->cluster, c->unsafe, cl, err, sizeof err))
    host_fail(L, EXIT_USAGE, "cluster error: %s", err);
  return cl;
}


/* Agrees over the world on a status (0 ok) and message; on failure raises the agreed error on
 * every rank, reported by rank 0 only. The message names the failing rank when it is not 0. */
void agree_or_fail(lua_State *L, int code, const char *prefix, const char *err)
{
  struct comm_group *w = comm_world();
  char msg[COMM_AGREE_MSG_MAX];
  snprintf(msg, sizeof msg, "%s", code ? err : "");
  int failed_rank, agreed = comm_agree(w, code, msg, sizeof msg, &failed_rank);
  if (agreed == 0)
    return;
  if (agreed < 0)
    host_fail(L, EXIT_RUNTIME, "%s", msg);
  if (failed_rank > 0)
    host_fail(L, agreed, "%srank %d: %s", prefix, failed_rank, msg);
  host_fail(L, agreed, "%s%s", prefix, msg);
}

/* `rehearse` and `calibrate` run as workers (under MPI) when their launcher started them
 * (--worker) or when they were started by mpirun or srun themselves; otherwise they are the
 * launcher, which starts the ranks (util/launch.h). */
int mpi_worker(int argc, char **argv, const char *command)
{
  if (argc < 2 || strcmp(argv[1], command) != 0)
    return 0;
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--worker") == 0)
      return 1;
  return launch_under_launcher();
}

