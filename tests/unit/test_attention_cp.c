/* Context parallelism's attention blocks (kernels/cpu/attention_cp.c) in one process: the ring
 * of cp = 2, 3 and 4 ranks simulated — each virtual rank holds its chunk pair (chunks i and
 * 2·cp − 1 − i), meets every rank's k, v pair in ring order (step s: rank r holds rank
 * (r − s) mod cp's), computes the blocks at or below the causal diagonal and merges them; then
 * backward from the merged out and lse, dq on the rank, dk and dv added into the travelling
 * block's in ring order. Every rank's out, lse, dq, dk and dv against attention_forward and
 * attention_backward on the whole sequence, within CP_TOL (cp_fixture.h argues it): T up to 4096,
 * grouped heads (NH 8, NKV 2), dropout on and off, T not divisible by 2·cp (the first T % 2·cp
 * chunks one token longer) down to chunks of one token. Also: a block that is the whole
 * sequence gives the whole-sequence kernel's values exactly (the same walk and draws), and the
 * chunks tile the sequence with each rank's share of the causal square equal. */
#include <stdio.h>

#include "check.h"
#include "cp_fixture.h"

/* Rank r's chunk i (0: chunk r, 1: chunk 2·cp − 1 − r): its id, global start, length and first
 * row in the rank's buffers. */
struct piece { int id, start, len, row; };

static struct piece piece_of(int T, int cp, int r, int i)
{
  struct piece p;
  p.id = i == 0 ? r : 2 * cp - 1 - r;
  attention_cp_chunk(T, cp, p.id, &p.start, &p.len);
  int s0, n0;
  attention_cp_chunk(T, cp, r, &s0, &n0);
  p.row = i == 0 ? 0 : n0;
  return p;
}

static double worst[5];

