/* The thread count that follows the CPUs' load (runtime/train/threads_adapt.h): the decision from
 * what other processes used of the rank's CPUs, and the busy time read from /proc/stat's text. */
#include <string.h>

#include "check.h"
#include "runtime/train/threads_adapt.h"

static void fewer_at_once_more_after_two_windows(void)
{
  int votes = 0;
  /* quiet: keep all */
  CHECK(threads_adapt_decide(2, 2, 2, 0.0, &votes) == 2);
  CHECK(threads_adapt_decide(2, 2, 2, 0.4, &votes) == 2); /* 1.6 CPUs free rounds to 2 */
  /* one busy process beside two spinning threads gets ~2/3 of a CPU: 1.33 free → 1, at once */
  CHECK(threads_adapt_decide(2, 2, 2, 0.67, &votes) == 1);
  /* with one thread the busy process holds its whole CPU: stay */
  CHECK(threads_adapt_decide(2, 2, 1, 1.0, &votes) == 1);
  CHECK(threads_adapt_decide(2, 2, 1, 1.33, &votes) == 1);
  /* two busy processes: never below one */
  CHECK(threads_adapt_decide(2, 2, 1, 1.9, &votes) == 1);
  CHECK(threads_adapt_decide(2, 2, 2, 5.0, &votes) == 1);
  /* free again: the first window asks, the second takes */
  votes = 0;
  CHECK(threads_adapt_decide(2, 2, 1, 0.05, &votes) == 1);
  CHECK(votes == 1);
  CHECK(threads_adapt_decide(2, 2, 1, 0.0, &votes) == 2);
  CHECK(votes == 0);
  /* a busy window between resets the count */
  CHECK(threads_adapt_decide(2, 2, 1, 0.0, &votes) == 1);
  CHECK(threads_adapt_decide(2, 2, 1, 1.0, &votes) == 1);
  CHECK(votes == 0);
  CHECK(threads_adapt_decide(2, 2, 1, 0.0, &votes) == 1);
  /* a mask wider than the count (a cgroup quota, Slurm's CPUs): never above max */
  votes = 0;
  CHECK(threads_adapt_decide(4, 16, 4, 2.0, &votes) == 4);
  CHECK(threads_adapt_decide(4, 16, 4, 13.0, &votes) == 3);
  CHECK(threads_adapt_decide(8, 8, 8, 3.2, &votes) == 5);
  /* negative (tick noise) counts as none */
  CHECK(threads_adapt_decide(2, 2, 2, -0.2, &votes) == 2);
}

static void busy_ticks_sum_the_masks_cpus(void)
{
  const char *text =
      "cpu  100 1 50 9000 4 0 6 2 0 0\n"
      "cpu0 10 1 5 900 1 2 3 4 0 0\n"
      "cpu1 20 0 10 800 0 0 0 0 0 0\n"
      "cpu3 1000 0 0 0 0 0 0 0 0 0\n"
      "intr 1 2 3\n"
      "ctxt 5\n";
  unsigned long long t = 0;
  const int both[] = {0, 1}, first[] = {0}, third[] = {3}, missing[] = {0, 2};
  CHECK(threads_adapt_busy_ticks(text, both, 2, &t) == 0);
  /* user nice system irq softirq steal; not idle (900, 800) nor iowait (1) */
  CHECK(t == (10 + 1 + 5 + 2 + 3 + 4) + (20 + 10));
  CHECK(threads_adapt_busy_ticks(text, first, 1, &t) == 0);
  CHECK(t == 25);
  CHECK(threads_adapt_busy_ticks(text, third, 1, &t) == 0);
  CHECK(t == 1000);
  /* a CPU of the mask without a line: not measurable */
  CHECK(threads_adapt_busy_ticks(text, missing, 2, &t) == -1);
  /* an old kernel's four fields */
  CHECK(threads_adapt_busy_ticks("cpu0 7 1 2 90\n", first, 1, &t) == 0);
  CHECK(t == 10);
  CHECK(threads_adapt_busy_ticks("cpu0 7\n", first, 1, &t) == -1);
  CHECK(threads_adapt_busy_ticks("", first, 1, &t) == -1);
}

static void off_where_the_count_is_fixed(void)
{
  double others;
  CHECK(threads_adapt_start(1, 1) == 0); /* one thread: nothing to take away */
  CHECK(threads_adapt_start(4, 0) == 0); /* OMP_NUM_THREADS, or a mask shared by ranks */
  CHECK(!threads_adapt_on());
  CHECK(threads_adapt_cpus() == 0);
  threads_adapt_tick(&others);
  CHECK(others < 0);
}

TEST_MAIN(TEST(fewer_at_once_more_after_two_windows), TEST(busy_ticks_sum_the_masks_cpus),
          TEST(off_where_the_count_is_fixed))
