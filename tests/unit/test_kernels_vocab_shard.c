/* The vocab-parallel kernels (Megatron-style) against the whole-vocabulary ones, with tp shards
 * simulated in one process and the reductions between the calls done by hand (max, then sum):
 *   - crossentropy_shard_{max,sums,finish} give the losses of crossentropy_forward on the full
 *     (BT, Vp) logits (relative 1e-6; exactly 0 where target = −1; every shard the same losses)
 *     and each shard's probs are the matching columns of the full probs (abs 1e-7), padding 0;
 *   - crossentropy_shard_backward gives the matching columns of crossentropy_backward: exactly
 *     when fed the same probabilities, within 1e-7 on the shard's own probs; padding columns and
 *     ignored rows exactly 0;
 *   - encoder_forward_shard summed over shards is encoder_forward exactly (one shard owns each
 *     token), and encoder_backward_shard adds (+=) exactly the full gradient's rows of its shard
 *     and writes nothing outside them.
 * The cases cover a last shard with one real column, no padding, tp = 3, and a shard that is all
 * padding (max −inf). Padding logits are large (50) so that a kernel which read them would fail.
 * Every case also shows that a wrong reduction (each shard keeping its local max) breaks the
 * loss comparison, so the comparisons can fail. */
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

static int rnd_int(uint32_t *state, int n) /* in [0, n) */
{
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (int)(*state % (uint32_t)n);
}

struct vocab_case { int tp, V, Vp; };

static const struct vocab_case cases[] = {
  { 4, 13, 16 }, /* last shard has 1 real column */
  { 2, 64, 64 }, /* no padding */
  { 3, 7, 9 },   /* odd tp, last shard has 1 real column */
  { 4, 11, 16 }, /* shard 3 (v0 = 12) is all padding */
  { 2, 5, 6 },
};
enum { N_CASES = (int)(sizeof cases / sizeof cases[0]) };
enum { BT = 7, C = 70 }; /* C spans two column blocks of the embedding backward */

static int shard_valid(int V, int v0, int Vl)
{
  int n = V - v0;
  return n < 0 ? 0 : n > Vl ? Vl : n;
}

/* Rows 0 and 3 are ignored (−1); the others have targets in every shard that has a real
 * column, in turn, and the last row has the last real token. */
static void make_targets(int *targets, const struct vocab_case *k, uint32_t *s)
{
  int Vl = k->Vp / k->tp, n_live = 0, live[16];
  for (int r = 0; r < k->tp; r++)
    if (shard_valid(k->V, r * Vl, Vl) > 0) live[n_live++] = r;
  int j = 0;
  for (int bt = 0; bt < BT; bt++) {
    if (bt == 0 || bt == 3) { targets[bt] = -1; continue; }
    int r = live[j++ % n_live], v0 = r * Vl;
    targets[bt] = v0 + rnd_int(s, shard_valid(k->V, v0, Vl));
  }
  targets[BT - 1] = k->V - 1;
}

/* Full logits (BT, Vp): real columns uniform in [−8, 8), padding columns 50. */
static void make_logits(real *logits, const struct vocab_case *k, uint32_t *s)
{
  for (int bt = 0; bt < BT; bt++)
    for (int v = 0; v < k->Vp; v++)
      logits[bt * k->Vp + v] = v < k->V ? 8.0f * rnd(s) : 50.0f;
}

static void copy_columns(real *dst, const real *src, int v0, int Vl, int Vp)
{
  for (int bt = 0; bt < BT; bt++)
    memcpy(dst + (size_t)bt * Vl, src + (size_t)bt * Vp + v0, (size_t)Vl * sizeof(real));
}

/* Tolerances, in units of U = REAL_U (real rounding: 2^-24 in fp32, 2^-53 in float64). The shard
 * path rounds each shard's Σ exp to real (stats is real: the allreduce payload) and adds tp of
 * them in real, where crossentropy_forward keeps Σ in double: Σ is off by up to tp·U relative,
 * so the loss by up to ~tp·U absolute (log Σ), however small the loss, and each prob by
 * (tp + 4)·U relative (Σ, the two casts of 1/Σ, the two products); each loss is also rounded to
 * real once on each path (U·|loss| each). Both paths sum ≤ V exps in double, ≤ V·DOUBLE_U
 * relative each (SUM_U: nothing in fp32, as much as the rest in float64). The bounds take twice
 * those. With Σ in real a loss of 0.01 can be 1e-5 off relatively and a prob near 1 two ulps
 * (1.2e-7) off: the test's seeds happen to stay under "relative 1e-6, absolute 1e-7", most
 * other seeds do not. A wrong reduction is off by O(1) (the teeth below). */
