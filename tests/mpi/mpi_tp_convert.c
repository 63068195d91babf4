/* Every tensor-parallel layout conversion (runtime/parallel/tp.h) against the unsharded tensor, on a TP
 * group of all ranks. A (B, T, X) tensor of small multiples of 1/4 (so every sum, in real or in
 * double, is exact in any order, and the comparisons are bitwise in both builds) is put in
 * each layout — R: the whole on every rank; P: parts that sum to it; S(seq): this rank's
 * positions; S(feat): this rank's columns — and converted into every layout tp_convert_op
 * allows; the result must be, bit for bit, the target layout's form of the same tensor (R → P
 * keeps it on rank 0 and zeroes the others). Since the backward of a conversion is the conversion
 * of the gradient from the layout it arrives in to the dual of the source layout, these pairs
 * cover the backward duals too. Each conversion must issue exactly the collective
 * tp_op_comm names (the counters move by one call of it and nothing else): what `tycho check`
 * bills is what runs. The KV-head expansion is checked against the whole tensor and against its
 * adjoint: Σ_r ⟨expand(x), y_r⟩ = ⟨x, Σ_r expand_backward(y_r)⟩.
 * The bf16 wire (a bf16 model's: wire_bf16) runs every conversion again: the values are bf16's
 * too (at most 6 significant bits), so each must again give the target's form bit for bit, with
 * the same calls and half the bytes of the real wire (2-byte elements; the real wire moves the
 * runtime's reals). A tensor bf16 cannot hold then shows what the wire does to it: every rank
 * ends with the same values, each the bf16 rounding of the target's (a gather), or within one
 * bf16 rounding of the sum of the ranks' rounded parts (a reduction, which adds in fp32 and
 * rounds each combination once). The float64 build has no bf16 mode (its kernel table has no bf16
 * entries) and skips these two.
 *
 * Usage: mpi_tp_convert   (any number of ranks ≥ 2: they form one TP group) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "comm/comm.h"
#include "mpi_check.h"
#include "ops.h"
#include "layout/tp_layout.h"
#include "runtime/parallel/tp.h"

static int rank, tp;
static struct model_tp group;
static char err[1024];

enum { B = 2 };
static int T, X; /* multiples of tp */

static real whole(size_t i) { return (real)((int)(i % 17) - 8) + 0.25f * (real)(i % 4); }
static real part(size_t i) { return (real)((int)(i % 5) - 2); }

/* The tensor in layout l as rank `rank` holds it. */
static void form(real *out, enum tp_layout l)
{
  const size_t n = (size_t)B * T * X;
  switch (l) {
  case TP_R:
    for (size_t i = 0; i < n; i++) out[i] = whole(i);
    break;
  case TP_P: /* rank 0: whole − (tp − 1)·part, the others: part */
    for (size_t i = 0; i < n; i++) out[i] = rank == 0 ? whole(i) - (real)(tp - 1) * part(i) : part(i);
    break;
  case TP_SEQ: {
    const int Tl = T / tp;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        for (int x = 0; x < X; x++)
          out[((size_t)b * Tl + t) * X + x] = whole(((size_t)b * T + (size_t)(rank * Tl + t)) * X + x);
    break;
  }
  case TP_FEAT: {
    const int Xl = X / tp;
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
      for (int x = 0; x < Xl; x++) out[bt * Xl + x] = whole(bt * X + (size_t)(rank * Xl + x));
    break;
  }
  default:
    break;
  }
}

/* The bytes the comm layer counted since `before`, over every op. */
static uint64_t bytes_since(const struct comm_counter before[COMM_N_OPS])
{
  uint64_t b = 0;
  for (int k = 0; k < COMM_N_OPS; k++) b += comm_counter_get(group.group, (enum comm_op)k).n_bytes - before[k].n_bytes;
  return b;
}

static uint64_t real_bytes[4][4]; /* each pair's bytes on the real wire */

