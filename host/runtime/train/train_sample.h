/* train.sample: after each evaluation, the job generates from the prompt with the weights it has
 * just trained (runtime/model/generate.h) and rank 0 prints the text, so a run shows what its model
 * writes as it learns. On every layout: where rank 0 holds the whole model (tensor and pipeline
 * parallel off, ZeRO 0-2) it generates from its own weights; otherwise the parameters are first
 * gathered to rank 0 in the serial model's order (trainer_gather_packed, as t:generate does) and a
 * one-rank model built from them generates. So the sample is the same on every layout for the same
 * weights; with experts over ranks (mesh.ep) every expert is gathered too. */
#ifndef TYCHO_RUNTIME_TRAIN_SAMPLE_H
#define TYCHO_RUNTIME_TRAIN_SAMPLE_H
#include <stdio.h>

#include "runtime/train/train.h"

/* "sample at step N: PROMPT..." on out (rank 0's; NULL elsewhere, or for no output). Collective
 * over t's world: every rank calls it at the same point. A failure is said on out and does not
 * stop the run. */
void train_sample_print(struct trainer *t, FILE *out, long long step);

#endif
