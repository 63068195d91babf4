/* The data-parallel flat layout (the runtime's dp.h describes what each ZeRO stage keeps of it):
 * the parameters in buckets, in the order backward finishes gradients, each padded so that every
 * rank owns an equal, 16-element aligned share of it; and the units the passes read. A pure
 * function of a parameter table (layout/params.h), the group size, the ZeRO stage and the bucket
 * size, so every rank computes the same layout, and the memory bill reads the same one the
 * runtime binds; with expert parallelism the ranks of a dp group hold different experts of the
 * same shapes, and the layout's sizes are still the same. */
#ifndef TYCHO_LAYOUT_DP_BUCKETS_H
#define TYCHO_LAYOUT_DP_BUCKETS_H
#include <stddef.h>

#include "layout/params.h"

/* Consecutive parameters reduced (and under ZeRO-3 gathered) with one collective. */
struct dp_bucket {
  int first_param, last_param; /* parameter indices, inclusive */
  int first_held;              /* the first of them with elements on this rank (pipeline stages
                                * hold only theirs): its gradients are final once that one's are */
  size_t start;                /* flat offset of its first element */
  size_t n_elems;              /* size · share: its parameters, aligned, plus padding */
  size_t share;                /* elements each rank owns (16-element aligned) */
  size_t shard_offset;         /* where a rank's share of it sits in the shard: Σ earlier shares */
  int expert;                  /* mesh.ep > 1: it holds experts, shared by the expert-data-parallel
                                * group (dp / ep ranks) instead of the whole dp group */
};

/* The parameters one piece of the passes reads: 0 the embedding, 1 + l layer l, L + 1 the
 * final norm and the head. */
struct dp_unit {
  int first_param, last_param;
  int first_bucket, last_bucket; /* the buckets holding its parameters */
};

struct dp_layout {
  int size, zero;
  int ep;                      /* mesh.ep (1 without expert parallelism) */
  int expert_size;             /* the ranks that share an expert bucket: size / ep */
  int n_buckets, n_units;
  struct dp_bucket *buckets;   /* (n_buckets) in flat order */
  struct dp_unit *units;       /* (n_units) */
  int *param_bucket;           /* (n_params) the bucket of each parameter */
  size_t n_elems;              /* the flat layout's length: Σ bucket n_elems */
  size_t n_shard;              /* one rank's shard: Σ shares */
  size_t max_bucket_elems;
};

/* Lays table t out in buckets for a group of `size` with ZeRO stage `zero` and buckets of
 * bucket_mb MiB (of this build's elements) under mesh.ep = ep_size; rewrites every t->p[i].offset
 * and t->n_elems to the bucketed layout, and a bf16 table's copies (bf16_offset, n_bf16) to the same
 * offsets. 0 ok; −1 (out of memory) with a message. */
int dp_buckets_build(struct dp_layout *l, struct layout_params *t, int n_layers, int ep_size, int size, int zero,
                     double bucket_mb, char *err, size_t err_size);
void dp_layout_free(struct dp_layout *l);
/* Unit u's parameters as one flat range of the layout t was laid out in: *start and the length,
 * padded to the alignment (0 for a unit with no parameters). precision.grads = "bf16" under ZeRO 0
 * and 1 sums a unit's gradients in an fp32 area of this size (the runtime's dp.h). */
size_t dp_unit_span(const struct dp_layout *l, const struct layout_params *t, int u, size_t *start);

/* Whether a rank keeps only its shard of the fp32 parameters: under ZeRO 3, and for a bf16 model
 * (bf16 = 1) from ZeRO 1 on over a dp group of more than one rank, where the fp32 weights are the
 * master, optimizer state that the optimizer shards with its moments (the passes read the bf16
 * copies; over one rank the shard is the whole layout, kept whole so that one rank's sampling and
 * generation read it in place). */
int dp_master_is_sharded(int zero, int bf16, int dp_size);
/* Elements in a rank's async checkpoint snapshot: its fp32 parameters (the shard where
 * dp_master_is_sharded) and AdamW's two moments (the shard under ZeRO ≥ 1), from its
 * data-parallel layout's sizes. */
size_t dp_snapshot_elems(size_t layout_elems, size_t shard_elems, int zero, int bf16, int dp_size);

#endif
