/* Thread count and thread-library environment (threads.h). */
#define _GNU_SOURCE /* sched_getaffinity and the CPU_* macros */
#include "runtime/train/threads.h"


#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A positive count from the environment, else 0 (strtol's prefix: "4,2", OpenMP's nested list,
 * gives 4 as before). */
static int env_count(const char *name)
{
  const char *env = getenv(name);
  if (env && *env) {
    char *end;
    long n = strtol(env, &end, 10);
    if (n > 0 && n <= 4096)
      return (int)n;
  }
  return 0;
}

/* How many rounds libgomp's idle threads spin before they sleep (GOMP_SPINCOUNT), where nothing
 * in the environment says. Measured on 2 cores (host/runtime/README.md, "Threads"): alone, 30,000
 * rounds (well under a millisecond) run plans/tiny.lua and bench_train's dim-256 model as fast as
 * spinning without end (OMP_WAIT_POLICY=active), where 300 rounds were 23% and 10% slower (a
 * thread that sleeps between two regions of a step pays a wake-up at the next). Beside other work
 * a long spin would hold the core a descheduled partner needs; there the thread count falls to
 * what the CPUs have free (threads_adapt.h), and one thread has no partner to wait for. */
#define THREADS_SPINCOUNT "30000"

static const char *plural(long n) { return n == 1 ? "" : "s"; }

int threads_decide(const struct threads_given *g, char *why, size_t why_size)
{
  if (g->omp_env > 0) {
    snprintf(why, why_size, "OMP_NUM_THREADS=%d, an explicit override", g->omp_env);
    return g->omp_env;
  }
  const int ranks = g->ranks_on_node > 1 ? g->ranks_on_node : 1;
  int n;
  if (g->mask_cpus > 0) {
    const int shared = g->mask_shared && ranks > 1;
    n = shared ? g->mask_cpus / ranks : g->mask_cpus;
    if (shared)
      snprintf(why, why_size, "affinity mask: %d CPU%s shared by %d ranks on the node", g->mask_cpus,
               plural(g->mask_cpus), ranks);
    else
      snprintf(why, why_size, "affinity mask: %d CPU%s%s", g->mask_cpus, plural(g->mask_cpus),
               ranks > 1 ? " bound to this rank" : "");
  } else {
    const int online = g->online_cpus > 0 ? g->online_cpus : 1;
    n = online / ranks;
    if (ranks > 1)
      snprintf(why, why_size, "%d online CPU%s shared by %d ranks on the node", online, plural(online), ranks);
    else
      snprintf(why, why_size, "%d online CPU%s", online, plural(online));
  }
  if (n < 1)
    n = 1;
  /* the quota is the cgroup's, and the node's ranks run in the same cgroup */
  if (g->quota_cpus > 0) {
    int q = (int)floor(g->quota_cpus / ranks);
    if (q < 1)
      q = 1;
    if (q < n) {
      n = q;
      if (ranks > 1)
        snprintf(why, why_size, "cgroup CPU quota: %g CPUs shared by %d ranks on the node", g->quota_cpus, ranks);
      else
        snprintf(why, why_size, "cgroup CPU quota: %g CPU%s", g->quota_cpus, g->quota_cpus == 1 ? "" : "s");
    }
  }
  if (g->slurm_cpus > 0 && g->slurm_cpus < n) {
    n = g->slurm_cpus;
    snprintf(why, why_size, "SLURM_CPUS_PER_TASK=%d", g->slurm_cpus);
  }
  return n;
}

/* The quota in CPUs of one cgroup folder, 0 when none is set or readable. */
static double quota_v2(const char *dir)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/cpu.max", dir);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  char quota[32];
  long long period = 0;
  int got = fscanf(f, "%31s %lld", quota, &period);
  fclose(f);
  if (got != 2 || period <= 0 || strcmp(quota, "max") == 0)
    return 0;
  long long q = strtoll(quota, NULL, 10);
  return q > 0 ? (double)q / (double)period : 0;
}

static double quota_v1(const char *dir)
{
  char path[4096];
  long long quota = 0, period = 0;
  snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  int got = fscanf(f, "%lld", &quota);
  fclose(f);
  snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
  if (got != 1 || quota <= 0 || !(f = fopen(path, "r")))
    return 0; /* -1: no quota */
  got = fscanf(f, "%lld", &period);
  fclose(f);
  return got == 1 && period > 0 ? (double)quota / (double)period : 0;
}

