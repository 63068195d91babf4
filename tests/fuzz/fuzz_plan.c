/* libFuzzer target for the plan compiler: any byte string is written to a plan file and compiled
 * in the sandbox (plan_compile), with small limits so an input that loops or hogs memory ends
 * fast. A compile may fail, with a one-line message, but must never crash, hang, leak, read or
 * write out of bounds (ASan), hit undefined behaviour (UBSan) or panic Lua (abort).
 * With clang, by hand:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Ihost -Ibindings -Ikernels \
 *     -DTYCHO_VERSION='"fuzz"' -DTYCHO_PLANS_DIR='"'$PWD/plans'"' tests/fuzz/fuzz_plan.c \
 *     host/plan/compile*.c host/plan/plan.c host/plan/plan_validate.c host/lua/sandbox*.c \
 *     host/lua/srcmap.c host/lua/tycho_module.c $(pkg-config --cflags --libs lua5.4) -lm -o fuzz_plan
 *   TYCHO_PATH=$PWD/tests/plans/bad ./fuzz_plan -max_len=4096 corpus/
 * With gcc, fuzz_plan_driver.c supplies main() and the inputs (the ctest run). */
#define _POSIX_C_SOURCE 200809L
#include "plan/compile.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char plan_path[256];

/* The folder the inputs are written in (once); the file there is the last input tried. */
const char *fuzz_plan_file(void);
const char *fuzz_plan_file(void)
{
  if (!plan_path[0]) {
    char dir[] = "/tmp/fuzz_plan.XXXXXX";
    if (!mkdtemp(dir))
      abort();
    snprintf(plan_path, sizeof plan_path, "%s/plan.lua", dir);
  }
  return plan_path;
}

static void require(int cond, const char *what, const char *err)
{
  if (!cond) {
    fprintf(stderr, "fuzz_plan: %s (message: \"%s\"); the input is %s\n", what, err, plan_path);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const char *path = fuzz_plan_file();
  FILE *f = fopen(path, "wb");
  if (!f)
    abort();
  if (size && fwrite(data, 1, size, f) != size)
    abort();
  fclose(f);
  static const char *const sets[] = { "mesh.tp=2", "batch.micro=1" };
  struct plan_compile_options opt = { 4, 0, 64u << 20, 2000000, size % 3 == 0 ? 2 : 0, sets };
  struct plan p;
  char err[1024];
  err[0] = 0;
  if (plan_compile(path, &opt, &p, err, sizeof err) == 0) {
    require(p.model.n_layers > 0 && p.layers != NULL, "a compiled plan without layers", err);
    plan_free(&p);
  } else {
    require(err[0] != 0, "a refused plan without a message", err); /* (a message may quote the
      plan's text, any text: Lua's "unfinished string near ..."; nothing more is required of it) */
  }
  return 0;
}
