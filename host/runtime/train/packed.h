/* A model's parameters packed in the serial model's order (the order of a one-rank model's
 * parameter table, each tensor as Hugging Face has it: the padding rows of a padded vocabulary
 * left out), gathered from a trainer on any layout — tensor and pipeline parallel, ZeRO 1-3,
 * experts over ranks — to rank 0 of its job. So two layouts' weights compare element by element
 * (tycho rehearse, the equivalence tests), and one rank can hold the whole model the job trains
 * (t:generate builds a one-rank model from them). */
#ifndef TYCHO_RUNTIME_PACKED_H
#define TYCHO_RUNTIME_PACKED_H
#include <stddef.h>
#include <stdint.h>

#include "real.h"
#include "plan/plan.h"

struct trainer;
struct model;

/* The parameters of a trainer in the serial model's order, packed: on rank 0 of the job *out
 * (malloc'd, *n elements), NULL elsewhere. Collective over t's groups. 0 ok; nonzero with a
 * message. */
int trainer_gather_packed(struct trainer *t, real **out, size_t *n, char *err, size_t err_size);
/* The same of a one-rank model (its own memory, host-addressable). NULL when out of memory. */
real *model_packed(const struct model *m, size_t *n);
/* The inverse: a one-rank model of cfg on the CPU (model_create, its vocabulary unpadded) whose
 * parameters are packed[0, n) — n must be the count model_packed gives for it. 0, or −1 with a
 * message (out of memory, a count that does not fit the model); m is then left empty. */
int model_from_packed(struct model *m, const struct plan_model *cfg, const real *packed, size_t n, char *err,
                      size_t err_size);
/* The same with the sparse layers of a model with experts given: sparse (L) flags, a trainer's
 * model.moe (its m->moe); NULL: every layer sparse, as model_from_packed makes them. */
int model_from_packed_sparse(struct model *m, const struct plan_model *cfg, const uint8_t *sparse,
                             const real *packed, size_t n, char *err, size_t err_size);

#endif
