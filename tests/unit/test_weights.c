/* Hugging Face weights out and in: export → init.from gives bitwise the same parameters and the
 * same loss (one file, and a sharded index); a tied model exports no lm_head; a file with a
 * missing, an extra or a mis-shaped tensor, or an integer dtype, is refused with a message
 * naming the tensor (and, for a shape, both shapes).
 * Export writes F32 in both builds. The initial weights are fp32 numbers in both (model_init),
 * so they round-trip bitwise in both; trained weights are fp32 numbers only in the fp32 build.
 * In the float64 build they come back as (real)(float)w, exactly, and the loss moves by no more
 * than that rounding can move it. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "io/safetensors.h"
#include "runtime/train/train.h"
#include "runtime/model/weights.h"
#include "runtime_fixture.h"

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static char err[1024];
static char dir[64];

static const struct fixture_shape shape = { 2, 32, 4, 2, 64, 64, 16, 4, 2 };

static const char *temp_path(const char *name)
{
  static char path[8][256];
  static int next;
  if (!dir[0]) {
    strcpy(dir, "/tmp/test_weights.XXXXXX");
    if (!mkdtemp(dir))
      return "/nonexistent";
  }
  char *p = path[next++ % 8];
  snprintf(p, sizeof path[0], "%s/%s", dir, name);
  return p;
}

#if REAL_IS_DOUBLE
/* Every element of b is a's rounded to fp32, exactly: what an F32 file gives back. */
static int params_are_f32_rounding_of(const struct model *b, const struct model *a)
{
  if (a->n_params != b->n_params)
    return 0;
  for (int i = 0; i < a->n_params; i++)
    for (size_t e = 0; e < a->params[i].n_elems; e++)
      if (b->params[i].data[e] != (real)(float)a->params[i].data[e])
        return 0;
  return 1;
}

/* ‖a − b‖₂ over every parameter, and ‖∇‖₂ of a's gradients. */
static double params_dist(const struct model *a, const struct model *b)
{
  double s = 0.0;
  for (int i = 0; i < a->n_params; i++)
    for (size_t e = 0; e < a->params[i].n_elems; e++) {
      double d = (double)a->params[i].data[e] - b->params[i].data[e];
      s += d * d;
    }
  return sqrt(s);
}

static double grad_norm(const struct model *a)
{
  double s = 0.0;
  for (int i = 0; i < a->n_params; i++)
    for (size_t e = 0; e < a->params[i].n_elems; e++)
      s += (double)a->params[i].grad[e] * a->params[i].grad[e];
  return sqrt(s);
}
#endif

/* a's parameters came back from an F32 file as `back`: in fp32 bitwise the same; in float64
 * (trained weights are no fp32 numbers) each is a's rounded to fp32, exactly, and not all of
 * them equal a's — the rounding did happen, so the comparison says something. */
static void check_trained_round_trip(const struct model *a, const struct model *back)
{
#if REAL_IS_DOUBLE
  CHECK(params_are_f32_rounding_of(back, a));
  CHECK(!fixture_params_equal(a, back));
#else
  CHECK(fixture_params_equal(a, back));
#endif
}

