/* Compiling a plan of the source tree for a test, as `tycho run` would: the file under
 * $TYCHO_SOURCE_DIR (ctest sets it; "." otherwise), for `world` ranks with the --set overrides.
 * A failure is a CHECK failure with the compiler's message. */
#ifndef TYCHO_TEST_PLAN_FIXTURE_H
#define TYCHO_TEST_PLAN_FIXTURE_H
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "plan/compile.h"

static inline int fixture_compile(const char *rel, int world, const char *const *sets, int n_sets, struct plan *p)
{
  const char *src = getenv("TYCHO_SOURCE_DIR");
  char path[1024], err[2048];
  snprintf(path, sizeof path, "%s/%s", src ? src : ".", rel);
  struct plan_compile_options opt = { world, 0, 0, 0, n_sets, sets };
  plan_init(p);
  int rc = plan_compile(path, &opt, p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  return rc;
}

#endif
