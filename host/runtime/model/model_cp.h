/* Context parallelism in the model's passes (model.h, struct model_cp; model_cp.c). With
 * m->cp.size 1 every entry is a no-op. */
#ifndef TYCHO_RUNTIME_MODEL_CP_H
#define TYCHO_RUNTIME_MODEL_CP_H
#include "runtime/model/model.h"

/* The most rows any of cp ranks holds of a T-long sequence (the activations' T_max). */
int model_cp_max_rows(int T, int cp);
/* Sets m's cp group (NULL or a group of one: none) and, with more ranks, opens the ring for B_max
 * samples of T tokens. 0, or −1 with the reason. */
int model_cp_open(struct model *m, struct comm_group *g, int B_max, int T, char *err, size_t err_size);
void model_cp_close(struct model *m);
/* A forward of B samples of T tokens begins: a->seq_T = T, a->T this rank's rows; the rope table
 * at their positions and the ring's shape follow T. */
void model_cp_begin(struct model *m, struct model_acts *a, int B, int T);
/* ids (B, seq_T) cut to this rank's rows (B, T), in host memory of m's; ids itself without cp. */
const int *model_cp_rows(struct model *m, const struct model_acts *a, const int *ids);
/* With cp: the masks of passes_draw_masks (on the residual stream: per_sample elements a sample,
 * first the offset of this rank's first in the cp rank's rows; the shape of the last forward
 * begun) drawn at the rows' global positions, and 1; without, 0 (nothing drawn). */
int model_cp_draw_masks(const struct model *m, real *mask, size_t per_sample, uint64_t first,
                        const struct model_dropout *d, int B, int layer, enum model_dropout_site site);
/* The layer's attention through the ring, on this rank's NH query and NKV key/value heads (its
 * tensor-parallel share): atty and lse from q, k, v; backward dq, dk, dv (a's workspace) from
 * datt. A failed transfer is recorded in the model's fault. */
void model_cp_attention_forward(struct model *m, struct model_layer_acts *la, const struct attention_dropout *drop,
                                int NH, int NKV);
void model_cp_attention_backward(struct model *m, struct model_acts *a, const struct model_layer_acts *la,
                                 const real *datt, const struct attention_dropout *drop, int NH, int NKV);
/* model_head_argmax under mesh.cp: rows index the whole sequences (b · seq_T + position) of the
 * last forward; each is decoded (by `rows_argmax` on this rank's rows) on the cp rank holding its
 * position and shared over the cp group, so every rank returns the same out. */
typedef void (*model_cp_argmax_fn)(struct model *m, struct model_acts *a, const int *rows, int n, int *out);
void model_cp_head_argmax(struct model *m, struct model_acts *a, const int *rows, int n, int *out,
                          model_cp_argmax_fn rows_argmax);

#endif
