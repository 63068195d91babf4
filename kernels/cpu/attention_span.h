/* The flash attention's walk (attention.c) over a block of query rows against a block of keys,
 * for context parallelism's ring (attention_cp.c): the whole-sequence kernels are these at
 * q0 = k0 = 0, Tq = Tk = T, so a block computes with the very loops, products and dropout
 * draws of attention_forward/attention_backward. Internal to kernels/cpu; struct
 * attention_block and the entries built on these are in kernels.h. */
#ifndef TYCHO_ATTENTION_SPAN_H
#define TYCHO_ATTENTION_SPAN_H
#include <stddef.h>

#include "kernels.h"

/* Scratch of the two below for Tq rows against Tk keys: no Tq · Tk term past one block × chunk
 * per task. */
size_t attention_span_scratch_n_elems(int B, int Tq, int Tk, int NH, int NKV);
/* out (B, q_rows, NH·HS) rows 0 .. Tq − 1 and lse (B, NH, q_rows) assigned: the block's
 * softmax-normalised partial and each row's log-sum-exp over the keys of the block at or before
 * it (a row with none: out 0, lse −∞). */
void attention_span_forward(real *out, real *lse, real *scratch, const real *q, const real *k, const real *v,
                            const struct attention_dropout *drop, const struct attention_block *s, int B, int NH,
                            int NKV, int HS);
/* dq (B, q_rows, NH, HS), dk and dv (B, kv_rows, NKV, HS) accumulated; lse the rows' final
 * log-sum-exp over the whole sequence, D (B, NH, q_rows) their attention_span_row_dots. */
void attention_span_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout, const real *q,
                             const real *k, const real *v, const real *lse, const real *D,
                             const struct attention_dropout *drop, const struct attention_block *s, int B, int NH,
                             int NKV, int HS);
/* D (B, NH, q_rows) rows 0 .. Tq − 1 = Σ_d dout · out in double, rounded once: the value the
 * whole-sequence backward uses. */
void attention_span_row_dots(real *D, const real *dout, const real *out, int B, int Tq, int q_rows, int NH,
                             int HS);

#endif