static void export_then_init_from_round_trips_bitwise(void)
{
  struct plan p;
  fixture_plan(&p, shape);
  struct trainer a, b;
  struct train_step_stats st;
  CHECK_MSG(trainer_open(&a, &p, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  /* The initial weights are fp32 numbers in both builds: bitwise through the F32 file. */
  const char *init_path = temp_path("init.safetensors");
  CHECK_MSG(weights_export(&a.model, init_path, err, sizeof err) == 0, "%s", err);
  struct model init;
  CHECK(model_create(&init, &p.model, err, sizeof err) == 0);
  CHECK_MSG(weights_load(&init, init_path, err, sizeof err) == 0, "%s", err);
  CHECK(fixture_params_equal(&a.model, &init));
  model_free(&init);

  for (int s = 0; s < 3; s++) CHECK(trainer_step(&a, &st, err, sizeof err) == 0);
  /* Into a folder that does not exist yet. */
  const char *path = temp_path("sub/dir/model.safetensors");
  CHECK_MSG(weights_export(&a.model, path, err, sizeof err) == 0, "%s", err);

  struct st_file f;
  CHECK_MSG(st_open(&f, path, err, sizeof err) == 0, "%s", err);
  CHECK(f.n_tensors == a.model.n_params);
  const struct st_tensor *q = st_find(&f, "model.layers.1.self_attn.k_proj.weight");
  CHECK(q && q->dtype == ST_F32 && q->n_dims == 2 && q->shape[0] == 16 && q->shape[1] == 32);
  st_close(&f);

  struct plan pl = p;
  snprintf(pl.init.from, sizeof pl.init.from, "%s", path);
  pl.seeds.value[PLAN_SEED_MODEL] = 999; /* ignored: the weights come from the file */
  CHECK_MSG(trainer_open(&b, &pl, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  check_trained_round_trip(&a.model, &b.model);
  b.step = a.step;
  double loss_a = trainer_forward_backward(&a), loss_b = trainer_forward_backward(&b);
#if REAL_IS_DOUBLE
  /* The weights differ by δ = b − a, each element by ≤ 2^-24 relative; to first order the loss
   * moves by ∇L·δ ≤ ‖∇L‖‖δ‖ (Cauchy–Schwarz; ∇L is a's gradient, just computed). The second
   * order, ½δᵀHδ, is ~‖δ‖/‖w‖ ≈ 6e-8 of that, and the two float64 evaluations add ~1e-15:
   * bound 1.01·‖∇L‖‖δ‖ + 1e-13. Weights read from the wrong tensor move the loss by O(0.1). */
  double bound = 1.01 * grad_norm(&a.model) * params_dist(&a.model, &b.model) + 1e-13;
  CHECK_MSG(fabs(loss_a - loss_b) <= bound, "loss %.17g after the round trip, %.17g before, "
            "bound %.3g", loss_b, loss_a, bound);
  printf("float64: the loss moved by %.3g through the F32 file (bound %.3g)\n",
         fabs(loss_a - loss_b), bound);
#else
  CHECK(loss_a == loss_b); /* the same parameters, the same operations: the same bits */
#endif

  /* The same through a sharded index: the embedding in one shard, everything else in another. */
  int n = a.model.n_params;
  struct st_write_tensor *w = calloc((size_t)n, sizeof *w);
  const char **names = calloc((size_t)n, sizeof *names), **files = calloc((size_t)n, sizeof *files);
  for (int i = 0; i < n; i++) {
    const struct model_param *mp = &a.model.params[i];
    w[i] = (struct st_write_tensor){ mp->name, mp->n_dims, { mp->shape[0], mp->shape[1] }, mp->data };
    names[i] = mp->name;
    files[i] = i == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  CHECK(st_write_f32(temp_path("model-00001-of-00002.safetensors"), w, 1, err, sizeof err) == 0);
  CHECK(st_write_f32(temp_path("model-00002-of-00002.safetensors"), w + 1, n - 1, err, sizeof err) == 0);
  CHECK(st_index_write(temp_path("model.safetensors.index.json"), names, files, n, 0, err, sizeof err) == 0);
  struct model c;
  CHECK(model_create(&c, &p.model, err, sizeof err) == 0);
  CHECK_MSG(weights_load(&c, temp_path("model.safetensors.index.json"), err, sizeof err) == 0, "%s", err);
  check_trained_round_trip(&a.model, &c);
  model_free(&c);
  free(w);
  free(names);
  free(files);
  trainer_close(&a);
  trainer_close(&b);
}

static void tied_model_exports_no_head_and_padding_stays_internal(void)
{
  struct plan p;
  fixture_plan(&p, shape);
  p.model.tie_embeddings = 1;
  p.model.vocab_padded = 72;
  struct model m, back;
  CHECK(model_create(&m, &p.model, err, sizeof err) == 0);
  CHECK(model_init(&m, 3, NULL, 0) == 0);
  const char *path = temp_path("tied.safetensors");
  CHECK_MSG(weights_export(&m, path, err, sizeof err) == 0, "%s", err);
  struct st_file f;
  CHECK(st_open(&f, path, err, sizeof err) == 0);
  CHECK(st_find(&f, "lm_head.weight") == NULL);
  const struct st_tensor *e = st_find(&f, "model.embed_tokens.weight");
  CHECK(e && e->shape[0] == 64 && e->shape[1] == 32); /* unpadded */
  st_close(&f);
  CHECK(model_create(&back, &p.model, err, sizeof err) == 0);
  CHECK_MSG(weights_load(&back, path, err, sizeof err) == 0, "%s", err);
  CHECK(fixture_params_equal(&m, &back)); /* initial weights: fp32 numbers, bitwise in both builds */
  model_free(&back);
  model_free(&m);
}

/* Writes the model's tensors, changed by `edit`, and returns weights_load's message. */
enum edit { DROP_ONE, ADD_ONE, RESHAPE_ONE, ADD_ROTARY_BUFFER };

static int load_edited(enum edit edit, const char *name)
{
  struct plan p;
  fixture_plan(&p, shape);
  struct model m;
  CHECK(model_create(&m, &p.model, err, sizeof err) == 0);
  CHECK(model_init(&m, 1, NULL, 0) == 0);
  struct st_write_tensor w[64];
  int n = 0;
  static real extra[64 * 32];
  for (int i = 0; i < m.n_params; i++) {
    const struct model_param *mp = &m.params[i];
    if (edit == DROP_ONE && strcmp(mp->name, "model.layers.1.mlp.up_proj.weight") == 0)
      continue;
    w[n] = (struct st_write_tensor){ mp->name, mp->n_dims, { mp->shape[0], mp->shape[1] }, mp->data };
    if (edit == RESHAPE_ONE && strcmp(mp->name, "model.layers.0.self_attn.k_proj.weight") == 0)
      w[n] = (struct st_write_tensor){ mp->name, 2, { 32, 32 }, extra }; /* (16, 32) belongs */
    n++;
  }
  if (edit == ADD_ONE)
    w[n++] = (struct st_write_tensor){ "model.layers.2.mlp.up_proj.weight", 2, { 64, 32 }, extra };
  if (edit == ADD_ROTARY_BUFFER)
    w[n++] = (struct st_write_tensor){ "model.layers.0.self_attn.rotary_emb.inv_freq", 1, { 4 }, extra };
  const char *path = temp_path(name);
  CHECK_MSG(st_write_f32(path, w, n, err, sizeof err) == 0, "%s", err);
  err[0] = '\0';
  int rc = weights_load(&m, path, err, sizeof err);
  model_free(&m);
  return rc;
}

static void missing_extra_and_misshaped_tensors_are_refused_by_name(void)
{
  CHECK(load_edited(DROP_ONE, "missing.safetensors") != 0);
  CHECK_STR_CONTAINS(err, "tensor 'model.layers.1.mlp.up_proj.weight' is missing");
  CHECK_STR_CONTAINS(err, "missing.safetensors");

  CHECK(load_edited(ADD_ONE, "extra.safetensors") != 0);
  CHECK_STR_CONTAINS(err, "tensor 'model.layers.2.mlp.up_proj.weight' is not a parameter of this model");

  CHECK(load_edited(RESHAPE_ONE, "shape.safetensors") != 0);
  CHECK_STR_CONTAINS(err, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 32], "
                          "the model expects [16, 32]");

  CHECK(load_edited(ADD_ROTARY_BUFFER, "rotary.safetensors") == 0); /* a buffer, not a weight */

  /* A file that is not there: the safetensors module's message, with the path. */
  struct plan p;
  fixture_plan(&p, shape);
  snprintf(p.init.from, sizeof p.init.from, "%s", temp_path("absent.safetensors"));
  struct trainer t;
  CHECK(trainer_open(&t, &p, NULL, err, sizeof err) == TRAIN_RUNTIME_ERROR);
  CHECK_STR_CONTAINS(err, "absent.safetensors");
}

static void integer_tensors_are_refused(void)
{
  /* A hand-made file: the final norm stored as I32. */
  struct plan p;
  fixture_plan(&p, (struct fixture_shape){ 1, 4, 2, 1, 4, 64, 4, 1, 1 });
  struct model m;
  CHECK(model_create(&m, &p.model, err, sizeof err) == 0);
  char header[4096];
  size_t off = 0;
  int used = snprintf(header, sizeof header, "{");
  for (int i = 0; i < m.n_params; i++) {
    const struct model_param *mp = &m.params[i];
    size_t bytes = (mp->n_dims == 2 ? (size_t)mp->shape[0] * mp->shape[1] : (size_t)mp->shape[0]) * 4;
    const char *dtype = strcmp(mp->name, "model.norm.weight") == 0 ? "I32" : "F32";
    if (mp->n_dims == 2)
      used += snprintf(header + used, sizeof header - (size_t)used,
                       "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                       i ? "," : "", mp->name, dtype, (long long)mp->shape[0], (long long)mp->shape[1],
                       off, off + bytes);
    else
      used += snprintf(header + used, sizeof header - (size_t)used,
                       "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                       i ? "," : "", mp->name, dtype, (long long)mp->shape[0], off, off + bytes);
    off += bytes;
  }
  used += snprintf(header + used, sizeof header - (size_t)used, "}");
  const char *path = temp_path("int.safetensors");
  FILE *f = fopen(path, "wb");
  uint64_t n = (uint64_t)used;
  fwrite(&n, 8, 1, f);
  fwrite(header, 1, (size_t)used, f);
  for (size_t k = 0; k < off; k++) fputc(0, f);
  fclose(f);
  CHECK(weights_load(&m, path, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "tensor 'model.norm.weight' is I32");
  model_free(&m);
}

/* Every tensor stored as F64 (the values of a seeded model, widened): read back to the same
 * numbers, as docs/design.md and weights.h promise (F32, F16, BF16 and F64 are read). */
static void f64_tensors_are_read(void)
{
  struct plan p;
  fixture_plan(&p, (struct fixture_shape){ 1, 4, 2, 1, 4, 64, 4, 1, 1 });
  struct model a, b;
  CHECK(model_create(&a, &p.model, err, sizeof err) == 0);
  CHECK(model_create(&b, &p.model, err, sizeof err) == 0);
  CHECK(model_init(&a, 11, NULL, 0) == 0);
  char header[4096];
  size_t off = 0;
  int used = snprintf(header, sizeof header, "{");
  for (int i = 0; i < a.n_params; i++) {
    const struct model_param *mp = &a.params[i];
    size_t bytes = (mp->n_dims == 2 ? (size_t)mp->shape[0] * mp->shape[1] : (size_t)mp->shape[0]) * 8;
    if (mp->n_dims == 2)
      used += snprintf(header + used, sizeof header - (size_t)used,
                       "%s\"%s\":{\"dtype\":\"F64\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                       i ? "," : "", mp->name, (long long)mp->shape[0], (long long)mp->shape[1], off, off + bytes);
    else
      used += snprintf(header + used, sizeof header - (size_t)used,
                       "%s\"%s\":{\"dtype\":\"F64\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                       i ? "," : "", mp->name, (long long)mp->shape[0], off, off + bytes);
    off += bytes;
  }
  used += snprintf(header + used, sizeof header - (size_t)used, "}");
  const char *path = temp_path("f64.safetensors");
  FILE *f = fopen(path, "wb");
  uint64_t n = (uint64_t)used;
  fwrite(&n, 8, 1, f);
  fwrite(header, 1, (size_t)used, f);
  for (int i = 0; i < a.n_params; i++) {
    const struct model_param *mp = &a.params[i];
    size_t count = mp->n_dims == 2 ? (size_t)mp->shape[0] * mp->shape[1] : (size_t)mp->shape[0];
    for (size_t k = 0; k < count; k++) {
      double x = (double)mp->data[k];
      fwrite(&x, 8, 1, f);
    }
  }
  fclose(f);
  CHECK_MSG(weights_load(&b, path, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < a.n_params; i++)
    CHECK_MSG(memcmp(a.params[i].data, b.params[i].data, a.params[i].n_elems * sizeof(real)) == 0,
              "%s differs after an F64 round trip", a.params[i].name);
  model_free(&a);
  model_free(&b);
}

TEST_MAIN(TEST(export_then_init_from_round_trips_bitwise),
          TEST(f64_tensors_are_read),
          TEST(tied_model_exports_no_head_and_padding_stays_internal),
          TEST(missing_extra_and_misshaped_tensors_are_refused_by_name),
          TEST(integer_tensors_are_refused))