static void ring_case(int cp, int B, int T, int NH, int NKV, int HS, float p, uint32_t seed)
{
  struct cp_case c;
  cp_case_make(&c, B, T, NH, NKV, HS, p, seed);
  const struct attention_dropout *drop = p > 0 ? &c.d : NULL;
  const int C = NH * HS, CK = NKV * HS;
  real *q[8], *k[8], *v[8], *dout[8], *out[8], *lse[8], *D[8], *dq[8], *dk[8], *dv[8];
  int Tl[8];
  for (int r = 0; r < cp; r++) {
    Tl[r] = attention_cp_rank_tokens(T, cp, r);
    const size_t nq = (size_t)B * Tl[r] * C, nkv = (size_t)B * Tl[r] * CK, nl = (size_t)B * NH * Tl[r];
    q[r] = malloc(nq * sizeof(real)), dout[r] = malloc(nq * sizeof(real));
    k[r] = malloc(nkv * sizeof(real)), v[r] = malloc(nkv * sizeof(real));
    cp_gather_rows(q[r], c.q, B, T, C, cp, r), cp_gather_rows(dout[r], c.dout, B, T, C, cp, r);
    cp_gather_rows(k[r], c.k, B, T, CK, cp, r), cp_gather_rows(v[r], c.v, B, T, CK, cp, r);
    out[r] = malloc(nq * sizeof(real)), lse[r] = malloc(nl * sizeof(real)), D[r] = malloc(nl * sizeof(real));
    dq[r] = calloc(nq, sizeof(real)), dk[r] = calloc(nkv, sizeof(real)), dv[r] = calloc(nkv, sizeof(real));
  }
  int maxTl = 0;
  for (int r = 0; r < cp; r++) maxTl = Tl[r] > maxTl ? Tl[r] : maxTl;
  real *pout = malloc((size_t)B * maxTl * C * sizeof(real)), *plse = malloc((size_t)B * NH * maxTl * sizeof(real));
  real *scratch = malloc(attention_cp_scratch_n_elems(B, maxTl, maxTl, NH, NKV, HS) * sizeof(real));

  /* Forward: rank r at step s computes against rank (r − s) mod cp's pair; the first block of a
   * chunk is written in place, later ones merged. */
  for (int r = 0; r < cp; r++) {
    int have[2] = { 0, 0 };
    for (int s = 0; s < cp; s++) {
      const int src = (r - s + cp) % cp;
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
          const struct piece a = piece_of(T, cp, r, i), kb = piece_of(T, cp, src, j);
          if (kb.id > a.id || !a.len || !kb.len)
            continue; /* wholly above the diagonal */
          const struct attention_block blk = { T, a.start, a.len, kb.start, kb.len, Tl[r], Tl[src] };
          real *o = have[i] ? pout : out[r], *l = have[i] ? plse : lse[r];
          attention_cp_forward(o + (size_t)a.row * C, l + a.row, scratch, q[r] + (size_t)a.row * C,
                               k[src] + (size_t)kb.row * CK, v[src] + (size_t)kb.row * CK, drop, &blk, B, NH, NKV,
                               HS);
          if (have[i])
            attention_cp_merge(out[r] + (size_t)a.row * C, lse[r] + a.row, pout + (size_t)a.row * C, plse + a.row,
                               B, a.len, Tl[r], NH, HS);
          have[i] = 1;
        }
    }
    attention_cp_row_dots(D[r], dout[r], out[r], B, Tl[r], Tl[r], NH, HS);
  }
  /* Backward in ring order: at step s every rank adds into the block it holds, rank (r − s)'s. */
  for (int s = 0; s < cp; s++)
    for (int r = 0; r < cp; r++) {
      const int src = (r - s + cp) % cp;
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
          const struct piece a = piece_of(T, cp, r, i), kb = piece_of(T, cp, src, j);
          if (kb.id > a.id || !a.len || !kb.len)
            continue;
          const struct attention_block blk = { T, a.start, a.len, kb.start, kb.len, Tl[r], Tl[src] };
          const size_t ko = (size_t)kb.row * CK;
          attention_cp_backward(dq[r] + (size_t)a.row * C, dk[src] + ko, dv[src] + ko, scratch,
                                dout[r] + (size_t)a.row * C, q[r] + (size_t)a.row * C, k[src] + ko, v[src] + ko,
                                lse[r] + a.row, D[r] + a.row, drop, &blk, B, NH, NKV, HS);
        }
    }

  real *want = malloc((size_t)B * maxTl * C * sizeof(real));
  for (int r = 0; r < cp; r++) {
    const size_t nq = (size_t)B * Tl[r] * C, nkv = (size_t)B * Tl[r] * CK, nl = (size_t)B * NH * Tl[r];
    const real *got[5] = { out[r], lse[r], dq[r], dk[r], dv[r] };
    const real *whole[5] = { c.out, c.lse, c.dq, c.dk, c.dv };
    const size_t n[5] = { nq, nl, nq, nkv, nkv };
    const int X[5] = { C, 1, C, CK, CK };
    const char *name[5] = { "out", "lse", "dq", "dk", "dv" };
    for (int o = 0; o < 5; o++) {
      if (o == 1)
        cp_gather_lse(want, c.lse, B, T, NH, cp, r);
      else
        cp_gather_rows(want, whole[o], B, T, X[o], cp, r);
      const double e = cp_err(got[o], want, n[o]);
      worst[o] = e > worst[o] ? e : worst[o];
      CHECK_MSG(e <= CP_TOL, "cp %d T %d p %g rank %d: %s off by %.3g of its largest (bound %.3g)", cp, T, (double)p,
                r, name[o], e, (double)CP_TOL);
    }
  }
  for (int r = 0; r < cp; r++) {
    free(q[r]), free(k[r]), free(v[r]), free(dout[r]), free(out[r]), free(lse[r]), free(D[r]);
    free(dq[r]), free(dk[r]), free(dv[r]);
  }
  free(pout), free(plse), free(scratch), free(want);
  cp_case_free(&c);
}

