/* Context parallelism's attention blocks, the CPU's attention_cp_* entries (ops_list.h):
 * a block's forward and backward are the flash attention's own walk over a block of rows
 * against a block of keys (attention_span.h, in attention.c), so a ring of blocks draws the
 * whole-sequence kernel's dropout and computes its products; what differs is only the order of
 * the sums. Here: the chunks of the load-balanced layout, and the log-sum-exp merge of two
 * partials. The merge works in double and rounds once per element: out = (e^(la − m)·out_a +
 * e^(lb − m)·out_b) / (e^(la − m) + e^(lb − m)), lse = m + log(e^(la − m) + e^(lb − m)) with
 * m = max(la, lb), so neither exp overflows and an empty partial (lse −∞) weighs 0. */
#include <math.h>
#include <omp.h>

#include "attention_span.h"
#include "kernels.h"

void attention_cp_chunk(int T, int cp, int c, int *start, int *len)
{
  const int n = 2 * cp, base = T / n, extra = T % n;
  *start = c * base + (c < extra ? c : extra);
  *len = base + (c < extra ? 1 : 0);
}

int attention_cp_rank_tokens(int T, int cp, int rank)
{
  int s, a, b;
  attention_cp_chunk(T, cp, rank, &s, &a);
  attention_cp_chunk(T, cp, 2 * cp - 1 - rank, &s, &b);
  return a + b;
}

size_t attention_cp_scratch_n_elems(int B, int Tq, int Tk, int NH, int NKV, int HS)
{
  (void)HS;
  return attention_span_scratch_n_elems(B, Tq, Tk, NH, NKV);
}

void attention_cp_forward(real *out, real *lse, real *scratch, const real *q, const real *k,
                          const real *v, const struct attention_dropout *drop,
                          const struct attention_block *blk, int B, int NH, int NKV, int HS)
{
  attention_span_forward(out, lse, scratch, q, k, v, drop, blk, B, NH, NKV, HS);
}

void attention_cp_merge(real *out, real *lse, const real *out_b, const real *lse_b, int B, int Tq,
                        int q_rows, int NH, int HS)
{
  const size_t ldo = (size_t)NH * HS;
#pragma omp parallel for collapse(2) if (omp_get_max_threads() > 1 && (size_t)B * NH * Tq * HS > 65536)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < Tq; t++) {
        const size_t l = ((size_t)b * NH + h) * q_rows + (size_t)t;
        const double la = lse[l], lb = lse_b[l], m = la > lb ? la : lb;
        if (m == -INFINITY) /* both empty: stays empty */
          continue;
        const double wa = exp(la - m), wb = exp(lb - m), sum = wa + wb;
        const double ca = wa / sum, cb = wb / sum;
        real *o = out + ((size_t)b * q_rows + (size_t)t) * ldo + (size_t)h * HS;
        const real *ob = out_b + ((size_t)b * q_rows + (size_t)t) * ldo + (size_t)h * HS;
        for (int d = 0; d < HS; d++) o[d] = (real)(ca * o[d] + cb * ob[d]);
        lse[l] = (real)(m + log(sum));
      }
}

void attention_cp_row_dots(real *D, const real *dout, const real *out, int B, int Tq, int q_rows,
                           int NH, int HS)
{
  attention_span_row_dots(D, dout, out, B, Tq, q_rows, NH, HS);
}

void attention_cp_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                           const real *q, const real *k, const real *v, const real *lse,
                           const real *D, const struct attention_dropout *drop,
                           const struct attention_block *blk, int B, int NH, int NKV, int HS)
{
  attention_span_backward(dq, dk, dv, scratch, dout, q, k, v, lse, D, drop, blk, B, NH, NKV, HS);
}
