/* How collectives on model memory travel (runtime/parallel/dcomm.h, dcomm_choose): the plan's
 * comm against what the kernel table's memory is, whether the build has NCCL and how many ranks
 * share a GPU. "auto" is direct MPI on host memory, NCCL on a CUDA device each rank has to
 * itself (in a build with NCCL), staged otherwise; an explicit choice the facts cannot carry is
 * refused as a plan error naming the field, why, and what to use instead. */
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "runtime/parallel/dcomm.h"

static struct plan plan_with(enum plan_comm c)
{
  struct plan p;
  memset(&p, 0, sizeof p);
  strcpy(p.file, "plans/x.lua");
  p.comm = c;
  return p;
}

static const struct dcomm_facts cpu = { "cpu", 1, 0, 1, 1 };
static const struct dcomm_facts cuda_own = { "cuda", 0, 1, 1, 1 };
static const struct dcomm_facts cuda_shared = { "cuda", 0, 1, 1, 2 };
static const struct dcomm_facts cuda_no_nccl = { "cuda", 0, 1, 0, 1 };
static const struct dcomm_facts untouchable = { "untouchable", 0, 0, 1, 1 };

static void auto_picks_by_the_memory_and_the_gpus(void)
{
  static const struct { const struct dcomm_facts *f; enum dcomm_mode want; } cases[] = {
    { &cpu, DCOMM_DIRECT }, { &cuda_own, DCOMM_NCCL }, { &cuda_shared, DCOMM_STAGED },
    { &cuda_no_nccl, DCOMM_STAGED }, { &untouchable, DCOMM_STAGED },
  };
  struct plan p = plan_with(PLAN_COMM_AUTO);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    enum dcomm_mode m = (enum dcomm_mode)-1;
    char err[512] = "";
    CHECK_MSG(dcomm_choose(&p, cases[i].f, &m, err, sizeof err) == 0 && m == cases[i].want,
              "auto on %s (nccl %d, %d ranks per gpu): %s, expected %s (%s)", cases[i].f->backend,
              cases[i].f->nccl_built, cases[i].f->ranks_per_gpu, dcomm_mode_name(m),
              dcomm_mode_name(cases[i].want), err);
  }
}

static void explicit_choices_run_where_they_can(void)
{
  enum dcomm_mode m;
  char err[512];
  struct plan p = plan_with(PLAN_COMM_MPI);
  CHECK(dcomm_choose(&p, &cpu, &m, err, sizeof err) == 0 && m == DCOMM_DIRECT);
  p = plan_with(PLAN_COMM_STAGED);
  CHECK(dcomm_choose(&p, &cpu, &m, err, sizeof err) == 0 && m == DCOMM_STAGED); /* staging host memory: allowed */
  CHECK(dcomm_choose(&p, &cuda_own, &m, err, sizeof err) == 0 && m == DCOMM_STAGED);
  p = plan_with(PLAN_COMM_NCCL);
  CHECK(dcomm_choose(&p, &cuda_own, &m, err, sizeof err) == 0 && m == DCOMM_NCCL);
}

static void impossible_choices_are_refused_by_name(void)
{
  static const struct { enum plan_comm c; const struct dcomm_facts *f; const char *text; } cases[] = {
    { PLAN_COMM_MPI, &cuda_own, "plans/x.lua: comm = \"mpi\": the cuda backend's memory is not host memory, and "
      "MPI carries host buffers only; use comm = \"staged\" (or \"auto\")" },
    { PLAN_COMM_NCCL, &cpu, "plans/x.lua: comm = \"nccl\": NCCL carries a CUDA device's memory, and the cpu "
      "backend's is not; use comm = \"auto\" (or \"mpi\")" },
    { PLAN_COMM_NCCL, &untouchable, "plans/x.lua: comm = \"nccl\": NCCL carries a CUDA device's memory, and the "
      "untouchable backend's is not; use comm = \"auto\" (or \"staged\")" },
    { PLAN_COMM_NCCL, &cuda_no_nccl, "plans/x.lua: comm = \"nccl\": this build of tycho has no NCCL (CMake found "
      "none beside the CUDA toolkit); use comm = \"staged\" (or \"auto\")" },
    { PLAN_COMM_NCCL, &cuda_shared, "plans/x.lua: comm = \"nccl\": 2 ranks share one GPU, and NCCL cannot run "
      "two ranks on one device; use comm = \"staged\" (or \"auto\"), or one rank per GPU" },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct plan p = plan_with(cases[i].c);
    enum dcomm_mode m = DCOMM_DIRECT;
    char err[512] = "";
    const int rc = dcomm_choose(&p, cases[i].f, &m, err, sizeof err);
    CHECK_MSG(rc == -2 && strcmp(err, cases[i].text) == 0, "case %zu: rc %d, \"%s\"", i, rc, err);
  }
}

/* The build's NCCL plane says whether it is there, and a build without it refuses a communicator
 * by name (a build with it needs a GPU to open one: the device check's). */
static void the_stream_plane_says_whether_it_is_built(void)
{
#ifdef TYCHO_HAVE_NCCL
  CHECK(comm_stream_built() == 1);
#else
  CHECK(comm_stream_built() == 0);
  char err[256] = "";
  CHECK(comm_stream_open(NULL, err, sizeof err) == -1 && strstr(err, "no NCCL") != NULL);
#endif
}

TEST_MAIN(TEST(auto_picks_by_the_memory_and_the_gpus), TEST(explicit_choices_run_where_they_can),
          TEST(impossible_choices_are_refused_by_name), TEST(the_stream_plane_says_whether_it_is_built))
