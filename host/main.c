/* tycho: the command line. Shaped like Lua's own lua.c: main() only creates a Lua state and
 * calls pmain under lua_pcall, so every failure, even during start-up, reaches one report
 * path: "tycho: <cause>" on stderr, detail after, and the exit code (0 ok, 1 runtime
 * failure, 2 usage or plan error). `run` starts the comm layer first (MPI: a world of one
 * without mpirun); its failures are agreed by every rank, so rank 0 alone reports them and
 * every rank exits with the same code. */
#define _POSIX_C_SOURCE 200809L /* sysconf */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drive/calibrate.h"
#include "util/launch.h"
#include "check/check.h"
#include "check/sbatch.h"
#include "drive/rehearse.h"
#include "check/tune.h"
#include "plan/cluster.h"
#include "comm/comm.h"
#include "mesh/mesh.h"
#include "kernels.h"
#include "plan/compile.h"
#include "repl/frontend.h"
#include "repl/link.h"
#include "repl/repl.h"
#include "lua/tycho_module.h"
#include "tycho_runtime.h"
#include "runtime/train/threads.h"
#include "runtime/train/threads_adapt.h"
#include "runtime/state/ckpt.h"
#include "runtime/state/manifest.h"
#include "runtime/train/train.h"
#include "util/devices.h"
#include "util/err.h"
#include "util/path.h"
#include "usage.h"

#define EXIT_USAGE 2
#define EXIT_RUNTIME 1

static const char *const progname = "tycho";
static int exit_code = EXIT_RUNTIME; /* the code of the error being raised */
static int quiet_error;              /* rank 0 reports this error (the same on every rank) */

/* Raises an error that pmain's caller reports; `code` becomes the exit code. The message is
 * formatted by vsnprintf (C's formats: %lld, %.0f, %.*s; lua_pushfstring knows few of them). */
