/* main() for fuzz_plan.c where libFuzzer is unavailable (gcc; the ctest run): reads the seed
 * plans (the shipped plans/, tests/plans/good, bad and crash, plus a few built in here that
 * reach the sandbox's guards), compiles each, then feeds LLVMFuzzerTestOneInput deterministic
 * mutations of them: byte flips and replacements, Lua tokens and snippets inserted (deep tables,
 * metatables, patterns, loops, pcall, extend), lines deleted, duplicated and spliced in from
 * another seed, truncations. A per-input CPU-time limit turns a hang into a failure; the input that
 * crashed or hung is left in the file fuzz_plan names. Usage: fuzz_plan [iterations [seed]]. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *fuzz_plan_file(void);

#define MAX_SEEDS 256
#define MAX_INPUT 65536

struct seed { char *bytes; size_t n; };
static struct seed seeds[MAX_SEEDS];
static int n_seeds;

static void add_seed(const char *text, size_t n)
{
  if (n_seeds >= MAX_SEEDS || n >= MAX_INPUT / 2)
    return;
  seeds[n_seeds].bytes = malloc(n + 1);
  memcpy(seeds[n_seeds].bytes, text, n);
  seeds[n_seeds].bytes[n] = 0;
  seeds[n_seeds++].n = n;
}

static void add_dir(const char *dir)
{
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  char names[MAX_SEEDS][256];
  int k = 0;
  while ((e = readdir(d)) && k < MAX_SEEDS) {
    size_t len = strlen(e->d_name);
    if (len > 4 && len < 255 && strcmp(e->d_name + len - 4, ".lua") == 0)
      snprintf(names[k++], 256, "%s", e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)k, 256, (int (*)(const void *, const void *))strcmp); /* readdir order varies */
  for (int i = 0; i < k; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    FILE *f = fopen(path, "rb");
    if (!f)
      continue;
    char *buf = malloc(MAX_INPUT);
    size_t n = fread(buf, 1, MAX_INPUT - 1, f);
    fclose(f);
    add_seed(buf, n);
    free(buf);
  }
}

static const char *const builtin[] = {
  "local tycho = require \"tycho\"\nlocal base = require \"_base\"\nlocal t = {}\n"
  "for _ = 1, 9 do t = { x = t, y = { 1, 2 } } end\nreturn tycho.extend(base, { mesh = { tp = 2 }, deep = t })\n",
  "local tycho = require \"tycho\"\nlocal t = { name = \"x\" }\nt.self = t\nreturn tycho.extend(t, t)\n",
  "local tycho = require \"tycho\"\nlocal base = require \"_base\"\n"
  "return tycho.plan(setmetatable(tycho.extend(base, {}), { __index = function(_, k) error(k) end }))\n",
  "local tycho = require \"tycho\"\nlocal s = (\"a\"):rep(300)\nlocal x = s:find((\".-\"):rep(4) .. \"b\")\n"
  "local y = s:gsub(\"%a+\", \"b\")\nfor w in s:gmatch(\"[^,]*\") do end\nreturn require \"_base\"\n",
  "local tycho = require \"tycho\"\nwhile true do pcall(function() while true do end end) end\n",
  "local tycho = require \"tycho\"\nlocal base = require \"_base\"\n"
  "return tycho.extend(base, { stages = function(l) return l % 2 end, mesh = { pp = 2 },\n"
  "  recompute = function(l) return l > 1 and \"full\" or { \"attn\", \"mlp\" } end,\n"
  "  tp_split = function(l, m) return m == \"embed\" and \"vocab\" or nil end })\n",
  "local tycho = require \"tycho\"\nlocal m = require \"models.llama2\"\n"
  "return tycho.plan { model = m[\"7b\"], mesh = { tp = 2, pp = 2, dp = \"auto\" },\n"
  "  batch = { global = 16, micro = 1, seq = 128 }, optimizer = { lr = 3e-4 }, zero = 1 }\n",
};