#define U REAL_U
#define SUM_U(V) (2 * (V) * DOUBLE_U)
static double max_loss_rel, max_loss_abs; /* measured maxima over all cases, printed at the end */
static double max_prob_err, max_prob_rel, max_dlogit_err;

/* Runs the three shard calls with the reductions in between; local_max_only skips the max
 * reduction (the deliberate bug). losses (tp, BT), probs (tp, BT, Vl). */
static void shard_forward(real *losses, real *probs, const real *logits_full,
                          const int *targets, const struct vocab_case *k, int local_max_only)
{
  const int tp = k->tp, Vl = k->Vp / tp;
  real *shard_logits = malloc((size_t)tp * BT * Vl * sizeof(real));
  real *stats = malloc((size_t)tp * 3 * BT * sizeof(real));
  for (int r = 0; r < tp; r++) {
    copy_columns(shard_logits + (size_t)r * BT * Vl, logits_full, r * Vl, Vl, k->Vp);
    crossentropy_shard_max(stats + r * 3 * BT, shard_logits + (size_t)r * BT * Vl, BT,
                           shard_valid(k->V, r * Vl, Vl), Vl);
  }
  if (!local_max_only)
    for (int bt = 0; bt < BT; bt++) {
      real m = -INFINITY;
      for (int r = 0; r < tp; r++) m = stats[r * 3 * BT + bt] > m ? stats[r * 3 * BT + bt] : m;
      for (int r = 0; r < tp; r++) stats[r * 3 * BT + bt] = m;
    }
  for (int r = 0; r < tp; r++)
    crossentropy_shard_sums(stats + r * 3 * BT, shard_logits + (size_t)r * BT * Vl, targets,
                            r * Vl, BT, shard_valid(k->V, r * Vl, Vl), Vl);
  for (int i = BT; i < 3 * BT; i++) { /* sum-reduce Σ exp and the target logit, in real */
    real sum = 0.0f;
    for (int r = 0; r < tp; r++) sum += stats[r * 3 * BT + i];
    for (int r = 0; r < tp; r++) stats[r * 3 * BT + i] = sum;
  }
  for (int r = 0; r < tp; r++)
    crossentropy_shard_finish(losses + r * BT, probs + (size_t)r * BT * Vl,
                              shard_logits + (size_t)r * BT * Vl, stats + r * 3 * BT, targets,
                              BT, shard_valid(k->V, r * Vl, Vl), Vl);
  free(shard_logits);
  free(stats);
}