static int host_fail(lua_State *L, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int host_fail(lua_State *L, int code, const char *fmt, ...)
{
  char msg[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  lua_pushstring(L, msg);
  exit_code = code;
  return lua_error(L);
}

struct cli {
  const char *command;
  const char *plan;
  const char *cluster, *out;
  const char *listen; /* run --listen ADDR: the attachable REPL, or NULL */
  int listen_public;  /* run --listen-public: ADDR may be reachable from other machines */
  int world, json, unsafe, top;
  int sbatch, cpus_per_task; /* check --sbatch [--cpus-per-task N] */
  double headroom;
  int headroom_given; /* --headroom 0 is 0%, not the default */
  size_t memory_limit;
  long long instruction_limit;
  int n_sets;
  const char **sets;
};

/* The ranges of the numeric options: each is stored in the type noted, and every value in the
 * range is one the code can represent and use (a world of ranks in an int, MiB shifted into
 * bytes in a size_t, an instruction count that the sandbox's counter cannot overflow). */
#define WORLD_MAX (1LL << 24)               /* ranks; int, and tp × pp × dp stays far from 2^31 */
#define TOP_MAX 1000LL                      /* layouts printed by tune; one calloc'd entry each */
#define HEADROOM_MAX 99LL                   /* percent */
#define MEMORY_MAX_MIB (1LL << 20)          /* 1 TiB of Lua heap: << 20 fits 64 bits */
#define INSTRUCTIONS_MAX 1000000000000000LL /* 10^15 Lua instructions */
#define TIMEOUT_MAX 604800LL                /* a week of seconds for the REPL's watchdog */
#define REPL_RANKS_MAX 65536LL              /* ranks a REPL front-end starts */
#define CPUS_PER_TASK_MAX 4096LL            /* check --sbatch --cpus-per-task */

/* Parses `value` as a decimal integer in [min, max], strictly: digits with an optional sign,
 * nothing before or after, checked in 64 bits before any narrowing. Anything else, a value
 * out of range included, is a usage error (exit 2) naming the option, the value and the
 * range. */
static long long parse_count(lua_State *L, const char *opt, const char *value, long long min, long long max)
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
static const char *check_set(lua_State *L, const char *set)
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
struct plan_opts {
  const char **sets;
  int *n_sets, *unsafe;
  size_t *memory_limit;
  long long *instruction_limit;
};

static int plan_option(lua_State *L, int argc, char **argv, int *i, const struct plan_opts *o)
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
static int launch_option(lua_State *L, int argc, char **argv, int *i, const char **launcher)
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

static void parse_args(lua_State *L, int argc, char **argv, struct cli *c)
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
static int compile_plan(lua_State *L, const struct cli *c, int world, struct plan **out, char *err,
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

static struct plan *compile_or_fail(lua_State *L, const struct cli *c, int world)
{
  struct plan *p;
  char err[2048];
  if (compile_plan(L, c, world, &p, err, sizeof err))
    host_fail(L, EXIT_USAGE, "plan error: %s", err);
  return p;
}

/* The --cluster file, or NULL; a bad file is a usage error (exit 2). */
static const struct cluster *load_cluster(lua_State *L, const struct cli *c)
{
  if (!c->cluster)
    return NULL;
  struct cluster *cl = lua_newuserdatauv(L, sizeof *cl, 0);
  char err[2048];
  if (cluster_load(c->cluster, c->unsafe, cl, err, sizeof err))
    host_fail(L, EXIT_USAGE, "cluster error: %s", err);
  return cl;
}

/* The best layouts of a model for a world and a cluster; the best written as a plan file. */
static int cmd_tune(lua_State *L, const struct cli *c)
{
  if (!c->world)
    return host_fail(L, EXIT_USAGE, "tune needs --world N (the ranks to plan for)");
  if (!c->cluster)
    return host_fail(L, EXIT_USAGE, "tune needs --cluster C.lua (e.g. plans/clusters/h100_80g_ib.lua)");
  struct plan *p = compile_or_fail(L, c, 0); /* the model and batch; tune picks the mesh */
  const struct cluster *cl = load_cluster(L, c);
  const double headroom = c->headroom_given ? c->headroom : 0.10;
  const int top = c->top > 0 ? c->top : 5;
  struct tune_result r;
  char err[1024];
  if (tune_search(p, c->world, cl, headroom, top, &r, err, sizeof err))
    return host_fail(L, EXIT_RUNTIME, "%s", err);
  printf("tune %s for %d ranks on %s: %d layouts tried, %d valid, %d fit with %.0f%% headroom (%.2f s)\n",
         p->name[0] ? p->name : c->plan, c->world, cl->name, r.n_tried, r.n_valid, r.n_fit,
         100.0 * headroom, r.seconds);
  if (r.n_best == 0) {
    tune_result_free(&r);
    return host_fail(L, EXIT_USAGE, "no layout of %s fits %d ranks of %s with %.0f%% headroom; more ranks, "
                     "a larger device or a smaller micro-batch", c->plan, c->world, cl->name, 100.0 * headroom);
  }
  for (int i = 0; i < r.n_best; i++) {
    const struct tune_choice *t = &r.best[i];
    char rc[96], every[96] = "";
    if (t->zero >= 2) /* zero_every: how often the step reduce-scatters (and gathers) */
      snprintf(every, sizeof every, " (grads every %s%s%s)", t->grads_step ? "step" : "micro-batch",
               t->zero == 3 ? ", params every " : "", t->zero == 3 ? (t->params_step ? "step" : "micro-batch") : "");
    char ep[24] = "";
    if (t->ep > 1)
      snprintf(ep, sizeof ep, " ep %d", t->ep);
    printf("%2d. tp %d pp %d v %d dp %d%s, micro %d, zero %d%s, recompute %s, sequence parallel %s%s: "
           "%.3f s/step, %.0f tokens/s, MFU %.1f%%, %.1f GiB on the fullest rank (%.0f%% spare)\n", i + 1,
           t->tp, t->pp, t->v, t->dp, ep, t->micro, t->zero, every, plan_recompute_text(t->recompute, rc, sizeof rc),
           t->sp ? "on" : "off", t->kv_replicate ? ", k and v replicated" : "", t->step, t->tokens_per_s,
           100.0 * t->mfu, t->max_bytes / (1024.0 * 1024.0 * 1024.0), 100.0 * t->headroom);
  }
  /* the best as a plan file, by default next to the model's */
  char module[256], path[1200], command[1600];
  const char *base = strrchr(c->plan, '/');
  base = base ? base + 1 : c->plan;
  snprintf(module, sizeof module, "%s", base);
  char *dot = strrchr(module, '.');
  if (dot && strcmp(dot, ".lua") == 0)
    *dot = 0;
  if (c->out)
    snprintf(path, sizeof path, "%s", c->out);
  else
    snprintf(path, sizeof path, "%.*s%s_tuned_%d.lua", (int)(base - c->plan), c->plan, module, c->world);
  snprintf(command, sizeof command, "tycho tune %s --world %d --cluster %s", c->plan, c->world, c->cluster);
  FILE *f;
  char why[1400];
  const int opened = path_fopen_output(c->out ? "--out" : NULL, path, 0, &f, why, sizeof why);
  if (opened) { /* 2: a FIFO, a device or a folder at the path, left as it is */
    tune_result_free(&r);
    return host_fail(L, opened == 2 ? EXIT_USAGE : EXIT_RUNTIME, "%s", why);
  }
  char werr[1400] = "";
  int bad = tune_write_plan(f, c->plan, path, c->n_sets, c->sets, &r.best[0], command, werr, sizeof werr);
  if (fclose(f))
    bad = 1;
  tune_result_free(&r);
  if (bad)
    return host_fail(L, EXIT_RUNTIME, "%s", werr[0] ? werr : "cannot write the tuned plan");
  printf("wrote %s (check it: tycho check %s --world %d --cluster %s)\n", path, path, c->world, c->cluster);
  return 0;
}

static int cmd_check(lua_State *L, const struct cli *c)
{
  if (c->sbatch && !c->cluster)
    return host_fail(L, EXIT_USAGE, "--sbatch needs --cluster C.lua, the cluster the job runs on (e.g. "
                     "plans/clusters/h100_80g_ib.lua): its nodes size the script");
  if (c->sbatch && c->json)
    return host_fail(L, EXIT_USAGE, "--sbatch and --json: choose one (the script, or the JSON document)");
  if (c->cpus_per_task && !c->sbatch)
    return host_fail(L, EXIT_USAGE, "--cpus-per-task is for the batch script: tycho check PLAN --world N "
                     "--cluster C.lua --sbatch --cpus-per-task N");
  struct plan *p = compile_or_fail(L, c, c->world);
  const struct cluster *cl = load_cluster(L, c);
  if (c->sbatch) {
    char self[4096], cwd[4096], err[1024];
    if (!getcwd(cwd, sizeof cwd))
      return host_fail(L, EXIT_RUNTIME, "--sbatch: cannot read the current folder: %s", strerror(errno));
    const struct sbatch_options so = { c->plan, c->cluster, launch_self_path(self, sizeof self, "tycho"), cwd,
                                       c->n_sets, c->sets, c->cpus_per_task, c->unsafe };
    const int rc = check_write_sbatch(p, cl, &so, stdout, err, sizeof err);
    if (rc)
      return host_fail(L, rc == 2 ? EXIT_USAGE : EXIT_RUNTIME, "%s", err);
  } else if (c->json) {
    struct strbuf b;
    sb_init(&b);
    check_write_json(p, cl, &b);
    if (b.failed) {
      sb_free(&b);
      return host_fail(L, EXIT_RUNTIME, "out of memory writing the JSON document");
    }
    fwrite(b.s, 1, b.n, stdout);
    sb_free(&b);
  } else {
    check_print_text(p, cl, stdout);
  }
  if (fflush(stdout) != 0)
    return host_fail(L, EXIT_RUNTIME, "cannot write to stdout");
  return 0;
}

/* Agrees over the world on a status (0 ok) and message; on failure raises the agreed error on
 * every rank, reported by rank 0 only. The message names the failing rank when it is not 0. */
static void agree_or_fail(lua_State *L, int code, const char *prefix, const char *err)
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

static int cmd_run(lua_State *L, const struct cli *c)
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

/* `rehearse` and `calibrate` run as workers (under MPI) when their launcher started them
 * (--worker) or when they were started by mpirun or srun themselves; otherwise they are the
 * launcher, which starts the ranks (util/launch.h). */
static int mpi_worker(int argc, char **argv, const char *command)
{
  if (argc < 2 || strcmp(argv[1], command) != 0)
    return 0;
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--worker") == 0)
      return 1;
  return launch_under_launcher();
}

static int cmd_rehearse(lua_State *L, int argc, char **argv, int worker)
{
  struct rehearse_options o = { 0 };
  const char **sets = lua_newuserdatauv(L, sizeof(char *) * (size_t)argc, 0);
  const char **faults = lua_newuserdatauv(L, sizeof(char *) * (size_t)argc, 0);
  o.sets = sets;
  o.faults = faults;
  const struct plan_opts po = { sets, &o.n_sets, &o.unsafe, &o.memory_limit, &o.instruction_limit };
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (plan_option(L, argc, argv, &i, &po)) {
      continue;
    } else if (strcmp(a, "--fault") == 0) {
      faults[o.n_faults++] = check_set(L, next);
      i++;
    } else if (strcmp(a, "--world") == 0) {
      o.world = (int)parse_count(L, "--world", next, 1, WORLD_MAX);
      i++;
    } else if (strcmp(a, "--steps") == 0) {
      o.steps = (int)parse_count(L, "--steps", next, 1, REHEARSE_MAX_STEPS);
      i++;
    } else if (strcmp(a, "--head-dim") == 0) {
      o.head_dim = (int)parse_count(L, "--head-dim", next, 2, 1 << 16);
      i++;
    } else if (strcmp(a, "--seq") == 0) {
      o.seq = (int)parse_count(L, "--seq", next, 1, 1 << 20);
      i++;
    } else if (strcmp(a, "--micro-batches") == 0) {
      o.micro_batches = (int)parse_count(L, "--micro-batches", next, 1, 1 << 20);
      i++;
    } else if (launch_option(L, argc, argv, &i, &o.launcher)) {
      continue;
    } else if (a[0] == '-' && a[1]) {
      return host_fail(L, EXIT_USAGE, "unknown option '%s' for 'rehearse'; see tycho --help", a);
    } else if (!o.plan_path) {
      o.plan_path = a;
    } else {
      return host_fail(L, EXIT_USAGE, "unexpected argument '%s' (the plan is %s); see tycho --help", a, o.plan_path);
    }
  }
  if (!o.plan_path)
    return host_fail(L, EXIT_USAGE, "'rehearse' needs a plan file, e.g. tycho rehearse plans/llama2_7b.lua");
  if (o.n_sets > REHEARSE_MAX_SETS || o.n_faults > REHEARSE_MAX_FAULTS)
    return host_fail(L, EXIT_USAGE, "rehearse takes at most %d --set and %d --fault arguments (got %d and %d)",
                     REHEARSE_MAX_SETS, REHEARSE_MAX_FAULTS, o.n_sets, o.n_faults);
  char err[COMM_AGREE_MSG_MAX] = "";
  int code;
  if (worker) {
    quiet_error = comm_world()->rank != 0;
    code = rehearse_worker(&o, stdout, err, sizeof err);
  } else {
    char self[4096];
    code = rehearse_launch(&o, launch_self_path(self, sizeof self, argv[0]), err, sizeof err);
  }
  fflush(stdout);
  if (code && worker && !err[0])
    quiet_error = 1; /* the verdict: rank 0 has printed what failed */
  if (code)
    return host_fail(L, code, "%s", err[0] ? err : "the rehearsal failed");
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

static int cmd_repl(lua_State *L, int argc, char **argv)
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
  quiet_error = comm_world()->rank != 0;
  if (o.plan)
    repl_check_plan(L, o.plan, sets, o.n_sets, comm_world()->size, 1);
  char err[2048] = "";
  int code = repl_run(&o, err, sizeof err);
  fflush(stdout);
  if (code == 2 || (code && err[0]))
    return host_fail(L, code, "%s", err[0] ? err : "the session failed");
  exit_code = code;
  if (code && o.frontend)
    quiet_error = 1; /* the front-end's quit(code): it has shown why */
  if (code)
    return host_fail(L, code, "a chunk failed%s%s", err[0] ? ": " : "", err);
  return 0;
}

/* `tycho repl -n N` (or --ranks N, --launcher CMD): the front-end at the terminal, which starts
 * the ranks itself and never starts MPI here (main() asks before it would); and `tycho repl
 * --attach ADDR [--token FILE]`, the front-end of a running `tycho run --listen ADDR`. */
static int repl_frontend_form(int argc, char **argv)
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

static int cmd_repl_frontend(lua_State *L, int argc, char **argv)
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
  exit_code = code;
  if (err[0])
    return host_fail(L, code, "%s", err);
  if (code) {
    quiet_error = 1; /* said already, or the code of quit(code) */
    return host_fail(L, code, "the session ended with code %d", code);
  }
  return 0;
}

/* `tycho calibrate`: measures this machine (drive/calibrate.h); every rank runs it. Run by hand,
 * it starts one rank per online core through the launcher and waits. */
static int cmd_calibrate(lua_State *L, int argc, char **argv, int worker)
{
  const char *launcher = NULL;
  struct calibrate_options o = { 0 };
  const char **sets = lua_newuserdatauv(L, sizeof(char *) * (size_t)argc, 0);
  o.sets = sets;
  o.reps = 10;
  char command[2048] = "tycho";
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--worker") != 0)
      snprintf(command + strlen(command), sizeof command - strlen(command), " %s", argv[i]);
  o.command = command;
  const struct plan_opts po = { sets, &o.n_sets, &o.unsafe, &o.memory_limit, &o.instruction_limit };
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (plan_option(L, argc, argv, &i, &po)) {
      continue;
    } else if (strcmp(a, "--out") == 0) {
      if (!next)
        return host_fail(L, EXIT_USAGE, "--out needs a file, e.g. --out plans/clusters/local.lua");
      o.out = next;
      i++;
    } else if (strcmp(a, "--name") == 0) {
      if (!next || !*next)
        return host_fail(L, EXIT_USAGE, "--name needs the cluster's name");
      o.name = next;
      i++;
    } else if (strcmp(a, "--reps") == 0) {
      o.reps = (int)parse_count(L, "--reps", next, 1, 1000);
      i++;
    } else if (launch_option(L, argc, argv, &i, &launcher)) {
      continue;
    } else if (a[0] == '-' && a[1]) {
      return host_fail(L, EXIT_USAGE, "unknown option '%s' for 'calibrate'; see tycho --help", a);
    } else if (!o.plan) {
      o.plan = a;
    } else {
      return host_fail(L, EXIT_USAGE, "unexpected argument '%s' (the plan is %s); see tycho --help", a, o.plan);
    }
  }
  if (!o.out)
    return host_fail(L, EXIT_USAGE, "calibrate needs --out FILE, the cluster file to write (e.g. "
                     "plans/clusters/local.lua)");
  if (!o.plan)
    o.plan = "plans/tiny.lua";
  char err[COMM_AGREE_MSG_MAX + 64] = "";
  if (path_check_output("--out", o.out, err, sizeof err) == 2) /* before any rank starts measuring */
    return host_fail(L, EXIT_USAGE, "%s", err);
  if (!worker) { /* one rank per online core, started here */
    char self[4096];
    launch_self_path(self, sizeof self, argv[0]);
    const char **args = lua_newuserdatauv(L, sizeof(char *) * (size_t)(argc + 1), 0);
    int k = 0;
    for (int i = 1; i < argc; i++)
      if (strcmp(argv[i], "--launcher") == 0)
        i++;
      else
        args[k++] = argv[i];
    args[k++] = "--worker";
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double seconds;
    int code = launch_self(launcher ? launcher : launch_default(), cores > 0 ? (int)cores : 1, self, args, k,
                           &seconds, err, sizeof err);
    if (code < 0)
      return host_fail(L, EXIT_RUNTIME, "%s", err);
    if (code && err[0])
      return host_fail(L, code, "%s", err);
    if (code)
      quiet_error = 1; /* the ranks have said why */
    if (code)
      return host_fail(L, code, "calibrate failed");
    return 0;
  }
  quiet_error = comm_world()->rank != 0; /* calibrate_run's statuses are the same on every rank */
  int rc = calibrate_run(&o, stdout, err, sizeof err);
  if (rc)
    return host_fail(L, rc == 2 ? EXIT_USAGE : EXIT_RUNTIME, "%s", err);
  return 0;
}

