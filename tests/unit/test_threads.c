/* The thread count per rank (runtime/train/threads.h): OMP_NUM_THREADS overrides; else the
 * fewest of the affinity mask's CPUs (divided among the node's ranks only where they share the
 * mask), the cgroup quota's share and SLURM_CPUS_PER_TASK; and the reason the run's header shows.
 * The cgroup files are written into a folder of the test's own. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "runtime/train/threads.h"

static void the_sources_combine_into_one_count_and_its_reason(void)
{
  static const struct {
    struct threads_given g;
    int n;
    const char *why;
  } cases[] = {
    /* omp_env, mask, shared, quota, slurm, online, ranks */
    {{0, 2, 1, 0, 0, 2, 1}, 2, "affinity mask: 2 CPUs"},
    {{0, 1, 1, 0, 0, 2, 1}, 1, "affinity mask: 1 CPU"},                    /* taskset -c 0 */
    {{4, 1, 1, 0, 0, 2, 1}, 4, "OMP_NUM_THREADS=4, an explicit override"}, /* the user's word */
    {{1, 16, 1, 2, 3, 16, 4}, 1, "OMP_NUM_THREADS=1, an explicit override"},
    {{0, 16, 1, 0, 0, 16, 4}, 4, "affinity mask: 16 CPUs shared by 4 ranks on the node"},
    {{0, 2, 1, 0, 0, 2, 4}, 1, "affinity mask: 2 CPUs shared by 4 ranks on the node"}, /* at least 1 */
    {{0, 4, 0, 0, 0, 16, 4}, 4, "affinity mask: 4 CPUs bound to this rank"}, /* Open MPI's binding */
    {{0, 1, 0, 0, 0, 2, 2}, 1, "affinity mask: 1 CPU bound to this rank"},
    {{0, 0, 0, 0, 0, 8, 1}, 8, "8 online CPUs"},                            /* no mask known */
    {{0, 0, 0, 0, 0, 8, 2}, 4, "8 online CPUs shared by 2 ranks on the node"},
    {{0, 16, 1, 2.5, 0, 16, 1}, 2, "cgroup CPU quota: 2.5 CPUs"},           /* a container's cpu.max */
    {{0, 16, 1, 0.5, 0, 16, 1}, 1, "cgroup CPU quota: 0.5 CPUs"},
    {{0, 16, 1, 1, 0, 16, 1}, 1, "cgroup CPU quota: 1 CPU"},
    {{0, 16, 1, 8, 0, 16, 2}, 4, "cgroup CPU quota: 8 CPUs shared by 2 ranks on the node"},
    {{0, 16, 1, 32, 0, 16, 1}, 16, "affinity mask: 16 CPUs"},               /* a quota above the mask */
    {{0, 4, 0, 8, 0, 16, 4}, 2, "cgroup CPU quota: 8 CPUs shared by 4 ranks on the node"},
    {{0, 16, 1, 0, 3, 16, 1}, 3, "SLURM_CPUS_PER_TASK=3"},                 /* --cpus-per-task */
    {{0, 16, 1, 0, 3, 16, 4}, 3, "SLURM_CPUS_PER_TASK=3"},                 /* per task: not divided */
    {{0, 2, 0, 0, 4, 16, 2}, 2, "affinity mask: 2 CPUs bound to this rank"}, /* Slurm's binding is narrower */
    {{0, 16, 1, 2, 3, 16, 1}, 2, "cgroup CPU quota: 2 CPUs"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char why[160] = "";
    int n = threads_decide(&cases[i].g, why, sizeof why);
    CHECK_MSG(n == cases[i].n && strcmp(why, cases[i].why) == 0, "case %zu: %d (%s), expected %d (%s)", i, n,
              why, cases[i].n, cases[i].why);
  }
}

static char root[64];

static void write_file(const char *rel, const char *text)
{
  char path[256];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  /* the folders on the way */
  for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
  FILE *f = fopen(path, "w");
  CHECK_MSG(f != NULL, "cannot write %s", path);
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static void the_cgroup_quota_is_read_from_its_files(void)
{
  /* v2: the group's own cpu.max, its parent's (the smaller holds), "max" for none */
  write_file("a/b/cpu.max", "150000 100000\n");
  write_file("a/cpu.max", "max 100000\n");
  CHECK_NEAR(threads_cgroup_quota(root, "0::/a/b\n"), 1.5, 0);
  write_file("a/cpu.max", "100000 100000\n");
  CHECK_NEAR(threads_cgroup_quota(root, "0::/a/b\n"), 1.0, 0);
  write_file("a/b/cpu.max", "max 100000\n");
  write_file("a/cpu.max", "max 100000\n");
  CHECK(threads_cgroup_quota(root, "0::/a/b\n") == 0);
  /* a group path its mount does not show (a container's view): the root's own file */
  write_file("cpu.max", "400000 100000\n");
  CHECK_NEAR(threads_cgroup_quota(root, "0::/docker/abc\n"), 4.0, 0);
  /* hybrid: v2 under unified, v1's cpu controller under cpu,cpuacct (-1: no quota) */
  write_file("unified/c/cpu.max", "300000 100000\n");
  write_file("cpu,cpuacct/c/cpu.cfs_quota_us", "-1\n");
  write_file("cpu,cpuacct/c/cpu.cfs_period_us", "100000\n");
  CHECK_NEAR(threads_cgroup_quota(root, "4:memory:/c\n3:cpu,cpuacct:/c\n0::/c\n"), 3.0, 0);
  write_file("cpu,cpuacct/c/cpu.cfs_quota_us", "50000\n");
  CHECK_NEAR(threads_cgroup_quota(root, "4:memory:/c\n3:cpu,cpuacct:/c\n0::/c\n"), 0.5, 0);
  /* v1 alone, cpu mounted by itself; other controllers are not read */
  write_file("cpu/d/cpu.cfs_quota_us", "250000\n");
  write_file("cpu/d/cpu.cfs_period_us", "100000\n");
  CHECK_NEAR(threads_cgroup_quota(root, "2:cpuacct:/d\n1:cpu:/d\n"), 2.5, 0);
  CHECK(threads_cgroup_quota(root, "2:cpuacct:/d\n5:cpuset:/d\n") == 0);
  /* nothing to read */
  CHECK(threads_cgroup_quota(root, "") == 0);
  CHECK(threads_cgroup_quota(root, "garbage\n") == 0);
  char missing[128];
  snprintf(missing, sizeof missing, "%s/none", root);
  CHECK(threads_cgroup_quota(missing, "0::/a/b\n") == 0);
}

static void this_process_counts_from_its_mask_or_the_override(void)
{
  unsetenv("SLURM_CPUS_PER_TASK");
  setenv("OMP_NUM_THREADS", "3", 1);
  CHECK(threads_per_rank(1) == 3);
  CHECK(strcmp(threads_reason(), "OMP_NUM_THREADS=3, an explicit override") == 0);
  unsetenv("OMP_NUM_THREADS");
  int n = threads_count();
  CHECK(n >= 1);
  CHECK_STR_CONTAINS(threads_reason(), "affinity mask: ");
}

static void with_root(void (*fn)(void))
{
  strcpy(root, "/tmp/tycho-threads-XXXXXX");
  if (!mkdtemp(root)) {
    CHECK_MSG(0, "mkdtemp failed");
    return;
  }
  fn();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK(system(cmd) == 0);
}

static void cgroup_files(void) { with_root(the_cgroup_quota_is_read_from_its_files); }

TEST_MAIN(TEST(the_sources_combine_into_one_count_and_its_reason), TEST(cgroup_files),
          TEST(this_process_counts_from_its_mask_or_the_override))
