/* The harness fails what proves nothing: test_run_all (check.h) fails a test that ran no CHECK,
 * as it fails one whose CHECK failed, and passes one whose CHECKs held. The inner runs print
 * their own ok/FAIL lines; this binary's verdict is the outer table's. */
#include "check.h"

static void checks_and_holds(void) { CHECK(1 + 1 == 2); }
static void checks_nothing(void) {}
static void check_fails(void) { CHECK(1 + 1 == 3); }

static void a_test_without_a_check_fails(void)
{
  /* Run the inner tables on counters of their own, then restore and judge. */
  const int failures = check_failures, count = check_count;
  static const struct test_case good[] = { TEST(checks_and_holds) };
  static const struct test_case empty[] = { TEST(checks_and_holds), TEST(checks_nothing) };
  static const struct test_case bad[] = { TEST(check_fails) };
  printf("-- inner runs (the FAIL lines below are expected):\n");
  const int rc_good = test_run_all(good, 1), rc_empty = test_run_all(empty, 2), rc_bad = test_run_all(bad, 1);
  printf("-- end of inner runs\n");
  check_failures = failures;
  check_count = count;
  CHECK(rc_good == 0);
  CHECK(rc_empty == 1);
  CHECK(rc_bad == 1);
}

TEST_MAIN(TEST(a_test_without_a_check_fails))
