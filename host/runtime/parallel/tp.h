/* Tensor-parallel conversions (tp.c), used by the passes (model_passes.c). Tensors are
 * (B, T, X) in the logical view; a rank holds its part as layout/tp_layout.h describes. */
#ifndef TYCHO_RUNTIME_TP_H
#define TYCHO_RUNTIME_TP_H
#include <stddef.h>

#include "comm/comm.h"
#include "runtime/model/model.h"

/* Records the first failed collective ("tensor-parallel <what>: <comm error>"). */
void tp_failed(struct model_tp *t, const char *what);
/* In-place all-reduce of n floats over the group. */
void tp_all_reduce(struct model_tp *t, real *buf, size_t n, enum comm_reduce op);
/* Floats a rank holds of a (B, T, X) tensor in layout l. */
size_t tp_local_elems(enum tp_layout l, int B, int T, int X, int tp);
/* out ← in converted from `from` to `to` (tp_convert_op; not KV, see tp_expand_kv). out may
 * equal in only when the conversion keeps the size (none, all-reduce, keep-rank0). pack: a
 * (B, T, X) staging buffer for gathers and reduce-scatters, and for all-reduces on the bf16 wire
 * (wire_bf16); tmp: another, for SEQ ↔ FEAT.
 * Returns out. */
real *tp_convert(struct model_tp *t, real *pack, real *out, real *in, enum tp_layout from,
                  enum tp_layout to, int B, int T, int X, real *tmp);
/* KV heads (BT, NKV, HS), replicated → (BT, NHl, HS): each of this rank's query heads' KV head. */
void tp_expand_kv(const struct model_tp *t, const struct plan_model *c, real *out, const real *in,
                  int BT, int NHl);
/* Its adjoint: out (BT, NKV, HS) = zero plus each expanded head's gradient added in (partial
 * sums over the group). Computed on the host through views (hostview.h); a view's memory that
 * cannot be had is recorded in t. */
void tp_expand_kv_backward(struct model_tp *t, const struct plan_model *c, real *out,
                           const real *in, int BT, int NHl);

#endif