static void crossentropy_shards_match_full_vocabulary(void)
{
  for (int ci = 0; ci < N_CASES; ci++) {
    const struct vocab_case *k = &cases[ci];
    const int tp = k->tp, Vp = k->Vp, V = k->V, Vl = Vp / tp;
    CHECK(Vl * tp == Vp);
    uint32_t s = 0x9e3779b9u + (uint32_t)ci;
    int targets[BT];
    real *logits = malloc((size_t)BT * Vp * sizeof(real));
    real *probs_full = malloc((size_t)BT * Vp * sizeof(real));
    real *dlogits_full = malloc((size_t)BT * Vp * sizeof(real));
    real *probs = malloc((size_t)tp * BT * Vl * sizeof(real));
    real *dlogits = malloc((size_t)BT * Vl * sizeof(real));
    real *probs_slice = malloc((size_t)BT * Vl * sizeof(real));
    real losses_full[BT], losses[16 * BT];
    make_targets(targets, k, &s);
    make_logits(logits, k, &s);

    crossentropy_forward(losses_full, probs_full, logits, targets, BT, V, Vp);
    shard_forward(losses, probs, logits, targets, k, 0);

    /* 1. losses: the same on every shard, equal to the full ones; probs column by column. */
    for (int r = 0; r < tp; r++)
      for (int bt = 0; bt < BT; bt++) {
        real l = losses[r * BT + bt], lf = losses_full[bt];
        if (targets[bt] < 0) {
          CHECK_MSG(l == 0.0f, "case %d shard %d row %d: ignored row loss %g", ci, r, bt, l);
          continue;
        }
        CHECK_MSG(l == losses[bt], "case %d shard %d row %d: shards disagree", ci, r, bt);
        double err = fabs((double)l - lf), rel = err / fabs((double)lf);
        if (rel > max_loss_rel) max_loss_rel = rel;
        if (err > max_loss_abs) max_loss_abs = err;
        CHECK_MSG(err <= 2 * (2 * U * fabs((double)lf) + tp * U + SUM_U(V)) + 16 * DOUBLE_U,
                  "case %d row %d: loss %.17g vs %.17g (rel %.3g)", ci, bt, l, lf, rel);
      }
    for (int r = 0; r < tp; r++) {
      const int v0 = r * Vl, valid = shard_valid(V, v0, Vl);
      for (int bt = 0; bt < BT; bt++)
        for (int i = 0; i < Vl; i++) {
          real p = probs[((size_t)r * BT + bt) * Vl + i], pf = probs_full[bt * Vp + v0 + i];
          if (i >= valid) {
            CHECK_MSG(p == 0.0f, "case %d shard %d: padding prob %g", ci, r, p);
            continue;
          }
          double err = fabs((double)p - pf);
          if (err > max_prob_err) max_prob_err = err;
          if (pf > 0.0f && err / pf > max_prob_rel) max_prob_rel = err / pf;
          CHECK_MSG(err <= 2 * ((tp + 4) * U + SUM_U(V)) * pf, "case %d shard %d [%d, %d]: prob "
                    "%.17g vs %.17g", ci, r, bt, v0 + i, p, pf);
        }
    }

    /* 2. backward: on the same probabilities exactly (the same element-wise operations on the
     * same numbers), on the shard's own probs within bounds. */
    const real scale = 1.0f / (BT - 2); /* two rows are ignored */
    crossentropy_backward(dlogits_full, probs_full, targets, scale, BT, V, Vp);
    for (int r = 0; r < tp; r++) {
      const int v0 = r * Vl, valid = shard_valid(V, v0, Vl);
      copy_columns(probs_slice, probs_full, v0, Vl, Vp);
      crossentropy_shard_backward(dlogits, probs_slice, targets, v0, scale, BT, valid, Vl);
      for (int bt = 0; bt < BT; bt++)
        CHECK_MSG(memcmp(dlogits + bt * Vl, dlogits_full + bt * Vp + v0, Vl * sizeof(real)) == 0,
                  "case %d shard %d row %d: dlogits differ from the full ones", ci, r, bt);
      crossentropy_shard_backward(dlogits, probs + (size_t)r * BT * Vl, targets, v0, scale, BT,
                                  valid, Vl);
      for (int bt = 0; bt < BT; bt++)
        for (int i = 0; i < Vl; i++) {
          real d = dlogits[bt * Vl + i], df = dlogits_full[bt * Vp + v0 + i];
          if (i >= valid || targets[bt] < 0) {
            CHECK_MSG(d == 0.0f, "case %d shard %d [%d, %d]: dlogit %g, want 0", ci, r, bt,
                      v0 + i, d);
            continue;
          }
          double err = fabs((double)d - df);
          if (err > max_dlogit_err) max_dlogit_err = err;
          double pf = probs_full[bt * Vp + v0 + i];
          CHECK_MSG(err <= scale * 2 * ((tp + 4) * U + SUM_U(V)) * pf + 2 * U * fabs((double)df),
                    "case %d shard %d [%d, %d]: dlogit %.9g vs %.9g", ci, r, bt,
                    v0 + i, d, df);
        }
    }

    /* Teeth: without the max reduction the losses are far off. */
    shard_forward(losses, probs, logits, targets, k, 1);
    double worst = 0.0;
    for (int r = 0; r < tp; r++)
      for (int bt = 0; bt < BT; bt++)
        if (targets[bt] >= 0) {
          double rel = fabs((double)losses[r * BT + bt] - losses_full[bt]) / losses_full[bt];
          worst = rel > worst || isnan(rel) ? rel : worst;
        }
    CHECK_MSG(!(worst <= 1e-3), "case %d: a reduction with local maxima passed (rel %.3g)", ci,
              worst);

    free(logits);
    free(probs_full);
    free(dlogits_full);
    free(probs);
    free(dlogits);
    free(probs_slice);
  }
  printf("max errors: loss rel %.3g (abs %.3g = %.3g U), prob abs %.3g (rel %.3g = %.3g U), "
         "dlogit abs %.3g\n", max_loss_rel, max_loss_abs, max_loss_abs / U, max_prob_err,
         max_prob_rel, max_prob_rel / U, max_dlogit_err);
}