static const char *const tokens[] = {
  "{", "}", "(", ")", "[", "]", "=", ",", ".", "..", ":", ";", "\"", "'", "[[", "]]", "--", "#",
  " nil", " true", " false", " 0", " -1", " 1e308", " 0/0", " math.huge", " -0.0", " 2^53",
  " 4294967297", " \"auto\"", " \"\"", " function() end", " end", " local x = ", " return ",
  " tycho.extend(", " tycho.plan ", " setmetatable({}, { __index = error })", " pcall(",
  " error(\"x\")", " while true do end ", " for i = 1, 1e9 do end ", " (\"x\"):rep(1e7)",
  " string.find((\"a\"):rep(500), (\".-\"):rep(8)..\"b\")", " getmetatable(\"\")", " rawset(_G, 'x', 1)",
  " os.execute", " string.dump", " require \"_base\"", " require \"models.llama2\"", " _ENV",
  " { { { { { { { { { { } } } } } } } } } }", " coroutine", " load(\"return 1\")", " select('#')",
  " \"\\0\"", " \"\\xff\"", " 9223372036854775807", " -9223372036854775808", " // 0", " % 0",
  " stages = { { 0 } }", " tp_split = function() return \"row\" end", " recompute = \"full\"",
  " seeds = { global = -1 }", " mesh = { tp = 3 }", " dp = \"auto\"", " n_layers = 1000",
};

#define FUZZ_RNG_STREAM 0x706c616eU /* "plan" */
#include "fuzz_rng.h"

/* The start of the line holding buf[at] and the index just past it (its '\n' included). */
static void line_around(const char *buf, size_t n, size_t at, size_t *start, size_t *end)
{
  size_t s = at, e = at;
  while (s > 0 && buf[s - 1] != '\n')
    s--;
  while (e < n && buf[e] != '\n')
    e++;
  if (e < n)
    e++;
  *start = s;
  *end = e;
}

static void insert(char *buf, size_t *n, size_t at, const char *text, size_t len)
{
  if (*n + len >= MAX_INPUT)
    return;
  memmove(buf + at + len, buf + at, *n - at);
  memcpy(buf + at, text, len);
  *n += len;
}

static void mutate(struct rng *r, char *buf, size_t *n)
{
  static const char bytes[] = "{}()[]=,.\"'-0123456789 \nabcdefxyz_#%^$*+?\\";
  size_t at = *n ? rng_below(r, (uint32_t)*n) : 0, s, e;
  switch (rng_below(r, 10)) {
  case 0: if (*n) buf[at] ^= (char)(1u << rng_below(r, 8)); break;
  case 1: if (*n) buf[at] = bytes[rng_below(r, sizeof bytes - 1)]; break;
  case 2: case 3: { /* a token */
    const char *t = tokens[rng_below(r, sizeof tokens / sizeof tokens[0])];
    insert(buf, n, at, t, strlen(t));
    break;
  }
  case 4: /* delete a line */
    if (*n) {
      line_around(buf, *n, at, &s, &e);
      memmove(buf + s, buf + e, *n - e);
      *n -= e - s;
    }
    break;
  case 5: /* duplicate a line */
    if (*n) {
      line_around(buf, *n, at, &s, &e);
      char line[4096];
      size_t len = e - s < sizeof line ? e - s : sizeof line;
      memcpy(line, buf + s, len);
      insert(buf, n, s, line, len);
    }
    break;
  case 6: { /* splice a line of another seed in */
    const struct seed *o = &seeds[rng_below(r, (uint32_t)n_seeds)];
    if (o->n) {
      line_around(buf, *n, at, &at, &e);
      line_around(o->bytes, o->n, rng_below(r, (uint32_t)o->n), &s, &e);
      insert(buf, n, at, o->bytes + s, e - s);
    }
    break;
  }
  case 7: /* delete a run */
    if (*n) {
      size_t k = 1 + rng_below(r, 12);
      if (k > *n - at) k = *n - at;
      memmove(buf + at, buf + at + k, *n - at - k);
      *n -= k;
    }
    break;
  case 8: /* a number changed */
    for (size_t i = at; i < *n; i++)
      if (buf[i] >= '0' && buf[i] <= '9') {
        static const char *const nums[] = { "0", "-1", "3", "65", "1e9", "2147483648", "0.5", "1e-300", "7" };
        const char *t = nums[rng_below(r, sizeof nums / sizeof nums[0])];
        buf[i] = t[0];
        insert(buf, n, i + 1, t + 1, strlen(t) - 1);
        break;
      }
    break;
  default: /* truncate */
    *n = rng_below(r, (uint32_t)*n + 1);
  }
}