/* The checkpoint `ckpt inspect|verify DIR` reads (DIR, or its newest step_N) looked at first: a
 * FIFO, a device or a folder as its manifest or one of its shard files is a usage error (exit 2)
 * naming it, never read nor waited on. −1 with the message; 0 otherwise (the reader reports
 * anything else). */
static int ckpt_manifest_special(const char *dir, char *err, size_t n)
{
  char file[4200], latest[4096], why[256];
  long long step;
  snprintf(file, sizeof file, "%s/manifest.json", dir);
  if (access(file, F_OK) && errno == ENOENT) {
    if (ckpt_find_latest(dir, latest, sizeof latest, &step, why, sizeof why))
      return 0;
    dir = latest;
  }
  return manifest_special_file(dir, err, n);
}

static int pmain(lua_State *L)
{
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  if (argc < 2)
    return host_fail(L, EXIT_USAGE, "no command given\n%s", usage_text());
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(usage_text(), stdout);
    return 0;
  }
  if (usage_asked(argc, argv) && usage_print_command(stdout, cmd) == 0) /* tycho COMMAND --help */
    return 0;
  if (strcmp(cmd, "--version") == 0) {
    printf("tycho %s (Lua %s.%s, %s kernels%s)\n", TYCHO_VERSION, LUA_VERSION_MAJOR, LUA_VERSION_MINOR,
           REAL_NAME, devices_cuda_built() ? ", with the CUDA backend" : "");
    return 0;
  }
  struct cli c = { 0 };
  if (strcmp(cmd, "check") == 0) {
    parse_args(L, argc, argv, &c);
    return cmd_check(L, &c);
  }
  if (strcmp(cmd, "tune") == 0) {
    parse_args(L, argc, argv, &c);
    return cmd_tune(L, &c);
  }
  if (strcmp(cmd, "run") == 0) {
    /* Every failure of `run` is the same on every rank (the arguments are, and the rest is
     * agreed over the ranks before it is raised), so rank 0 alone reports it. */
    quiet_error = comm_world()->rank != 0;
    parse_args(L, argc, argv, &c);
    return cmd_run(L, &c);
  }
  if (strcmp(cmd, "repl") == 0)
    return repl_frontend_form(argc, argv) ? cmd_repl_frontend(L, argc, argv) : cmd_repl(L, argc, argv);
  if (strcmp(cmd, "calibrate") == 0)
    return cmd_calibrate(L, argc, argv, mpi_worker(argc, argv, "calibrate"));
  if (strcmp(cmd, "rehearse") == 0)
    return cmd_rehearse(L, argc, argv, mpi_worker(argc, argv, "rehearse"));
  if (strcmp(cmd, "ckpt") == 0) {
    if (argc != 4 || (strcmp(argv[2], "inspect") && strcmp(argv[2], "verify")))
      return host_fail(L, EXIT_USAGE, "usage: tycho ckpt inspect|verify DIR");
    char err[1024];
    if (ckpt_manifest_special(argv[3], err, sizeof err))
      return host_fail(L, EXIT_USAGE, "%s", err);
    err_class_reset();
    int bad = strcmp(argv[2], "verify") == 0 ? ckpt_verify(argv[3], stdout, err, sizeof err)
                                              : ckpt_inspect(argv[3], stdout, err, sizeof err);
    if (bad) /* a bad manifest or shard: an input error (util/err.h) */
      return host_fail(L, err_class_is_input() ? EXIT_USAGE : EXIT_RUNTIME, "%s", err);
    return 0;
  }
  return host_fail(L, EXIT_USAGE, "unknown command '%s'; the commands are check, tune, run, repl, rehearse, calibrate and ckpt (tycho --help)", cmd);
}

