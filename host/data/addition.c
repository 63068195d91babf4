/* The synthetic addition corpus (see addition.h for the exact definition). Everything is a pure
 * function of (data seed, index): no state, no list of problems, any window in O(S). */
#include "addition.h"

#include <stdio.h>

#include "data/tokens.h"
#include "philox.h"

int addition_check_vocab(int vocab, char *err, size_t err_size)
{
  if (vocab >= ADDITION_MIN_VOCAB) return 0;
  if (err && err_size)
    snprintf(err, err_size, "data.synthetic = \"addition\": vocab %d is too small: the corpus is "
             "byte-level ('=' is token 61), so it needs vocab >= %d", vocab, ADDITION_MIN_VOCAB);
  return -1;
}

static bool pair_held_out(uint32_t n, uint64_t data_seed)
{
  return tokens_permute(n, ADDITION_N_PAIRS, data_seed, ADDITION_HOLD_OUT_STREAM) <
         ADDITION_N_HELD_OUT;
}

bool addition_is_held_out(int a, int b, uint64_t data_seed)
{
  return pair_held_out((uint32_t)(a * 1000 + b), data_seed);
}

void addition_train_problem(uint64_t i, uint64_t data_seed, int *a, int *b)
{
  const uint32_t key[2] = { (uint32_t)data_seed, (uint32_t)(data_seed >> 32) };
  for (uint32_t attempt = 0;; attempt++) {
    const uint32_t ctr[4] = { (uint32_t)i, (uint32_t)(i >> 32), attempt, ADDITION_TRAIN_TAG };
    uint32_t out[4];
    philox4x32_10(ctr, key, out);
    for (int k = 0; k < 4; k++) {
      uint32_t n = (uint32_t)(((uint64_t)out[k] * ADDITION_N_PAIRS) >> 32);
      if (!pair_held_out(n, data_seed)) {
        *a = (int)(n / 1000);
        *b = (int)(n % 1000);
        return;
      }
    }
  }
}

static void put_digits(char *out, int value, int n_digits)
{
  for (int d = n_digits - 1; d >= 0; d--) {
    out[d] = (char)('0' + value % 10);
    value /= 10;
  }
}

void addition_format(int a, int b, char out[ADDITION_PROBLEM_BYTES])
{
  put_digits(out, a, 3);
  out[3] = '+';
  put_digits(out + 4, b, 3);
  out[7] = '=';
  put_digits(out + 8, a + b, 4);
  out[12] = '\n';
}

/* Problem i of a stream: its operands. */
typedef void (*problem_fn)(uint64_t i, uint64_t data_seed, int *a, int *b);

static void held_out_problem(uint64_t j, uint64_t data_seed, int *a, int *b)
{
  uint64_t n = tokens_unpermute(j % ADDITION_N_HELD_OUT, ADDITION_N_PAIRS, data_seed,
                                ADDITION_HOLD_OUT_STREAM);
  *a = (int)(n / 1000);
  *b = (int)(n % 1000);
}

/* Tokens [w·S, w·S + S + 1) of the concatenation of problems 0, 1, ... of `problem`. */
static void stream_window(problem_fn problem, uint64_t window, int seq_len, uint64_t data_seed,
                          int *inputs, int *targets)
{
  uint64_t start = window * (uint64_t)seq_len;
  uint64_t index = start / ADDITION_PROBLEM_BYTES;
  int at = (int)(start % ADDITION_PROBLEM_BYTES);
  char text[ADDITION_PROBLEM_BYTES];
  int a, b;
  problem(index, data_seed, &a, &b);
  addition_format(a, b, text);
  for (int t = 0; t <= seq_len; t++) {
    if (at == ADDITION_PROBLEM_BYTES) {
      problem(++index, data_seed, &a, &b);
      addition_format(a, b, text);
      at = 0;
    }
    int token = (unsigned char)text[at++];
    if (t < seq_len && inputs) inputs[t] = token;
    if (t > 0 && targets) targets[t - 1] = token;
  }
}

void addition_window(uint64_t window, int seq_len, uint64_t data_seed, int *inputs, int *targets)
{
  stream_window(addition_train_problem, window, seq_len, data_seed, inputs, targets);
}

void addition_val_window(uint64_t window, int seq_len, uint64_t data_seed, int *inputs,
                         int *targets)
{
  stream_window(held_out_problem, window, seq_len, data_seed, inputs, targets);
}

void addition_eval_problem(uint64_t j, uint64_t data_seed, int prompt_tokens[ADDITION_PROMPT_TOKENS],
                           int answer_tokens[ADDITION_ANSWER_TOKENS])
{
  int a, b;
  held_out_problem(j, data_seed, &a, &b);
  char text[ADDITION_PROBLEM_BYTES];
  addition_format(a, b, text);
  for (int k = 0; k < ADDITION_PROMPT_TOKENS; k++) prompt_tokens[k] = (unsigned char)text[k];
  for (int k = 0; k < ADDITION_ANSWER_TOKENS; k++)
    answer_tokens[k] = (unsigned char)text[ADDITION_PROMPT_TOKENS + k];
}
