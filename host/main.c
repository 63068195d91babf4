/* tycho: the command line. Shaped like Lua's own lua.c: main() only creates a Lua state and
 * calls pmain under lua_pcall, so every failure, even during start-up, reaches one report
 * path: "tycho: <cause>" on stderr, detail after, and the exit code (0 ok, 1 runtime
 * failure, 2 usage or plan error). `run` starts the comm layer first (MPI: a world of one
 * without mpirun); its failures are agreed by every rank, so rank 0 alone reports them and
 * every rank exits with the same code. The commands themselves are beside it: cmd_check.c
 * (check, tune), cmd_run.c (run, repl), cmd_drive.c (rehearse, calibrate), cmd_generate.c
 * (generate), on the helpers of cli.c. */
#define _POSIX_C_SOURCE 200809L /* access */
#include <lauxlib.h>
#include <lua.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "comm/comm.h"
#include "kernels.h"
#include "runtime/state/ckpt.h"
#include "runtime/state/manifest.h"
#include "runtime/train/threads.h"
#include "runtime/train/threads_adapt.h"
#include "util/devices.h"
#include "util/err.h"
#include "usage.h"

static const char *const progname = "tycho";

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
    host_quiet_error = comm_world()->rank != 0;
    parse_args(L, argc, argv, &c);
    return cmd_run(L, &c);
  }
  if (strcmp(cmd, "repl") == 0)
    return repl_frontend_form(argc, argv) ? cmd_repl_frontend(L, argc, argv) : cmd_repl(L, argc, argv);
  if (strcmp(cmd, "calibrate") == 0)
    return cmd_calibrate(L, argc, argv, mpi_worker(argc, argv, "calibrate"));
  if (strcmp(cmd, "rehearse") == 0)
    return cmd_rehearse(L, argc, argv, mpi_worker(argc, argv, "rehearse"));
  if (strcmp(cmd, "generate") == 0)
    return cmd_generate(L, argc, argv);
  if (strcmp(cmd, "tokenize") == 0)
    return cmd_tokenize(L, argc, argv);
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
  return host_fail(L, EXIT_USAGE, "unknown command '%s'; the commands are check, tune, run, repl, rehearse, calibrate, generate, tokenize and ckpt (tycho --help)", cmd);
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
  generate_set_text_codec(); /* t:generate's text prompts: the tokenizers are above the bindings */
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
    if (!host_quiet_error)
      fprintf(stderr, "%s: %s\n", progname, msg ? msg : "(error object is not a string)");
    code = host_exit_code;
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