static void chunks_tile_the_sequence_and_balance_the_causal_work(void)
{
  const int Ts[] = { 8, 13, 1003, 4096 }, cps[] = { 1, 2, 3, 4 };
  for (int ti = 0; ti < 4; ti++)
    for (int ci = 0; ci < 4; ci++) {
      const int T = Ts[ti], cp = cps[ci];
      int next = 0, ok = 1;
      for (int c = 0; c < 2 * cp; c++) {
        int s, n;
        attention_cp_chunk(T, cp, c, &s, &n);
        ok &= s == next && (n == T / (2 * cp) || n == T / (2 * cp) + 1);
        next = s + n;
      }
      CHECK_MSG(ok && next == T, "T %d cp %d: chunks do not tile [0, T)", T, cp);
      /* A rank's causal work: Σ over its rows of the keys at or before each row. Chunks of
       * equal length n: rank i's is n² (2·cp) + n (…), the same for every i; a token more in
       * some chunks moves it by at most about 2·T. */
      long long lo = -1, hi = 0;
      int tok = 0;
      for (int r = 0; r < cp; r++) {
        long long w = 0;
        for (int i = 0; i < 2; i++) {
          int s, n;
          attention_cp_chunk(T, cp, i == 0 ? r : 2 * cp - 1 - r, &s, &n);
          for (int t = s; t < s + n; t++) w += t + 1;
        }
        tok += attention_cp_rank_tokens(T, cp, r);
        lo = lo < 0 || w < lo ? w : lo;
        hi = w > hi ? w : hi;
      }
      CHECK_MSG(tok == T, "T %d cp %d: ranks hold %d tokens", T, cp, tok);
      CHECK_MSG(hi - lo <= 2LL * T, "T %d cp %d: causal work per rank %lld .. %lld", T, cp, lo, hi);
    }
}

/* One block of every row against every key, from position 0: the whole-sequence kernels' own
 * walk, so their values (== compares +0 and −0 alike: backward's dq is added onto 0 here,
 * assigned there). */
static void whole_sequence_block_is_the_whole_sequence_kernel(void)
{
  const int B = 2, T = 600, NH = 4, NKV = 2, HS = 16, C = NH * HS, CK = NKV * HS;
  for (int dp = 0; dp < 2; dp++) {
    struct cp_case c;
    cp_case_make(&c, B, T, NH, NKV, HS, dp ? 0.2f : 0.0f, 7);
    const struct attention_dropout *drop = dp ? &c.d : NULL;
    const size_t nq = (size_t)B * T * C, nkv = (size_t)B * T * CK, nl = (size_t)B * NH * T;
    real *out = malloc(nq * sizeof(real)), *lse = malloc(nl * sizeof(real)), *D = malloc(nl * sizeof(real));
    real *dq = calloc(nq, sizeof(real)), *dk = calloc(nkv, sizeof(real)), *dv = calloc(nkv, sizeof(real));
    real *scratch = malloc(attention_cp_scratch_n_elems(B, T, T, NH, NKV, HS) * sizeof(real));
    const struct attention_block blk = { T, 0, T, 0, T, T, T };
    attention_cp_forward(out, lse, scratch, c.q, c.k, c.v, drop, &blk, B, NH, NKV, HS);
    attention_cp_row_dots(D, c.dout, out, B, T, T, NH, HS);
    attention_cp_backward(dq, dk, dv, scratch, c.dout, c.q, c.k, c.v, lse, D, drop, &blk, B, NH, NKV, HS);
    const real *got[5] = { out, lse, dq, dk, dv }, *want[5] = { c.out, c.lse, c.dq, c.dk, c.dv };
    const size_t n[5] = { nq, nl, nq, nkv, nkv };
    for (int o = 0; o < 5; o++) {
      size_t diff = 0;
      for (size_t i = 0; i < n[o]; i++) diff += got[o][i] != want[o][i];
      CHECK_MSG(diff == 0, "dropout %d output %d: %zu elements differ", dp, o, diff);
    }
    free(out), free(lse), free(D), free(dq), free(dk), free(dv), free(scratch);
    cp_case_free(&c);
  }
}

/* A block whose first key lies after some of its rows: those rows see no key (out 0, lse −∞),
 * and merging that empty partial changes nothing. */
