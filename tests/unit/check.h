/* A minimal test harness: CHECK records a failure with file:line and goes on; TEST_MAIN
 * runs the listed tests and ends with the line "N passed, N failed" (exit 1 on any failure, and
 * a test that ran no CHECK at all is a failure).
 *
 * Tolerances are argued, not fitted: each comparison says in a comment what it measures, its
 * bound and why that bound. Where the only error is the rounding of `real`, the bound is a
 * multiple of REAL_U, the unit roundoff of the build's type, so the float64 build (the proof
 * build, kernels/real.h) holds the same comparison 2^29 times tighter; where something else
 * sets the error (a finite-difference step, a file stored in fp32), TOL(fp32, float64) gives
 * the bound of each build. */
#ifndef TYCHO_TEST_CHECK_H
#define TYCHO_TEST_CHECK_H
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "real.h"

/* Unit roundoff of `real`: 2^-24 = 6.0e-8 (fp32), 2^-53 = 1.1e-16 (float64). */
#define REAL_U (REAL_IS_DOUBLE ? 0x1p-53 : 0x1p-24)
/* Unit roundoff of fp32, for what is fp32 in both builds (Philox draws, init, safetensors). */
#define FP32_U 0x1p-24
/* Unit roundoff of double, in which the tests compute their references (and the kernels some
 * sums): k roundings on each side of a comparison are bounded by k · (REAL_U + DOUBLE_U). */
#define DOUBLE_U 0x1p-53
/* The bound of this build: fp32 or float64. */
#define TOL(fp32, float64) (REAL_IS_DOUBLE ? (float64) : (fp32))

static int check_failures;
static int check_count;

#define CHECK(cond) do { check_count++; if (!(cond)) { check_failures++; \
  fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { check_count++; if (!(cond)) { check_failures++; \
  fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
  fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); check_count++; \
  if (!(fabs(a_ - b_) <= (tol))) { check_failures++; fprintf(stderr, \
  "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g, tol %.3g\n", __FILE__, __LINE__, \
  #a, a_, #b, b_, (double)(tol)); } } while (0)
#define CHECK_STR_CONTAINS(hay, needle) do { const char *h_ = (hay); check_count++; \
  if (!h_ || !strstr(h_, (needle))) { check_failures++; fprintf(stderr, \
  "%s:%d: expected \"%s\" in \"%s\"\n", __FILE__, __LINE__, (needle), h_ ? h_ : "(null)"); } } while (0)

typedef void (*test_fn)(void);
struct test_case { const char *name; test_fn fn; };
#define TEST(name) { #name, name }

/* A test passes when it ran at least one CHECK and none failed: a test that checks nothing
 * (an early return, a loop over nothing) proves nothing and fails. */
static inline int test_run_all(const struct test_case *tests, int n)
{
  int passed = 0, failed = 0;
  for (int i = 0; i < n; i++) {
    int before = check_failures, ran = check_count;
    tests[i].fn();
    if (check_count == ran) { failed++; printf("FAIL %s (ran no CHECK)\n", tests[i].name); }
    else if (check_failures == before) { passed++; printf("ok   %s\n", tests[i].name); }
    else { failed++; printf("FAIL %s\n", tests[i].name); }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
#define TEST_MAIN(...) int main(void) { \
  static const struct test_case tests_[] = { __VA_ARGS__ }; \
  return test_run_all(tests_, (int)(sizeof tests_ / sizeof tests_[0])); }
#endif