static void every_conversion(int wire_bf16)
{
  group.wire_bf16 = wire_bf16;
  const size_t n = (size_t)B * T * X;
  real *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out), *want = malloc(n * sizeof *want);
  real *pack = malloc(n * sizeof *pack), *tmp = malloc(n * sizeof *tmp);
  static const enum tp_layout layouts[] = { TP_R, TP_P, TP_SEQ, TP_FEAT };
  int tried = 0;
  for (int a = 0; a < 4; a++)
    for (int c = 0; c < 4; c++) {
      enum tp_layout from = layouts[a], to = layouts[c];
      enum tp_op op = tp_convert_op(from, to);
      if (op == TP_OP_INVALID)
        continue;
      tried++;
      form(in, from);
      memset(out, 0xff, n * sizeof *out); /* NaNs: what the conversion does not write shows */
      struct comm_counter before[COMM_N_OPS];
      for (int k = 0; k < COMM_N_OPS; k++) before[k] = comm_counter_get(group.group, (enum comm_op)k);
      tp_convert(&group, pack, out, in, from, to, B, T, X, tmp);
      CHECK_MSG(!group.own_fault.set, "%s", group.own_fault.msg);
      /* the comm layer's bytes: the real wire's are the runtime's reals; the bf16 wire moves the
       * same elements in 2 bytes each */
      const uint64_t moved = bytes_since(before);
      if (!wire_bf16)
        real_bytes[a][c] = moved;
      else
        CHECK_MSG(moved * sizeof(real) == real_bytes[a][c] * sizeof(bf16), "%s -> %s: %llu bytes on the bf16 wire, "
                  "the real wire's %llu", tp_layout_name(from), tp_layout_name(to), (unsigned long long)moved,
                  (unsigned long long)real_bytes[a][c]);
      CHECK_MSG((moved > 0) == (tp_op_comm(op) >= 0), "%s -> %s: %llu bytes moved", tp_layout_name(from),
                tp_layout_name(to), (unsigned long long)moved);
      if (op == TP_OP_KEEP_RANK0) {
        if (rank == 0)
          form(want, TP_R);
        else
          memset(want, 0, n * sizeof *want);
      } else {
        form(want, to);
      }
      size_t n_out = tp_local_elems(to, B, T, X, tp);
      CHECK_MSG(memcmp(out, want, n_out * sizeof *out) == 0, "rank %d: %s -> %s (%s) differs from the "
                "target layout's form", rank, tp_layout_name(from), tp_layout_name(to), tp_op_name(op));
      for (int k = 0; k < COMM_N_OPS; k++) {
        uint64_t calls = comm_counter_get(group.group, (enum comm_op)k).calls - before[k].calls;
        uint64_t expect = k == tp_op_comm(op) ? 1 : 0;
        CHECK_MSG(calls == expect, "%s -> %s: %llu %s calls, expected %llu", tp_layout_name(from),
                  tp_layout_name(to), (unsigned long long)calls, comm_op_name((enum comm_op)k),
                  (unsigned long long)expect);
      }
      /* in place, where the sizes allow */
      if (op == TP_OP_ALL_REDUCE || op == TP_OP_KEEP_RANK0 || op == TP_OP_NONE) {
        form(in, from);
        tp_convert(&group, pack, in, in, from, to, B, T, X, tmp);
        CHECK_MSG(memcmp(in, want, n_out * sizeof *in) == 0, "%s -> %s in place", tp_layout_name(from),
                  tp_layout_name(to));
      }
    }
  CHECK(tried == 14); /* 16 pairs less S(seq) → P and S(feat) → P */
  if (rank == 0)
    printf("%d conversions on %d ranks on the %s wire, each equal to the target layout's form bit for bit\n",
           tried, tp, wire_bf16 ? "bf16" : "real");
  free(in);
  free(out);
  free(want);
  free(pack);
  free(tmp);
}

static void test_every_conversion(void)
{
  every_conversion(0);
}

/* Whether the kernel table has the bf16 entries the wire uses (the float64 build has no bf16 mode:
 * there the wire is never on, and these tests say so and pass). */
static int has_bf16_wire(void)
{
  if (kernel_ops_cpu.round_bf16 && kernel_ops_cpu.widen_bf16)
    return 1;
  /* only the float64 build may lack them */
  CHECK_MSG(REAL_IS_DOUBLE, "this fp32 build's kernel table has no round_bf16 or widen_bf16");
  if (rank == 0)
    printf("no bf16 entries in this build's kernel table (no bf16 mode): the bf16 wire is never used\n");
  return 0;
}

static void test_every_conversion_bf16_wire(void)
{
  if (!has_bf16_wire())
    return;
  every_conversion(1);
  group.wire_bf16 = 0;
}