int main(int argc, char **argv)
{
  /* The buffers a step allocates and frees — ZeRO-3's gathered units, gradient buckets,
   * reduce-scatter outputs — come back every step at the same sizes. glibc would hand blocks
   * from 128 KiB up back to the system at each free, so every step faulted in and zeroed fresh
   * pages; keeping blocks up to 32 MiB (glibc's largest mmap threshold on 64 bits) in the heap
   * lets the next step reuse them. Measured: dp 2 zero 3 of bench/plans/predict_10m.lua ~20%
   * faster (2,200-2,350 → 2,650-2,800 tokens/s), zero 0 within its noise. */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const int run = argc >= 2 && !usage_asked(argc, argv) && (strcmp(argv[1], "run") == 0 ||
                                (strcmp(argv[1], "repl") == 0 && !repl_frontend_form(argc, argv)) ||
                                mpi_worker(argc, argv, "calibrate") || mpi_worker(argc, argv, "rehearse"));
  int ranks_on_node = 1;
  if (run) {
    threads_exec_with_settings(argv);   /* before any thread exists */
    char err[1024];
    if (comm_backend_check(err, sizeof err)) {
      fprintf(stderr, "%s: %s\n", progname, err);
      return EXIT_USAGE;
    }
    if (comm_init(&argc, &argv, err, sizeof err)) {
      fprintf(stderr, "%s: cannot start the comm layer (MPI): %s\n", progname, err);
      return EXIT_RUNTIME;
    }
    ranks_on_node = comm_local_size();
  }
  const int threads = threads_per_rank(ranks_on_node);
  kernels_init_cpu(threads); /* worker threads inherit flush-to-zero */
  /* training (run, repl) follows the CPUs' load between steps; calibrate and rehearse keep theirs */
  if (argc >= 2 && (strcmp(argv[1], "run") == 0 || strcmp(argv[1], "repl") == 0))
    threads_adapt_start(threads, threads_adaptable());
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "%s: cannot create a Lua state: not enough memory\n", progname);
    return EXIT_RUNTIME;
  }
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  int status = lua_pcall(L, 2, 0, 0);
  int code = 0;
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    if (!quiet_error)
      fprintf(stderr, "%s: %s\n", progname, msg ? msg : "(error object is not a string)");
    code = exit_code;
  }
  lua_close(L);
  if (run) {
    char err[1024];
    fflush(stdout);
    if (comm_finalize(err, sizeof err)) {
      fprintf(stderr, "%s: %s\n", progname, err);
      code = code ? code : EXIT_RUNTIME;
    }
  }
  return code;
}
