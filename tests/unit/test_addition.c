/* The addition corpus: windows are slices of one stream (any S, any window, overlaps agree,
 * targets shifted by one), the stream parses as correct sums, held-out pairs (exactly 10%)
 * never appear in training, evaluation enumerates the held-out set, validation windows slice
 * the held-out problems in order, and everything is a function of the seed alone. */
#include "check.h"
#include "data/addition.h"

#include <stdint.h>
#include <stdlib.h>

static char err[512];

/* The first n_problems problems of the stream, built problem by problem. */
static char *reference_stream(int n_problems, uint64_t seed)
{
  char *s = malloc((size_t)n_problems * ADDITION_PROBLEM_BYTES);
  for (int i = 0; i < n_problems; i++) {
    int a, b;
    addition_train_problem((uint64_t)i, seed, &a, &b);
    addition_format(a, b, s + (size_t)i * ADDITION_PROBLEM_BYTES);
  }
  return s;
}

static void windows_are_slices_of_one_stream(void)
{
  const int n_problems = 400;
  char *ref = reference_stream(n_problems, 11);
  const int lengths[] = { 1, 7, 13, 64, 100 };
  int inputs[100], targets[100];
  for (int c = 0; c < 5; c++) {
    int S = lengths[c];
    for (uint64_t w = 0; (w + 1) * (uint64_t)S + 1 <= (uint64_t)n_problems * 13; w++) {
      addition_window(w, S, 11, inputs, targets);
      int ok = 1;
      for (int t = 0; t < S; t++) {
        ok &= inputs[t] == (unsigned char)ref[w * (uint64_t)S + (uint64_t)t];
        ok &= targets[t] == (unsigned char)ref[w * (uint64_t)S + (uint64_t)t + 1];
        if (t + 1 < S) ok &= targets[t] == inputs[t + 1];
      }
      CHECK_MSG(ok, "S = %d, window %llu", S, (unsigned long long)w);
    }
  }
  /* Consecutive windows meet: the last target of w is the first input of w + 1. */
  int next[64];
  addition_window(1000001, 64, 11, inputs, targets);
  addition_window(1000002, 64, 11, next, NULL);
  CHECK(targets[63] == next[0]);
  free(ref);
}

static int digits(const int *t, int n)
{
  int v = 0;
  for (int k = 0; k < n; k++) {
    if (t[k] < '0' || t[k] > '9') return -1;
    v = v * 10 + t[k] - '0';
  }
  return v;
}

static void stream_parses_as_correct_zero_padded_sums(void)
{
  /* 13·50 tokens per window, so window w holds problems 50w .. 50w + 49 exactly. */
  static int t[650];
  int bad = 0, max_token = 0, sum_a = 0, count = 0;
  for (uint64_t w = 0; w < 200; w++) {
    addition_window(w, 650, 5, t, NULL);
    for (int p = 0; p < 50; p++) {
      const int *q = t + 13 * p;
      int a = digits(q, 3), b = digits(q + 4, 3), s = digits(q + 8, 4);
      if (a < 0 || b < 0 || s < 0 || q[3] != '+' || q[7] != '=' || q[12] != '\n' || a + b != s)
        bad++;
      sum_a += a;
      count++;
    }
    for (int k = 0; k < 650; k++) if (t[k] > max_token) max_token = t[k];
  }
  CHECK(bad == 0);
  CHECK(max_token < ADDITION_MIN_VOCAB);
  /* a is uniform on 0..999: sd 288.7, over 10,000 problems a standard error of 2.9; 10 is 3.5 of
   * them (a draw that stayed in 0..499 would be off by 250). */
  CHECK_NEAR((double)sum_a / count, 499.5, 10.0);
  char text[13];
  addition_format(7, 45, text);
  CHECK(memcmp(text, "007+045=0052\n", 13) == 0);
  addition_format(999, 999, text);
  CHECK(memcmp(text, "999+999=1998\n", 13) == 0);
}

