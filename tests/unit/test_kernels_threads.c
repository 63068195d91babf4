/* The kernels give the same bits with 1 thread and with 4: no two threads write one element
 * (grouped-query attention's dk/dv, embedding rows shared by tokens, norm weights) and every
 * sum keeps its order. Both attention paths are run: more (batch, head) tasks than threads
 * (parallel tasks, single-threaded sgemm: bitwise equal) and fewer (tasks in turn, threaded
 * sgemm). OpenBLAS's threaded sgemm itself differs from its single-threaded one in the last bit
 * (edge tiles go to other micro-kernels), so that path is held to 1e-5 against 1 thread, and
 * to bitwise equality between two runs with 4 threads. */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "kernels.h"

static real rnd(uint32_t *state) /* xorshift32, uniform in [-1, 1) */
{
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (real)(*state >> 8) / 8388608.0f - 1.0f;
}

static real *rand_buf(size_t n, uint32_t *state)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = rnd(state);
  return x;
}

struct attn_run { real *out, *lse, *dq, *dk, *dv; };

static struct attn_run attention_run(int n_threads, int B, int T, int NH, int NKV, int HS)
{
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
  const size_t nlse = (size_t)B * NH * T;
  uint32_t s = 31, samples[2] = { 3, 8 };
  real *q = rand_buf(nq, &s), *k = rand_buf(nkv, &s), *v = rand_buf(nkv, &s);
  real *dout = rand_buf(nq, &s);
  const struct attention_dropout mask = { 0.1f, 1, 2, 4, 0, samples }; /* B ≤ 2 */
  real *scratch = malloc(attention_scratch_n_elems(B, T, NH, NKV, HS) * sizeof(real));
  struct attn_run r = { malloc(nq * sizeof(real)), malloc(nlse * sizeof(real)),
                        malloc(nq * sizeof(real)), malloc(nkv * sizeof(real)),
                        malloc(nkv * sizeof(real)) };
  kernels_init_cpu(n_threads);
  attention_forward(r.out, r.lse, scratch, q, k, v, &mask, B, T, NH, NKV, HS);
  attention_backward(r.dq, r.dk, r.dv, scratch, dout, q, k, v, r.out, r.lse, &mask, B, T, NH, NKV, HS);
  kernels_init_cpu(1);
  free(q); free(k); free(v); free(dout); free(scratch);
  return r;
}

static double max_diff(const real *a, const real *b, size_t n)
{
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
  return worst;
}

static void free_run(struct attn_run *r)
{
  free(r->out); free(r->lse); free(r->dq); free(r->dk); free(r->dv);
}

/* tol 0: bitwise equal to 1 thread; else within tol of it and bitwise equal run to run. */
static void check_attention_threads(int B, int T, int NH, int NKV, int HS, double tol)
{
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
  const size_t nlse = (size_t)B * NH * T;
  struct attn_run a = attention_run(1, B, T, NH, NKV, HS), b = attention_run(4, B, T, NH, NKV, HS);
  struct attn_run c = attention_run(4, B, T, NH, NKV, HS);
  const real *a_bufs[5] = { a.out, a.lse, a.dq, a.dk, a.dv };
  const real *b_bufs[5] = { b.out, b.lse, b.dq, b.dk, b.dv };
  const real *c_bufs[5] = { c.out, c.lse, c.dq, c.dk, c.dv };
  const size_t sizes[5] = { nq, nlse, nq, nkv, nkv };
  static const char *names[5] = { "out", "lse", "dq", "dk", "dv" };
  for (int i = 0; i < 5; i++) {
    double diff = max_diff(a_bufs[i], b_bufs[i], sizes[i]);
    CHECK_MSG(tol == 0.0 ? diff == 0.0 : diff <= tol, "%s: 1 vs 4 threads differ by %g",
              names[i], diff);
    CHECK_MSG(memcmp(b_bufs[i], c_bufs[i], sizes[i] * sizeof(real)) == 0,
              "%s: two runs with 4 threads differ", names[i]);
  }
  free_run(&a);
  free_run(&b);
  free_run(&c);
}

