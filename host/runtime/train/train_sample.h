/* train.sample: after each evaluation, rank 0 generates from the prompt with the weights it holds
 * (runtime/model/generate.h) and prints the text, so a run shows what its model writes as it
 * learns. The plan is checked to hold the whole model on rank 0 (plan_validate: tp 1, pp 1, zero
 * 0-2, dense). */
#ifndef TYCHO_RUNTIME_TRAIN_SAMPLE_H
#define TYCHO_RUNTIME_TRAIN_SAMPLE_H
#include <stdio.h>

#include "runtime/train/train.h"

/* "sample at step N: PROMPT..." on out; a failure is said on out and does not stop the run. */
void train_sample_print(const struct trainer *t, FILE *out, long long step);

#endif