/* Values bf16 cannot hold (1 + k · 2^-12 and the like: 13 significant bits) through the bf16 wire:
 * a gather gives every rank the bf16 rounding of the whole; an all-reduce and a reduce-scatter the
 * sum of the ranks' rounded parts, within one rounding per combination (tp − 1 of them; on two
 * ranks the sum of two such bf16 values is exact in fp32, so exactly its rounding) — the same bits
 * on every rank. */
static real odd(size_t i) { return (real)(1.0 + (double)(i % 13 + 1) / 4096.0) * (i % 3 == 0 ? -1 : 1); }
static real odd_part(size_t i, int r) { return odd(i * 5 + (size_t)r * 7) * (real)(r + 1); }

static void test_bf16_wire_rounds(void)
{
  if (!has_bf16_wire())
    return;
  const size_t n = (size_t)B * T * X;
  real *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out), *pack = malloc(n * sizeof *pack);
  real *all = malloc((size_t)tp * n * sizeof *all);
  bf16 *b = malloc(n * sizeof *b);
  real *r1 = malloc(n * sizeof *r1), *sum = malloc(n * sizeof *sum);
  group.wire_bf16 = 1;
  /* S(feat) → R: all-gather */
  const int Xl = X / tp;
  for (size_t bt = 0; bt < (size_t)B * T; bt++)
    for (int x = 0; x < Xl; x++) in[bt * Xl + x] = odd(bt * X + (size_t)(rank * Xl + x));
  tp_convert(&group, pack, out, in, TP_FEAT, TP_R, B, T, X, NULL);
  for (size_t i = 0; i < n; i++) r1[i] = odd(i);
  kernel_ops_cpu.round_bf16(NULL, b, r1, n);
  kernel_ops_cpu.widen_bf16(NULL, r1, b, n);
  CHECK_MSG(memcmp(out, r1, n * sizeof *out) == 0, "rank %d: the gathered tensor is not the bf16 rounding of the whole",
            rank);
  size_t changed = 0;
  for (size_t i = 0; i < n; i++) changed += r1[i] != odd(i);
  CHECK(changed > n / 2); /* the rounding shows: most values moved */
  /* P → R: all-reduce; P → S(seq): reduce-scatter */
  for (size_t i = 0; i < n; i++) in[i] = odd_part(i, rank);
  tp_convert(&group, pack, out, in, TP_P, TP_R, B, T, X, NULL);
  MPI_Allgather(out, (int)(n * sizeof *out), MPI_BYTE, all, (int)(n * sizeof *out), MPI_BYTE, MPI_COMM_WORLD);
  for (int r = 1; r < tp; r++)
    CHECK_MSG(memcmp(all, all + (size_t)r * n, n * sizeof *all) == 0, "the all-reduce's bits differ on rank %d", r);
  for (size_t i = 0; i < n; i++) sum[i] = 0;
  for (int r = 0; r < tp; r++) {
    for (size_t i = 0; i < n; i++) r1[i] = odd_part(i, r);
    kernel_ops_cpu.round_bf16(NULL, b, r1, n);
    kernel_ops_cpu.widen_bf16(NULL, r1, b, n);
    for (size_t i = 0; i < n; i++) sum[i] += r1[i];
  }
  if (tp == 2) {
    kernel_ops_cpu.round_bf16(NULL, b, sum, n);
    kernel_ops_cpu.widen_bf16(NULL, r1, b, n);
    CHECK_MSG(memcmp(out, r1, n * sizeof *out) == 0, "two ranks: the all-reduce is not the rounded sum");
  }
  /* each combination rounds once, by at most 2^-9 of its value (round to nearest), and no partial
   * sum exceeds Σ |part|: so within (tp − 1) · 2^-9 of Σ |part| */
  int bound_ok = 1;
  double worst = 0; /* the largest |out − sum| / Σ |part| */
  for (size_t i = 0; i < n; i++) {
    double mag = 0;
    for (int r = 0; r < tp; r++) mag += fabs((double)odd_part(i, r));
    double e = fabs((double)out[i] - (double)sum[i]) / mag;
    worst = e > worst ? e : worst;
    if (e > (tp - 1) / 512.0)
      bound_ok = 0;
  }
  CHECK_MSG(bound_ok, "the all-reduce is further than one bf16 rounding per combination from the sum");
  const int Tl = T / tp;
  tp_convert(&group, pack, out, in, TP_P, TP_SEQ, B, T, X, NULL);
  for (int bb = 0; bb < B; bb++)
    for (int t = 0; t < Tl; t++)
      for (int x = 0; x < X; x++) {
        size_t from = ((size_t)bb * T + (size_t)(rank * Tl + t)) * X + x, to = ((size_t)bb * Tl + t) * X + x;
        CHECK_MSG(out[to] == all[from], "rank %d: the reduce-scatter's element (%d, %d, %d) is not the all-reduce's",
                  rank, bb, rank * Tl + t, x);
      }
  CHECK(!group.own_fault.set);
  group.wire_bf16 = 0;
  if (rank == 0)
    printf("bf16 wire: gathers round once, sums within %.2g of the rounded parts' sum (tp %d), every rank's bits "
           "equal\n", worst, tp);
  free(in); free(out); free(pack); free(all); free(b); free(r1); free(sum);
}