static void encoder_shards_match_full_table(void)
{
  enum { GUARD = 2 }; /* rows of sentinels around each shard's dwte */
  for (int ci = 0; ci < N_CASES; ci++) {
    const struct vocab_case *k = &cases[ci];
    const int tp = k->tp, Vp = k->Vp, Vl = Vp / tp;
    uint32_t s = 0x1234567u + (uint32_t)ci;
    /* Tokens in every shard (padding rows too: the table has Vp rows), one repeated. */
    int tokens[BT];
    for (int bt = 0; bt < BT; bt++) tokens[bt] = (bt % tp) * Vl + rnd_int(&s, Vl);
    tokens[BT - 2] = tokens[1];
    tokens[BT - 1] = Vp - 1;
    real *wte = malloc((size_t)Vp * C * sizeof(real));
    real *dwte_full = malloc((size_t)Vp * C * sizeof(real));
    real *dwte_init = malloc((size_t)Vp * C * sizeof(real));
    real *dwte = malloc((size_t)(Vl + 2 * GUARD) * C * sizeof(real));
    real *dout = malloc((size_t)BT * C * sizeof(real));
    real out_full[BT * C], out[BT * C], out_sum[BT * C];
    for (int i = 0; i < Vp * C; i++) wte[i] = rnd(&s);
    for (int i = 0; i < Vp * C; i++) dwte_init[i] = dwte_full[i] = rnd(&s);
    for (int i = 0; i < BT * C; i++) dout[i] = rnd(&s);

    /* 3a. forward: each shard fills its own tokens' rows and zeros; the sum is the full.
     * Bitwise: copies, and x + 0 = x. */
    encoder_forward(out_full, tokens, wte, BT, C);
    memset(out_sum, 0, sizeof out_sum);
    for (int r = 0; r < tp; r++) {
      const int v0 = r * Vl;
      for (int i = 0; i < BT * C; i++) out[i] = NAN;
      encoder_forward_shard(out, tokens, wte + (size_t)v0 * C, v0, Vl, BT, C);
      for (int bt = 0; bt < BT; bt++) {
        int mine = tokens[bt] >= v0 && tokens[bt] < v0 + Vl;
        for (int c = 0; c < C; c++) {
          real o = out[bt * C + c];
          CHECK_MSG(mine ? o == out_full[bt * C + c] : o == 0.0f,
                    "case %d shard %d row %d col %d: %g", ci, r, bt, c, o);
        }
      }
      for (int i = 0; i < BT * C; i++) out_sum[i] += out[i];
    }
    CHECK_MSG(memcmp(out_sum, out_full, sizeof out_sum) == 0, "case %d: Σ shards ≠ full", ci);

    /* 3b. backward: each shard accumulates exactly its rows of the full gradient (bitwise: the
     * same additions into the same rows in the same token order). */
    encoder_backward(dwte_full, dout, tokens, BT, C);
    for (int r = 0; r < tp; r++) {
      const int v0 = r * Vl;
      for (int i = 0; i < (Vl + 2 * GUARD) * C; i++) dwte[i] = -777.0f;
      real *mine = dwte + GUARD * C;
      memcpy(mine, dwte_init + (size_t)v0 * C, (size_t)Vl * C * sizeof(real));
      encoder_backward_shard(mine, dout, tokens, v0, Vl, BT, C);
      CHECK_MSG(memcmp(mine, dwte_full + (size_t)v0 * C, (size_t)Vl * C * sizeof(real)) == 0,
                "case %d shard %d: dwte rows differ from the full gradient's", ci, r);
      int guards_intact = 1;
      for (int i = 0; i < GUARD * C; i++)
        guards_intact &= dwte[i] == -777.0f && mine[Vl * C + i] == -777.0f;
      CHECK_MSG(guards_intact, "case %d shard %d: wrote outside its rows", ci, r);
    }
    /* Teeth: the full gradient did change the rows (so the comparison above means something). */
    CHECK(memcmp(dwte_full, dwte_init, (size_t)Vp * C * sizeof(real)) != 0);

    free(wte);
    free(dwte_full);
    free(dwte_init);
    free(dwte);
    free(dout);
  }
}

TEST_MAIN(TEST(crossentropy_shards_match_full_vocabulary),
          TEST(encoder_shards_match_full_table))