/* A per-input limit of 20 s of CPU time (not wall time: a loaded machine does not make a hang). */
static void arm(int seconds)
{
  struct itimerval t = { { 0, 0 }, { seconds, 0 } };
  setitimer(ITIMER_PROF, &t, NULL);
}

static volatile long current = -1; /* the input being compiled: -1 - seed, or the iteration */

static void on_alarm(int sig)
{
  (void)sig;
  char msg[160];
  int n = snprintf(msg, sizeof msg, "fuzz_plan: input %ld ran for more than 20 s of CPU time (a hang); it is in %s\n",
                   current, fuzz_plan_file());
  if (write(2, msg, (size_t)n) < 0) {}
  abort();
}

/* fuzz_plan FILE...: compiles those inputs only (a crash's or a hang's, to reproduce it). */
static int run_files(int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) {
      perror(argv[i]);
      return 1;
    }
    char *buf = malloc(MAX_INPUT);
    size_t n = fread(buf, 1, MAX_INPUT, f);
    fclose(f);
    arm(20);
    LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
    free(buf);
    fprintf(stderr, "fuzz_plan: %s: no crash\n", argv[i]);
  }
  return 0;
}

int main(int argc, char **argv)
{
  if (argc > 1 && (argv[1][0] < '0' || argv[1][0] > '9')) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/plans/bad", TYCHO_SOURCE_DIR);
    setenv("TYCHO_PATH", path, 1);
    signal(SIGPROF, on_alarm);
    return run_files(argc, argv);
  }
  long iterations = argc > 1 ? atol(argv[1]) : 3000;
  uint64_t rng_seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 20261201;
  static const char *const dirs[] = { "plans", "tests/plans/good", "tests/plans/bad", "tests/plans/crash" };
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", TYCHO_SOURCE_DIR, dirs[i]);
    add_dir(dir);
  }
  for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
    add_seed(builtin[i], strlen(builtin[i]));
  if (n_seeds < 20) {
    fprintf(stderr, "fuzz_plan: only %d seeds found under %s\n", n_seeds, TYCHO_SOURCE_DIR);
    return 1;
  }
  char path[1200];
  snprintf(path, sizeof path, "%s/tests/plans/bad", TYCHO_SOURCE_DIR); /* require "_base" */
  setenv("TYCHO_PATH", path, 1);
  signal(SIGPROF, on_alarm);
  fprintf(stderr, "fuzz_plan: %d seeds; each input is written to %s\n", n_seeds, fuzz_plan_file());
  if (!getenv("FUZZ_PLAN_VERBOSE"))
    if (!freopen("/dev/null", "w", stdout)) {}
  for (int s = 0; s < n_seeds; s++) {
    current = -1 - s;
    arm(20);
    LLVMFuzzerTestOneInput((const uint8_t *)seeds[s].bytes, seeds[s].n);
  }
  char *work = malloc(MAX_INPUT);
  struct rng r = { rng_seed, 0, { 0 }, 0 };
  for (long it = 0; it < iterations; it++) {
    const struct seed *s = &seeds[rng_below(&r, (uint32_t)n_seeds)];
    size_t n = s->n;
    memcpy(work, s->bytes, n);
    int k = 1 + (int)rng_below(&r, 6);
    for (int m = 0; m < k; m++)
      mutate(&r, work, &n);
    char *input = malloc(n ? n : 1); /* exactly n bytes: overreads are caught */
    memcpy(input, work, n);
    current = it;
    arm(20);
    LLVMFuzzerTestOneInput((const uint8_t *)input, n);
    free(input);
  }
  arm(0);
  fprintf(stderr, "fuzz_plan: %d seeds and %ld mutated plans compiled, no crash, hang or leak\n", n_seeds, iterations);
  unlink(fuzz_plan_file());
  char dir[256];
  snprintf(dir, sizeof dir, "%s", fuzz_plan_file());
  *strrchr(dir, '/') = 0;
  rmdir(dir);
  free(work);
  for (int s = 0; s < n_seeds; s++)
    free(seeds[s].bytes);
  return 0;
}
