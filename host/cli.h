/* The command line's shared part: the parsed options of the commands that compile one plan
 * (struct cli), the error every command raises (host_fail: pmain's caller reports it, with its
 * exit code), the strict parsers of option values, and the plan compiled into a Lua-owned
 * userdata. host/main.c dispatches to the commands, each in the file beside what it drives:
 * cmd_check.c (check, tune), cmd_run.c (run, repl), cmd_drive.c (rehearse, calibrate). */
#ifndef TYCHO_CLI_H
#define TYCHO_CLI_H
#include <lua.h>
#include <stddef.h>

#include "plan/cluster.h"
#include "plan/plan.h"

#define EXIT_USAGE 2
#define EXIT_RUNTIME 1

/* The error being raised: its exit code, and whether this rank stays quiet because rank 0
 * reports it (the same error on every rank). */
extern int host_exit_code;
extern int host_quiet_error;

struct cli {
  const char *command;
  const char *plan;
  const char *cluster, *out;
  const char *listen; /* run --listen ADDR: the attachable REPL, or NULL */
  int listen_public;  /* run --listen-public: ADDR may be reachable from other machines */
  int world, json, unsafe, top;
  int sbatch, cpus_per_task; /* check --sbatch [--cpus-per-task N] */
  const char *svg;           /* check --svg FILE: the step and memory drawn, or NULL */
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

/* Raises an error that pmain's caller reports; `code` becomes the exit code. The message is
 * formatted by vsnprintf (C's formats: %lld, %.0f, %.*s; lua_pushfstring knows few of them). */
int host_fail(lua_State *L, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Parses `value` as a decimal integer in [min, max], strictly; anything else is a usage error
 * (exit 2) naming the option, the value and the range. */
long long parse_count(lua_State *L, const char *opt, const char *value, long long min, long long max);

/* A --set argument checked for empty path components (exit 2); returns it. */
const char *check_set(lua_State *L, const char *set);

/* The options of every command that compiles a plan: --set (and --set=), --unsafe, --max-memory,
 * --max-instructions. When argv[*i] is one of them, stores it (a --set in sets[*n_sets]), moves
 * *i past its value and returns 1; otherwise 0. */
struct plan_opts {
  const char **sets;
  int *n_sets, *unsafe;
  size_t *memory_limit;
  long long *instruction_limit;
};
int plan_option(lua_State *L, int argc, char **argv, int *i, const struct plan_opts *o);

/* --launcher CMD and --worker (rehearse, calibrate); 1 when argv[*i] is one of them. */
int launch_option(lua_State *L, int argc, char **argv, int *i, const char **launcher);

/* The arguments of check, tune and run into *c; a bad one raises (exit 2). */
void parse_args(lua_State *L, int argc, char **argv, struct cli *c);

/* Compiles the plan into a userdata left on the stack; 0 ok, else -1 with the message in err. */
int compile_plan(lua_State *L, const struct cli *c, int world, struct plan **out, char *err, size_t err_size);
/* The same, a plan error raised with exit code 2. */
struct plan *compile_or_fail(lua_State *L, const struct cli *c, int world);
/* The --cluster file, or NULL; a bad file is a usage error (exit 2). */
const struct cluster *load_cluster(lua_State *L, const struct cli *c);

/* Agrees over the world on a status (0 ok) and message; on failure raises the agreed error on
 * every rank, reported by rank 0 only. */
void agree_or_fail(lua_State *L, int code, const char *prefix, const char *err);

/* 1 when `command` (rehearse, calibrate) runs as a worker under MPI rather than as the launcher. */
int mpi_worker(int argc, char **argv, const char *command);

/* The commands (each raises through host_fail; 0 when done). */
int cmd_check(lua_State *L, const struct cli *c);
int cmd_tune(lua_State *L, const struct cli *c);
int cmd_run(lua_State *L, const struct cli *c);
int cmd_repl(lua_State *L, int argc, char **argv);
int cmd_repl_frontend(lua_State *L, int argc, char **argv);
/* 1 when `tycho repl ...` is the front-end form (-n N, --attach ADDR), which starts no MPI. */
int repl_frontend_form(int argc, char **argv);
int cmd_rehearse(lua_State *L, int argc, char **argv, int worker);
int cmd_calibrate(lua_State *L, int argc, char **argv, int worker);
/* `tycho generate` (cmd_generate.c): one rank, no MPI. */
int cmd_generate(lua_State *L, int argc, char **argv);
/* Gives t:generate the tokenizers for text prompts (tycho_runtime_set_text_codec). */
void generate_set_text_codec(void);
/* `tycho tokenize` (cmd_tokenize.c): text through a Hugging Face tokenizer into a token file. */
int cmd_tokenize(lua_State *L, int argc, char **argv);

#endif
