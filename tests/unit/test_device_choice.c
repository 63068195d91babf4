/* Where a trainer computes (runtime/model/device.h, util/devices.h): each rank on device
 * local rank % device count; the local rank from Open MPI's environment, else Slurm's; "auto" the
 * CPU, saying why, where this build has no CUDA backend or the driver sees no device; "cpu"
 * without a word. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "layout/supported.h"
#include "runtime/model/device.h"
#include "util/devices.h"

static void each_rank_takes_its_local_rank_modulo_the_devices(void)
{
  static const struct { int local_rank, count, device; } cases[] = {
    { 0, 1, 0 }, { 3, 1, 0 },                /* one device: every rank of the node on it */
    { 0, 8, 0 }, { 7, 8, 7 }, { 8, 8, 0 },   /* one rank per device, then round robin */
    { 9, 8, 1 }, { 5, 2, 1 }, { 6, 4, 2 },
    { 0, 0, -1 }, { 2, 0, -1 }, { 1, -1, -1 }, /* no device */
    { -1, 4, -1 },                            /* no local rank */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    CHECK_MSG(devices_pick(cases[i].local_rank, cases[i].count) == cases[i].device,
              "local rank %d of %d devices: %d, expected %d", cases[i].local_rank, cases[i].count,
              devices_pick(cases[i].local_rank, cases[i].count), cases[i].device);
}

static void the_local_rank_comes_from_open_mpi_else_slurm(void)
{
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  CHECK(devices_local_rank_env() == -1);
  setenv("SLURM_LOCALID", "5", 1);
  CHECK(devices_local_rank_env() == 5);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  CHECK(devices_local_rank_env() == 3); /* Open MPI's first */
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x3", 1);
  CHECK(devices_local_rank_env() == 5); /* not a number: the next */
  setenv("SLURM_LOCALID", "-2", 1);
  CHECK(devices_local_rank_env() == -1);
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  CHECK(runtime_local_rank() == 0); /* no comm layer, no launcher: 0 */
  setenv("SLURM_LOCALID", "2", 1);
  CHECK(runtime_local_rank() == 2);
  unsetenv("SLURM_LOCALID");
}

/* auto and cpu on a machine without a CUDA device (every build here): the CPU, and why. */
static void auto_is_the_cpu_without_a_device_and_says_why(void)
{
#ifdef TYCHO_HAVE_CUDA_BACKEND
  CHECK(devices_cuda_built() == 1);
  const char *why = "no CUDA device visible";
#else
  CHECK(devices_cuda_built() == 0 && devices_cuda_count() == 0);
  const char *why = "no CUDA backend in this build";
#endif
  if (devices_cuda_count() > 0) {
    printf("a CUDA device is visible: auto is cuda here\n");
    return;
  }
  char buf[96], err[256];
  CHECK(trainer_auto_device(buf, sizeof buf) == 0 && strcmp(buf, why) == 0);
  struct runtime_device d;
  CHECK(runtime_device_open(&d, PLAN_DEVICE_AUTO, 0, err, sizeof err) == 0);
  char want[160];
  snprintf(want, sizeof want, "cpu (auto: %s)", why);
  CHECK_MSG(!d.cuda && d.ctx == NULL && strcmp(d.text, want) == 0, "%s", d.text);
  runtime_device_close(&d);
  CHECK(runtime_device_open(&d, PLAN_DEVICE_CPU, 3, err, sizeof err) == 0);
  CHECK(!d.cuda && strcmp(d.text, "cpu") == 0);
  runtime_device_close(&d);
}

TEST_MAIN(TEST(each_rank_takes_its_local_rank_modulo_the_devices),
          TEST(the_local_rank_comes_from_open_mpi_else_slurm),
          TEST(auto_is_the_cpu_without_a_device_and_says_why))