static void held_out_pairs_are_ten_percent_and_never_trained_on(void)
{
  char *held = calloc(ADDITION_N_PAIRS, 1);
  int n_held = 0;
  for (int n = 0; n < ADDITION_N_PAIRS; n++) {
    held[n] = addition_is_held_out(n / 1000, n % 1000, 3);
    n_held += held[n];
  }
  CHECK(n_held == ADDITION_N_HELD_OUT);
  int leaks = 0;
  for (uint64_t i = 0; i < 200000; i++) {
    int a, b;
    addition_train_problem(i, 3, &a, &b);
    leaks += held[a * 1000 + b];
  }
  CHECK(leaks == 0);
  /* The same through the windows: no held-out problem in the first 20,000 problems' text. */
  static int t[13 * 100];
  leaks = 0;
  for (uint64_t w = 0; w < 200; w++) {
    addition_window(w, 13 * 100, 3, t, NULL);
    for (int p = 0; p < 100; p++) leaks += held[digits(t + 13 * p, 3) * 1000 + digits(t + 13 * p + 4, 3)];
  }
  CHECK(leaks == 0);

  /* Evaluation enumerates exactly the held-out set, each pair once per cycle. */
  char *seen = calloc(ADDITION_N_PAIRS, 1);
  int bad = 0;
  for (uint64_t j = 0; j < ADDITION_N_HELD_OUT; j++) {
    int prompt[8], answer[5];
    addition_eval_problem(j, 3, prompt, answer);
    int a = digits(prompt, 3), b = digits(prompt + 4, 3), s = digits(answer, 4);
    if (a < 0 || b < 0 || prompt[3] != '+' || prompt[7] != '=' || answer[4] != '\n' || s != a + b ||
        !held[a * 1000 + b] || seen[a * 1000 + b])
      bad++;
    else
      seen[a * 1000 + b] = 1;
  }
  CHECK(bad == 0);
  int p1[8], p2[8], a1[5], a2[5];
  addition_eval_problem(17, 3, p1, a1);
  addition_eval_problem(17 + ADDITION_N_HELD_OUT, 3, p2, a2);
  CHECK(memcmp(p1, p2, sizeof p1) == 0 && memcmp(a1, a2, sizeof a1) == 0);
  free(seen);
  free(held);
}

static void everything_is_a_function_of_the_seed(void)
{
  int x[256], y[256], z[256];
  addition_window(12345, 256, 77, x, NULL);
  addition_window(12345, 256, 77, y, NULL);
  addition_window(12345, 256, 78, z, NULL);
  CHECK(memcmp(x, y, sizeof x) == 0);
  CHECK(memcmp(x, z, sizeof x) != 0);
  int p[8], q[8], ans[5];
  addition_eval_problem(0, 77, p, ans);
  addition_eval_problem(0, 78, q, ans);
  CHECK(memcmp(p, q, sizeof p) != 0);
  /* The held-out sets of two seeds overlap about as much as independent 10% samples (10%). */
  int both = 0;
  for (int n = 0; n < ADDITION_N_PAIRS; n += 7)
    both += addition_is_held_out(n / 1000, n % 1000, 77) && addition_is_held_out(n / 1000, n % 1000, 78);
  /* 142,858 pairs, each held out by both with probability 0.01: standard error 2.6e-4, so 0.003
   * is 11 of them; the same held-out set for both seeds would give 0.1. */
  CHECK_NEAR(both / (ADDITION_N_PAIRS / 7.0), 0.01, 0.003);
}

static void vocab_too_small_is_refused_with_the_vocab_needed(void)
{
  CHECK(addition_check_vocab(62, err, sizeof err) == 0);
  CHECK(addition_check_vocab(50257, err, sizeof err) == 0);
  CHECK(addition_check_vocab(61, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "vocab 61 is too small");
  CHECK_STR_CONTAINS(err, "needs vocab >= 62");
}

static void val_windows_are_slices_of_the_held_out_problems_in_order(void)
{
  /* The reference: held-out problems 0 .. 199 through addition_eval_problem, concatenated. */
  enum { N = 200 };
  static int ref[N * ADDITION_PROBLEM_BYTES];
  for (int j = 0; j < N; j++) {
    int *q = ref + j * ADDITION_PROBLEM_BYTES;
    addition_eval_problem((uint64_t)j, 9, q, q + ADDITION_PROMPT_TOKENS);
    CHECK(addition_is_held_out(digits(q, 3), digits(q + 4, 3), 9));
  }
  const int lengths[] = { 1, 12, 13, 64 };
  int inputs[64], targets[64];
  for (int c = 0; c < 4; c++) {
    int S = lengths[c];
    for (uint64_t w = 0; (w + 1) * (uint64_t)S + 1 <= (uint64_t)N * 13; w++) {
      addition_val_window(w, S, 9, inputs, targets);
      int ok = 1;
      for (int t = 0; t < S; t++) {
        ok &= inputs[t] == ref[w * (uint64_t)S + (uint64_t)t];
        ok &= targets[t] == ref[w * (uint64_t)S + (uint64_t)t + 1];
      }
      CHECK_MSG(ok, "S = %d, window %llu", S, (unsigned long long)w);
    }
  }
  /* Not the training stream, and a function of the seed. */
  int train[64], other[64];
  addition_window(0, 64, 9, train, NULL);
  addition_val_window(0, 64, 10, other, NULL);
  addition_val_window(0, 64, 9, inputs, NULL);
  CHECK(memcmp(train, inputs, sizeof train) != 0);
  CHECK(memcmp(other, inputs, sizeof other) != 0);
}

TEST_MAIN(TEST(windows_are_slices_of_one_stream),
          TEST(stream_parses_as_correct_zero_padded_sums),
          TEST(held_out_pairs_are_ten_percent_and_never_trained_on),
          TEST(everything_is_a_function_of_the_seed),
          TEST(vocab_too_small_is_refused_with_the_vocab_needed),
          TEST(val_windows_are_slices_of_the_held_out_problems_in_order))
