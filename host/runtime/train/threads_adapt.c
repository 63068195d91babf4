/* Thread count that follows the CPUs' load (threads_adapt.h). */
#define _GNU_SOURCE /* sched_getaffinity and the CPU_* macros */
#include "runtime/train/threads_adapt.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { WINDOW_MS = 250, UP_VOTES = 2 };

int threads_adapt_decide(int max, int cpus, int n, double others, int *up_votes)
{
  if (max < 1) max = 1;
  if (others < 0.0) others = 0.0;
  double free_cpus = (double)cpus - others;
  int target = free_cpus < 1.0 ? 1 : (int)(free_cpus + 0.5);
  if (target > max) target = max;
  if (target < n) {
    *up_votes = 0;
    return target;
  }
  if (target > n) {
    if (++*up_votes >= UP_VOTES) {
      *up_votes = 0;
      return target;
    }
    return n;
  }
  *up_votes = 0;
  return n;
}

int threads_adapt_busy_ticks(const char *text, const int *cpus, int n_cpus, unsigned long long *ticks)
{
  static __thread unsigned char listed[CPU_SETSIZE];
  memset(listed, 0, sizeof listed);
  for (int i = 0; i < n_cpus; i++)
    if (cpus[i] >= 0 && cpus[i] < CPU_SETSIZE)
      listed[cpus[i]] = 1;
  int seen = 0;
  unsigned long long sum = 0;
  for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9')
      continue;
    char *end;
    long cpu = strtol(line + 3, &end, 10);
    if (cpu < 0 || cpu >= CPU_SETSIZE || !listed[cpu])
      continue;
    /* user nice system idle iowait irq softirq steal */
    unsigned long long f[8] = {0};
    const char *s = end;
    int got = 0;
    for (; got < 8; got++) {
      char *e;
      f[got] = strtoull(s, &e, 10);
      if (e == s)
        break;
      s = e;
    }
    if (got < 4)
      return -1;
    sum += f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
    seen++;
  }
  *ticks = sum;
  return seen == n_cpus ? 0 : -1;
}

static struct {
  int on, max, cpus, n, up_votes;
  int cpu_list[CPU_SETSIZE];
  double wall0, own0, tick_s;
  unsigned long long busy0;
} st;

/* CLOCK_MONOTONIC: the wall; CLOCK_PROCESS_CPUTIME_ID: this process's threads' CPU time */
static double seconds_on(clockid_t clock)
{
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int read_busy(unsigned long long *ticks)
{
  FILE *f = fopen("/proc/stat", "r");
  if (!f)
    return -1;
  /* the cpuN lines come first; 64 KiB holds over a thousand of them */
  static char text[65536];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return threads_adapt_busy_ticks(text, st.cpu_list, st.cpus, ticks);
}

int threads_adapt_start(int max, int enabled)
{
  memset(&st, 0, sizeof st);
  long hz = sysconf(_SC_CLK_TCK);
  cpu_set_t mask;
  if (!enabled || max < 2 || hz <= 0 || sched_getaffinity(0, sizeof mask, &mask) != 0)
    return 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &mask))
      st.cpu_list[st.cpus++] = c;
  st.tick_s = 1.0 / (double)hz;
  if (st.cpus < 2 || read_busy(&st.busy0) != 0)
    return 0;
  st.on = 1;
  st.max = st.n = max;
  st.wall0 = seconds_on(CLOCK_MONOTONIC);
  st.own0 = seconds_on(CLOCK_PROCESS_CPUTIME_ID);
  return 1;
}

int threads_adapt_on(void) { return st.on; }

int threads_adapt_cpus(void) { return st.on ? st.cpus : 0; }

int threads_adapt_tick(double *others)
{
  *others = -1.0;
  if (!st.on)
    return omp_get_max_threads();
  const double wall = seconds_on(CLOCK_MONOTONIC);
  if (wall - st.wall0 < WINDOW_MS * 1e-3)
    return st.n;
  unsigned long long busy;
  if (read_busy(&busy) != 0) {
    st.on = 0; /* the mask changed under us, or /proc went away: keep the count as it is */
    return st.n;
  }
  const double own = seconds_on(CLOCK_PROCESS_CPUTIME_ID);
  const double span = wall - st.wall0;
  double used = (double)(busy - st.busy0) * st.tick_s - (own - st.own0);
  *others = used > 0.0 ? used / span : 0.0;
  st.wall0 = wall;
  st.own0 = own;
  st.busy0 = busy;
  const int n = threads_adapt_decide(st.max, st.cpus, st.n, *others, &st.up_votes);
  if (n != st.n) {
    st.n = n;
    omp_set_num_threads(n);
  }
  return st.n;
}