static void rows_before_the_keys_are_empty_and_merge_as_nothing(void)
{
  const int B = 1, T = 96, NH = 2, NKV = 1, HS = 16, C = NH * HS;
  struct cp_case c;
  cp_case_make(&c, B, T, NH, NKV, HS, 0.0f, 3);
  /* rows 32 .. 63 against keys 48 .. 95: rows 32 .. 47 see none */
  const struct attention_block blk = { T, 32, 32, 48, 48, 32, 48 };
  real out[32 * 32], lse[2 * 32];
  real *scratch = malloc(attention_cp_scratch_n_elems(B, 32, 48, NH, NKV, HS) * sizeof(real));
  attention_cp_forward(out, lse, scratch, c.q + (size_t)32 * C, c.k + (size_t)48 * HS, c.v + (size_t)48 * HS, NULL,
                       &blk, B, NH, NKV, HS);
  int empty = 1, full = 1;
  for (int h = 0; h < NH; h++)
    for (int t = 0; t < 32; t++) {
      const int before = 32 + t < 48;
      if (before) {
        empty &= lse[h * 32 + t] == -INFINITY;
        for (int d = 0; d < HS; d++) empty &= out[t * C + h * HS + d] == 0;
      } else {
        full &= isfinite(lse[h * 32 + t]);
      }
    }
  CHECK(empty);
  CHECK(full);
  /* merging (out, lse) of rows 32..47 with the empty partial leaves the reference's rows */
  real m_out[16 * 32], m_lse[2 * 16];
  for (int t = 0; t < 16; t++) memcpy(m_out + t * C, c.out + (size_t)(32 + t) * C, C * sizeof(real));
  for (int h = 0; h < NH; h++)
    for (int t = 0; t < 16; t++) m_lse[h * 16 + t] = c.lse[h * T + 32 + t];
  real e_lse[2 * 16];
  for (int h = 0; h < NH; h++)
    for (int t = 0; t < 16; t++) e_lse[h * 16 + t] = lse[h * 32 + t];
  attention_cp_merge(m_out, m_lse, out, e_lse, B, 16, 16, NH, HS);
  int same = 1;
  for (int t = 0; t < 16; t++)
    for (int d = 0; d < C; d++) same &= m_out[t * C + d] == c.out[(size_t)(32 + t) * C + d];
  for (int h = 0; h < NH; h++)
    for (int t = 0; t < 16; t++) same &= m_lse[h * 16 + t] == c.lse[h * T + 32 + t];
  CHECK(same);
  free(scratch);
  cp_case_free(&c);
}

static void ring_of_two_matches_the_whole_sequence(void)
{
  ring_case(2, 2, 1024, 4, 4, 32, 0.0f, 11);
  ring_case(2, 1, 1024, 8, 2, 16, 0.1f, 12);
}

static void ring_of_four_with_grouped_heads_and_dropout_at_4096(void)
{
  ring_case(4, 1, 4096, 8, 2, 16, 0.1f, 21);
}

static void ring_of_four_without_dropout(void)
{
  ring_case(4, 2, 1536, 8, 2, 16, 0.0f, 22);
}

/* T % 2·cp ≠ 0: 1003 in 4 chunks (251, 251, 251, 250) and 8 (126 × 3, 125 × 5); 13 in 8 (2 × 5,
 * 1 × 3): blocks of one or two rows, ranks holding different counts. */
static void uneven_chunks_match_the_whole_sequence(void)
{
  ring_case(2, 2, 1003, 8, 2, 16, 0.15f, 31);
  ring_case(4, 1, 1003, 8, 2, 32, 0.0f, 32);
  ring_case(4, 2, 13, 4, 1, 16, 0.3f, 33);
  ring_case(3, 1, 700, 6, 3, 16, 0.2f, 34);
}

int main(void)
{
  kernels_init_cpu(2);
  static const struct test_case tests[] = {
    TEST(chunks_tile_the_sequence_and_balance_the_causal_work),
    TEST(whole_sequence_block_is_the_whole_sequence_kernel),
    TEST(rows_before_the_keys_are_empty_and_merge_as_nothing),
    TEST(ring_of_two_matches_the_whole_sequence),
    TEST(ring_of_four_with_grouped_heads_and_dropout_at_4096),
    TEST(ring_of_four_without_dropout),
    TEST(uneven_chunks_match_the_whole_sequence),
  };
  const int rc = test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  printf("worst error / largest element seen: out %.2g, lse %.2g, dq %.2g, dk %.2g, dv %.2g (bound %.2g)\n",
         worst[0], worst[1], worst[2], worst[3], worst[4], (double)CP_TOL);
  return rc;
}