static void attention_same_bits_with_4_threads_as_1_parallel_tasks(void)
{
  check_attention_threads(2, 16, 8, 2, 8, 0.0); /* 16 forward, 4 backward tasks */
}

static void attention_with_threaded_sgemm_matches_1_thread_and_repeats(void)
{
  /* 2 and 1 tasks; gemm threads. Threaded and single-threaded gemm sum the same products in
   * another association: for sums of up to T = 128 terms of size S ≲ 5 (|dv| reaches 5) that
   * is ≲ 2 · sqrt(128) · u · S ≈ 110 u as a random walk (the worst case, 2 γ_128 · S, never
   * happens); bound 168 · REAL_U absolute (1e-5 in fp32). Seen: 12 u in fp32 (dv), 0 in
   * float64. An element summed twice or left out moves by the size of a term, ≥ 1e-3. */
  check_attention_threads(1, 128, 2, 1, 32, 168 * REAL_U);
}

static void token_kernels_same_bits_with_4_threads_as_1(void)
{
  enum { BT = 64, C = 200, V = 50 };
  uint32_t s = 32;
  real *x = rand_buf(BT * C, &s), *g = rand_buf(C, &s), *dy = rand_buf(BT * C, &s);
  real *logits = rand_buf(BT * V, &s);
  int tokens[BT];
  for (int i = 0; i < BT; i++) tokens[i] = (int)((rnd(&s) + 1.0f) * 4.0f); /* many repeats */
  real *res[2][6];
  for (int run = 0; run < 2; run++) {
    real *y = malloc(BT * C * sizeof(real)), *rstd = malloc(BT * sizeof(real));
    real *dx = malloc(BT * C * sizeof(real)), *dg = calloc(C, sizeof(real));
    real *dwte = calloc(8 * C, sizeof(real)), *probs = malloc(BT * V * sizeof(real));
    real losses[BT];
    kernels_init_cpu(run ? 4 : 1);
    rmsnorm_forward(y, rstd, x, g, BT, C, 1e-5f);
    rmsnorm_backward(dx, dg, dy, x, g, rstd, BT, C);
    encoder_backward(dwte, dy, tokens, BT, C);
    crossentropy_forward(losses, probs, logits, tokens, BT, V, V);
    crossentropy_backward(probs, probs, tokens, 1.0f / BT, BT, V, V);
    kernels_init_cpu(1);
    res[run][0] = y; res[run][1] = rstd; res[run][2] = dx; res[run][3] = dg;
    res[run][4] = dwte; res[run][5] = probs;
  }
  const size_t sizes[6] = { BT * C, BT, BT * C, C, 8 * C, BT * V };
  for (int i = 0; i < 6; i++) {
    CHECK_MSG(memcmp(res[0][i], res[1][i], sizes[i] * sizeof(real)) == 0, "output %d", i);
    free(res[0][i]);
    free(res[1][i]);
  }
  free(x); free(g); free(dy); free(logits);
}

static void sumsq_same_bits_with_4_threads_as_1(void)
{
  const size_t n = 100003;
  uint32_t s = 33;
  real *x = rand_buf(n, &s);
  kernels_init_cpu(1);
  double one = sumsq(x, n);
  kernels_init_cpu(4);
  double four = sumsq(x, n);
  kernels_init_cpu(1);
  CHECK(one == four);
  free(x);
}

TEST_MAIN(TEST(attention_same_bits_with_4_threads_as_1_parallel_tasks),
          TEST(attention_with_threaded_sgemm_matches_1_thread_and_repeats),
          TEST(token_kernels_same_bits_with_4_threads_as_1),
          TEST(sumsq_same_bits_with_4_threads_as_1))
