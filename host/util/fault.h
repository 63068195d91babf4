/* A failure that cannot be returned where it happens — a collective inside a pass, a pipeline
 * send in the middle of a step's list — recorded to be read once the call is over. The trainer
 * owns one; its model, data-parallel layer and executor record into it (a part used on its own
 * records into one of its own). Each record has a level, the layer that saw it: the first
 * failure of the highest level is the one kept, since the outer layer's says what the step was
 * doing (a refused gradient all-reduce, not the tensor-parallel one before it that it followed). */
#ifndef TYCHO_FAULT_H
#define TYCHO_FAULT_H

#define FAULT_MSG_MAX 512

struct fault {
  int set;                   /* a failure is recorded */
  int level;                 /* the level it was recorded at */
  char msg[FAULT_MSG_MAX];   /* its one-line message */
};

/* The fault a part records into: its owner's (x->fault), or its own (x->own_fault). */
#define FAULT_OF(x) ((x)->fault ? (x)->fault : &(x)->own_fault)

/* Records the message unless a failure of the same or a higher level is recorded already;
 * returns −1, so a failing function can `return fault_set(f, level, "...")`. */
int fault_set(struct fault *f, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The recorded message, or NULL when nothing failed. */
const char *fault_msg(const struct fault *f);
void fault_clear(struct fault *f);

#endif