/* The smallest quota of base/group and its ancestors up to base. A limit on any ancestor holds
 * for its children; inside a container the group's path may name folders its mount does not
 * show, which are skipped. */
static double quota_walk(const char *base, const char *group, double (*read)(const char *), double best)
{
  char dir[4096];
  int n = snprintf(dir, sizeof dir, "%s%s", base, group);
  if (n < 0 || (size_t)n >= sizeof dir)
    return best;
  const size_t base_len = strlen(base);
  for (;;) {
    size_t len = strlen(dir);
    while (len > base_len && dir[len - 1] == '/')
      dir[--len] = '\0';
    double q = read(dir);
    if (q > 0 && (best == 0 || q < best))
      best = q;
    char *slash = strrchr(dir, '/');
    if (len <= base_len || !slash || (size_t)(slash - dir) < base_len)
      break;
    *slash = '\0';
  }
  return best;
}

double threads_cgroup_quota(const char *root, const char *text)
{
  double best = 0;
  char base[4096];
  for (const char *line = text; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[4096];
    if (len < sizeof buf) {
      memcpy(buf, line, len);
      buf[len] = '\0';
      /* "ID:CONTROLLERS:PATH"; v2's line is "0::PATH" */
      char *c1 = strchr(buf, ':');
      char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
      if (c2 && c2[1] == '/') {
        *c2 = '\0';
        const char *controllers = c1 + 1, *group = c2 + 1;
        if (*controllers == '\0') { /* v2, mounted at root (pure v2) or root/unified (hybrid) */
          best = quota_walk(root, group, quota_v2, best);
          snprintf(base, sizeof base, "%s/unified", root);
          best = quota_walk(base, group, quota_v2, best);
        } else {
          char list[256];
          snprintf(list, sizeof list, ",%s,", controllers);
          if (strstr(list, ",cpu,")) { /* v1: mounted as cpu or cpu,cpuacct (or both) */
            snprintf(base, sizeof base, "%s/%s", root, controllers);
            best = quota_walk(base, group, quota_v1, best);
            if (strcmp(controllers, "cpu") != 0) {
              snprintf(base, sizeof base, "%s/cpu", root);
              best = quota_walk(base, group, quota_v1, best);
            }
          }
        }
      }
    }
    line = end ? end + 1 : NULL;
  }
  return best;
}

static char reason[160];
static int adaptable;

const char *threads_reason(void) { return reason; }

int threads_adaptable(void) { return adaptable; }

int threads_count(void)
{
  return threads_per_rank(1);
}

int threads_per_rank(int ranks_on_node)
{
  struct threads_given g = {.omp_env = env_count("OMP_NUM_THREADS"),
                            .slurm_cpus = env_count("SLURM_CPUS_PER_TASK"),
                            .ranks_on_node = ranks_on_node};
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  g.online_cpus = online > 0 && online < 1 << 20 ? (int)online : 1;
  cpu_set_t own, parent;
  if (sched_getaffinity(0, sizeof own, &own) == 0) {
    g.mask_cpus = CPU_COUNT(&own);
    /* A launcher that binds its ranks narrows each one's mask below its own; one that does not
     * passes its mask on, which the ranks then share. Where the parent's cannot be read (it has
     * gone), count the mask as shared: fewer threads rather than ranks fighting for CPUs. */
    g.mask_shared = !(sched_getaffinity(getppid(), sizeof parent, &parent) == 0 && !CPU_EQUAL(&own, &parent));
  }
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (f) {
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    g.quota_cpus = threads_cgroup_quota("/sys/fs/cgroup", text);
  }
  /* by hand, or ranks sharing one mask (each would count the others' threads as other work) */
  adaptable = g.omp_env == 0 && !(g.mask_shared && ranks_on_node > 1);
  return threads_decide(&g, reason, sizeof reason);
}

void threads_exec_with_settings(char **argv)
{
  if (getenv("TYCHO_THREAD_SETTINGS"))
    return; /* already re-executed, or the user opted out */
  int changed = 0;
  /* OpenBLAS runs on one thread (kernels_init_cpu), so OpenMP's is the only pool in either build */
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
    changed |= setenv("GOMP_SPINCOUNT", THREADS_SPINCOUNT, 1) == 0;
  if (!getenv("OPENBLAS_NUM_THREADS"))
    changed |= setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0;
  if (changed && setenv("TYCHO_THREAD_SETTINGS", "1", 1) == 0)
    execv("/proc/self/exe", argv);
}
