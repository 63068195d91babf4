/* Plan files for the compiler's tests (test_plan_compile.c, test_plan_moe.c): paths under the
 * source tree ($TYCHO_SOURCE_DIR, "." otherwise), plans written into a private temporary folder,
 * and compiling either with --set overrides. One copy per test program (static). */
#ifndef TYCHO_TEST_PLAN_FILES_H
#define TYCHO_TEST_PLAN_FILES_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "plan/compile.h"

static char source_dir[1024] = ".";
static char tmp_dir[256];

static void path_of(char *out, size_t n, const char *rel)
{
  snprintf(out, n, "%s/%s", source_dir, rel);
}

static int compile_with(const char *path, int world, const char *const *sets, int n_sets, struct plan *p,
                        char *err, size_t n)
{
  struct plan_compile_options opt = { 0 };
  opt.world = world;
  opt.sets = sets;
  opt.n_sets = n_sets;
  return plan_compile(path, &opt, p, err, n);
}

static void write_file(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

static const char *tmp_plan(const char *name, const char *text)
{
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
  write_file(path, text);
  return path;
}

/* main's start: the source folder from the environment and a fresh temporary folder named after
 * the program (0, or 1 when it cannot be made); plan_files_done removes it and passes rc on. */
static int plan_files_setup(const char *name)
{
  const char *src = getenv("TYCHO_SOURCE_DIR");
  if (src)
    snprintf(source_dir, sizeof source_dir, "%s", src);
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/tycho-test-%s-XXXXXX", name);
  if (!mkdtemp(tmp_dir)) {
    perror("mkdtemp");
    return 1;
  }
  return 0;
}

static int plan_files_done(int rc)
{
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", tmp_dir);
  return rc;
}

#endif
