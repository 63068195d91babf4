/* `tycho rehearse` (the plan's exact layout, shrunk, on CPU ranks) and `tycho calibrate` (this
 * machine measured into a cluster file): the commands that run the trainer to judge a plan or a
 * machine (host/drive/). Run by hand each is the launcher, which starts its ranks; as a worker it
 * runs under MPI. */
#define _POSIX_C_SOURCE 200809L /* sysconf */
#include <lua.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "comm/comm.h"
#include "drive/calibrate.h"
#include "drive/rehearse.h"
#include "util/launch.h"
#include "util/path.h"

int cmd_rehearse(lua_State *L, int argc, char **argv, int worker)
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
    host_quiet_error = comm_world()->rank != 0;
    code = rehearse_worker(&o, stdout, err, sizeof err);
  } else {
    char self[4096];
    code = rehearse_launch(&o, launch_self_path(self, sizeof self, argv[0]), err, sizeof err);
  }
  fflush(stdout);
  if (code && worker && !err[0])
    host_quiet_error = 1; /* the verdict: rank 0 has printed what failed */
  if (code)
    return host_fail(L, code, "%s", err[0] ? err : "the rehearsal failed");
  return 0;
}

/* `tycho calibrate`: measures this machine (drive/calibrate.h); every rank runs it. Run by hand,
 * it starts one rank per online core through the launcher and waits. */
int cmd_calibrate(lua_State *L, int argc, char **argv, int worker)
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
      host_quiet_error = 1; /* the ranks have said why */
    if (code)
      return host_fail(L, code, "calibrate failed");
    return 0;
  }
  host_quiet_error = comm_world()->rank != 0; /* calibrate_run's statuses are the same on every rank */
  int rc = calibrate_run(&o, stdout, err, sizeof err);
  if (rc)
    return host_fail(L, rc == 2 ? EXIT_USAGE : EXIT_RUNTIME, "%s", err);
  return 0;
}
