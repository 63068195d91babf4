/* The reference tests' final-weights comparison (test_reference_torch.c, test_reference_moe.c):
 * every parameter of a trained model against the same-named tensor of a golden safetensors file
 * written by a float64 PyTorch reference and rounded to F32. fp32: relative L2 per tensor ≤ 1e-5
 * (the argument is at test_reference_torch.c's use); float64: every element within
 * FP32_U · |ref| + 1e-12 · |ref| of the file, i.e. the reference's own fp32 rounding. Include
 * after check.h, io/safetensors.h and runtime_fixture.h. */
#ifndef TYCHO_TEST_REFERENCE_FIXTURE_H
#define TYCHO_TEST_REFERENCE_FIXTURE_H

/* Checks every parameter of m against f and prints the worst per-tensor relative L2 and the
 * largest element difference. */
static inline void reference_final_weights_match(const struct model *m, struct st_file *f)
{
  char err[512];
  double worst = 0.0, worst_abs = 0.0;
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *mp = &m->params[i];
    const struct st_tensor *ref = st_find(f, mp->name);
    CHECK_MSG(ref != NULL, "%s missing from the reference", mp->name);
    if (!ref)
      continue;
    real *w = malloc(ref->n_elems * sizeof(real));
    CHECK(st_read_real(f, ref, w, ref->n_elems, err, sizeof err) == 0);
    double max_diff = 0.0;
    size_t n_far = 0;
    for (size_t e = 0; e < ref->n_elems; e++) {
      double d = fabs((double)mp->data[e] - w[e]);
      max_diff = d > max_diff ? d : max_diff;
      n_far += !(d <= (FP32_U + 1e-12) * fabs((double)w[e]));
    }
    double rel_l2 = fixture_rel_l2(mp->data, w, ref->n_elems);
    worst = rel_l2 > worst ? rel_l2 : worst;
    worst_abs = max_diff > worst_abs ? max_diff : worst_abs;
#if REAL_IS_DOUBLE
    CHECK_MSG(n_far == 0, "%s: %zu elements are not the reference to fp32 rounding", mp->name, n_far);
#else
    (void)n_far;
    CHECK_MSG(rel_l2 <= 1e-5, "%s: relative L2 |tycho − reference| = %.3g", mp->name, rel_l2);
#endif
    free(w);
  }
  printf("final weights: relative L2 |tycho − reference| ≤ %.3g per tensor, max |diff| %.3g\n",
         worst, worst_abs);
}

#endif