static void test_kv_expansion_and_its_adjoint(void)
{
  /* query heads 2·tp (two per rank) over KV heads that do not split evenly into the shards */
  struct plan_model c;
  memset(&c, 0, sizeof c);
  c.head_dim = 4;
  c.n_heads = 2 * tp;
  c.n_kv_heads = tp == 2 ? 1 : 2;
  if (tp == 2) { /* 6 query heads over 3 KV heads: rank 0 reads KV 0, 0, 1; rank 1 reads 1, 2, 2 */
    c.n_heads = 6;
    c.n_kv_heads = 3;
  }
  const int NH = c.n_heads, NKV = c.n_kv_heads, HS = c.head_dim, NHl = NH / tp, BT = 5;
  const size_t n_kv = (size_t)BT * NKV * HS, n_exp = (size_t)BT * NHl * HS;
  real *x = malloc(n_kv * sizeof *x), *e = malloc(n_exp * sizeof *e), *y = malloc(n_exp * sizeof *y);
  real *g = malloc(n_kv * sizeof *g);
  for (size_t i = 0; i < n_kv; i++) x[i] = whole(i * 7 + 3);
  tp_expand_kv(&group, &c, e, x, BT, NHl);
  for (int bt = 0; bt < BT; bt++)
    for (int i = 0; i < NHl; i++) {
      int kv = (rank * NHl + i) / (NH / NKV);
      CHECK(memcmp(e + ((size_t)bt * NHl + i) * HS, x + ((size_t)bt * NKV + kv) * HS, HS * sizeof(real)) == 0);
    }
  for (size_t i = 0; i < n_exp; i++) y[i] = part(i + (size_t)rank * 11);
  double lhs = 0.0, rhs = 0.0;
  for (size_t i = 0; i < n_exp; i++) lhs += (double)e[i] * y[i];
  tp_expand_kv_backward(&group, &c, g, y, BT, NHl);
  tp_all_reduce(&group, g, n_kv, COMM_SUM);
  for (size_t i = 0; i < n_kv; i++) rhs += (double)x[i] * g[i];
  double lhs_all;
  MPI_Allreduce(&lhs, &lhs_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  /* Exactly equal: products of multiples of 1/4 (|x| ≤ 9) and small integers, summed in real
   * and in double, are all exact, whatever order each side sums in. */
  CHECK_MSG(lhs_all == rhs, "adjoint: sum of <expand(x), y> = %.17g, <x, sum of expand_backward(y)> = %.17g",
            lhs_all, rhs);
  if (rank == 0)
    printf("KV expansion: %d query heads over %d KV heads on %d ranks; adjoint identity %.6g = %.6g\n", NH,
           NKV, tp, lhs_all, rhs);
  free(x);
  free(e);
  free(y);
  free(g);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  struct comm_group *w = comm_world();
  rank = w->rank;
  tp = w->size;
  group.group = w;
  group.size = tp;
  group.rank = rank;
  group.k = &kernel_ops_cpu;
  T = 3 * tp;
  X = 2 * tp;
  static const struct test_case tests[] = { TEST(test_every_conversion), TEST(test_every_conversion_bf16_wire),
                                            TEST(test_bf16_wire_rounds), TEST(test_kv_expansion_and_its_adjoint) };
  int rc = mpi_test_run_all(tests, 4);
  comm_finalize(err, sizeof err);
  return rc;
}
