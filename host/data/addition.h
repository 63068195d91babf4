/* The built-in synthetic corpus: three-digit additions, byte-level, so a run needs no download.
 *
 * A problem is 13 bytes, "ddd+ddd=dddd\n" (a, b in 0..999, the sum zero-padded to 4 digits,
 * e.g. "007+045=0052\n"); a token id is the byte value, so the vocab must be >= 62 ('=' is 61).
 * Exactly 10% of the 10^6 (a, b) pairs are held out for evaluation: the pair n = a·1000 + b is
 * held out iff tokens_permute(n, 10^6, seed, ADDITION_HOLD_OUT_STREAM) < 10^5, that is, a keyed
 * pseudo-random permutation puts it in bucket 0 of 10 equal buckets. The j-th held-out problem
 * is the inverse permutation at j, so evaluation needs no list.
 *
 * The training stream is the endless concatenation of training problems. Problem i reads the
 * Philox block keyed by the data seed at counter (i low 32, i high 32, attempt, ADDITION_TRAIN_TAG)
 * for attempt = 0, 1, ...; each of the block's 4 words in order gives a pair n = floor(word ·
 * 10^6 / 2^32) (uniform up to a bias below 2^-12); the first pair that is not held out is
 * problem i. A held-out draw is thus redrawn from the next word, then the next block.
 * Window w (w = step·G + k, as for token files) is stream tokens [w·S, w·S + S + 1): inputs
 * the first S, targets shifted by one; computed in O(S) (w·S + S + 1 must fit in 64 bits).
 * Validation windows (addition_val_window) are the same slices of the held-out problems' stream. */
#ifndef TYCHO_DATA_ADDITION_H
#define TYCHO_DATA_ADDITION_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ADDITION_PROBLEM_BYTES 13
#define ADDITION_PROMPT_TOKENS 8       /* "ddd+ddd=" */
#define ADDITION_ANSWER_TOKENS 5       /* "dddd\n" */
#define ADDITION_MIN_VOCAB 62
#define ADDITION_N_PAIRS 1000000
#define ADDITION_N_HELD_OUT 100000
#define ADDITION_HOLD_OUT_STREAM 0x6164642d686f6c64ull /* "add-hold" */
#define ADDITION_TRAIN_TAG 0x61646474u                 /* "addt" */

/* 0 if vocab can hold the corpus' bytes; otherwise an error naming the vocab needed. */
int addition_check_vocab(int vocab, char *err, size_t err_size);
bool addition_is_held_out(int a, int b, uint64_t data_seed);
/* The operands of training problem i (never a held-out pair). */
void addition_train_problem(uint64_t i, uint64_t data_seed, int *a, int *b);
/* The 13 bytes of the problem a + b. */
void addition_format(int a, int b, char out[ADDITION_PROBLEM_BYTES]);
/* inputs[t] = stream[w·S + t], targets[t] = stream[w·S + t + 1] for t < S; either may be NULL. */
void addition_window(uint64_t window, int seq_len, uint64_t data_seed, int *inputs, int *targets);
/* The validation stream: the held-out problems in the order of addition_eval_problem (j = 0,
 * 1, ...), concatenated; window w is its tokens [w·S, w·S + S + 1), as in addition_window. */
void addition_val_window(uint64_t window, int seq_len, uint64_t data_seed, int *inputs,
                         int *targets);
/* The j-th held-out problem (j taken mod ADDITION_N_HELD_OUT, each pair once per cycle):
 * prompt "ddd+ddd=" and expected answer "dddd\n", as token ids. */
void addition_eval_problem(uint64_t j, uint64_t data_seed, int prompt_tokens[ADDITION_PROMPT_TOKENS],
                           int answer_tokens[ADDITION_ANSWER_TOKENS]);

#endif
