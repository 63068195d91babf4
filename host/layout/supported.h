/* Whether this build's runtime can run a plan: a function of the plan and this build's kernels,
 * so that `tycho check` refuses, with the same message, a CPU plan that `tycho run` would
 * (trainer_open checks it first). */
#ifndef TYCHO_LAYOUT_SUPPORTED_H
#define TYCHO_LAYOUT_SUPPORTED_H
#include <stddef.h>

#include "plan/plan.h"

/* 0 when this build can run p (the device: a cuda plan needs the CUDA backend and a visible
 * device; the precision; the optimizer; a data source); else nonzero with the plan error
 * trainer_open gives. */
int trainer_plan_supported(const struct plan *p, char *err, size_t err_size);
/* mesh.cp > 1 with what context parallelism does not compose with yet (a sparse model, bf16
 * compute, device = "cuda", schedule.kind = "zb-h1"): nonzero with the plan error naming the
 * field (trainer_plan_supported's for it); else 0. */
int plan_cp_refused(const struct plan *p, char *err, size_t err_size);
/* Where device = "auto" runs here: 1 for CUDA (this build has the backend and the driver sees a
 * device), 0 for the CPU; why says which holds ("no CUDA backend in this build", "no CUDA device
 * visible", "8 CUDA devices visible"). */
int trainer_auto_device(char *why, size_t why_size);

#endif
