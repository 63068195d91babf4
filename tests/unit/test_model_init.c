/* Parameter init is a function of (model seed, parameter name, element index) only (docs/design.md,
 * "Randomness"): a tensor that exists under the same name in a model of another depth or width gets
 * bitwise the same values; another seed gives other values; the values are the stated formula;
 * padding rows are zero. Also: the parameter table has Hugging Face's names and shapes, and the
 * memory bill counts what the model allocates. */
#include "check.h"
#include "philox.h"
#include "runtime/model/alloc.h"
#include "runtime/model/model.h"
#include "runtime_fixture.h"
#include "util/hash.h"

#include <math.h>

static char err[512];

static struct plan_model config(int n_layers, int ffn_dim, int vocab_padded)
{
  struct plan p;
  fixture_plan(&p, (struct fixture_shape){ n_layers, 32, 4, 2, ffn_dim, 64, 16, 2, 2 });
  p.model.vocab_padded = vocab_padded;
  return p.model;
}

static int tensors_equal(const struct model *a, const struct model *b, const char *name)
{
  const struct model_param *x = model_find(a, name), *y = model_find(b, name);
  if (!x || !y || x->shape[0] != y->shape[0] || x->shape[1] != y->shape[1])
    return 0;
  size_t n = x->n_dims == 2 ? (size_t)x->shape[0] * (size_t)x->shape[1] : x->n_elems;
  return memcmp(x->data, y->data, n * sizeof(real)) == 0;
}

static void init_depends_only_on_seed_and_name(void)
{
  struct plan_model c2 = config(2, 64, 64), c3 = config(3, 96, 64);
  struct model a, b, c;
  CHECK(model_create(&a, &c2, err, sizeof err) == 0);
  CHECK(model_create(&b, &c3, err, sizeof err) == 0); /* deeper and a wider ffn */
  CHECK(model_create(&c, &c2, err, sizeof err) == 0);
  CHECK(model_init(&a, 77, NULL, 0) == 0);
  CHECK(model_init(&b, 77, NULL, 0) == 0);
  CHECK(model_init(&c, 78, NULL, 0) == 0);
  static const char *const same[] = {
    "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
    "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
    "model.layers.0.input_layernorm.weight", "model.norm.weight", "lm_head.weight",
  };
  for (int i = 0; i < 7; i++) {
    CHECK_MSG(tensors_equal(&a, &b, same[i]), "%s differs between 2 and 3 layers", same[i]);
    if (i != 4 && i != 5)
      CHECK_MSG(!tensors_equal(&a, &c, same[i]), "%s is the same for seeds 77 and 78", same[i]);
  }
  /* Within one model, no two tensors share values (the name picks the stream). */
  CHECK(memcmp(a.layers[0].wq, a.layers[1].wq, 16 * sizeof(real)) != 0);
  CHECK(memcmp(a.layers[0].wk, a.layers[0].wv, 16 * sizeof(real)) != 0);
  /* The residual projections are scaled by 1/sqrt(2·n_layers): the same draw, another scale.
   * Both elements are fp32 products std·z (in both builds); the ratio carries the rounding of
   * the two stds, of the two products and of the division: 5 roundings of ≤ 2^-24 relative,
   * 3e-7 of the ratio 1.22, so |ratio − sqrt(6)/2| ≤ 1e-6. A wrong scale (1/sqrt(L), or none)
   * moves it by ≥ 0.2. */
  const struct model_param *o2 = model_find(&a, "model.layers.0.self_attn.o_proj.weight");
  const struct model_param *o3 = model_find(&b, "model.layers.0.self_attn.o_proj.weight");
  CHECK_NEAR(o2->data[5] / o3->data[5], sqrt(6.0) / 2.0, 1e-6);
  model_free(&a);
  model_free(&b);
  model_free(&c);
}

static void init_is_the_stated_formula(void)
{
  struct plan_model cfg = config(2, 64, 64);
  struct model m;
  CHECK(model_create(&m, &cfg, err, sizeof err) == 0);
  CHECK(model_init(&m, 0x123456789abcull, NULL, 0) == 0);
  static const char *const names[] = { "model.layers.1.mlp.up_proj.weight",
                                       "model.layers.1.mlp.down_proj.weight" };
  /* init_std is a float and the product std · z is taken in float, then stored as real: the
   * float64 build starts from the very same fp32 numbers. The same operations on the same
   * operands, so the comparison is bitwise in both builds. */
  const float scale[] = { 0.02f, (float)(0.02 / sqrt(4.0)) };
  for (int k = 0; k < 2; k++) {
    const struct model_param *p = model_find(&m, names[k]);
    uint64_t h = hash_fnv1a64(names[k]);
    int bad = 0;
    for (size_t e = 0; e < p->n_elems; e++)
      bad += p->data[e] != (real)(scale[k] * philox_normal(0x123456789abcull, (uint32_t)h,
                                                           (uint32_t)(h >> 32), e));
    CHECK_MSG(bad == 0, "%s: %d elements differ from the formula", names[k], bad);
  }
  /* FNV-1a 64 known answers. */
  CHECK(hash_fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(hash_fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  for (int l = 0; l < 2; l++)
    for (int c = 0; c < 32; c++) CHECK(m.layers[l].attn_norm[c] == 1.0f && m.layers[l].mlp_norm[c] == 1.0f);
  model_free(&m);
}

static void padded_vocab_rows_are_zero_and_the_rest_unchanged(void)
{
  struct plan_model c64 = config(2, 64, 64), c72 = config(2, 64, 72);
  struct model a, b;
  CHECK(model_create(&a, &c64, err, sizeof err) == 0);
  CHECK(model_create(&b, &c72, err, sizeof err) == 0);
  CHECK(model_init(&a, 9, NULL, 0) == 0);
  CHECK(model_init(&b, 9, NULL, 0) == 0);
  CHECK(tensors_equal(&a, &b, "model.embed_tokens.weight"));
  CHECK(tensors_equal(&a, &b, "lm_head.weight"));
  const struct model_param *e = model_find(&b, "model.embed_tokens.weight");
  CHECK(e->rows == 72 && e->shape[0] == 64 && e->n_elems == 72 * 32);
  int nonzero = 0;
  for (size_t i = 64 * 32; i < e->n_elems; i++) nonzero += b.wte[i] != 0.0f || b.head[i] != 0.0f;
  CHECK(nonzero == 0);
  model_free(&a);
  model_free(&b);
}

static void parameter_table_has_hugging_face_names_and_shapes(void)
{
  struct plan_model cfg = config(2, 64, 64);
  struct model m;
  CHECK(model_create(&m, &cfg, err, sizeof err) == 0);
  CHECK(m.n_params == 1 + 9 * 2 + 2);
  CHECK(strcmp(m.params[0].name, "model.embed_tokens.weight") == 0);
  CHECK(strcmp(m.params[m.n_params - 1].name, "lm_head.weight") == 0);
  const struct { const char *name; int64_t d0, d1; } want[] = {
    { "model.layers.1.self_attn.q_proj.weight", 32, 32 },
    { "model.layers.1.self_attn.k_proj.weight", 16, 32 },
    { "model.layers.1.self_attn.v_proj.weight", 16, 32 },
    { "model.layers.1.self_attn.o_proj.weight", 32, 32 },
    { "model.layers.0.mlp.gate_proj.weight", 64, 32 },
    { "model.layers.0.mlp.up_proj.weight", 64, 32 },
    { "model.layers.0.mlp.down_proj.weight", 32, 64 },
    { "model.layers.0.input_layernorm.weight", 32, 0 },
    { "model.layers.0.post_attention_layernorm.weight", 32, 0 },
    { "model.norm.weight", 32, 0 },
    { "lm_head.weight", 64, 32 },
  };
  for (int i = 0; i < 11; i++) {
    const struct model_param *p = model_find(&m, want[i].name);
    CHECK_MSG(p && p->shape[0] == want[i].d0 && p->shape[1] == want[i].d1 &&
              p->n_dims == (want[i].d1 ? 2 : 1), "%s", want[i].name);
  }
  /* 2·(32·32·2 + 16·32·2 + 3·64·32 + 2·32) + 64·32·2 + 32 */
  CHECK(model_n_params(&m) == 2 * (2048 + 1024 + 6144 + 64) + 4096 + 32);
  model_free(&m);

  cfg.tie_embeddings = 1;
  CHECK(model_create(&m, &cfg, err, sizeof err) == 0);
  CHECK(model_find(&m, "lm_head.weight") == NULL);
  CHECK(m.head == m.wte && m.dhead == m.dwte);
  model_free(&m);

  cfg.n_kv_heads = 3; /* 4 heads over 3 KV heads */
  CHECK(model_create(&m, &cfg, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "n_kv_heads 3");
}

static void the_bill_counts_parameters_gradients_and_activations(void)
{
  const struct alloc_bill *bill = alloc_bill();
  size_t live = bill->n_live;
  size_t params0 = bill->n_bytes[ALLOC_PARAMS], acts0 = bill->n_bytes[ALLOC_ACTIVATIONS];
  struct plan_model cfg = config(2, 64, 64);
  struct model m;
  struct model_acts a;
  CHECK(model_create(&m, &cfg, err, sizeof err) == 0);
  CHECK(bill->n_bytes[ALLOC_PARAMS] - params0 == m.n_elems * sizeof(real));
  CHECK(bill->n_bytes[ALLOC_GRADS] >= m.n_elems * sizeof(real));
  CHECK(m.n_elems >= (size_t)model_n_params(&m) && m.n_elems < (size_t)model_n_params(&m) + 16 * 21);
  CHECK(model_acts_create(&a, &m, 4, 16, err, sizeof err) == 0);
  /* At least the residual stream, 3 layers' worth of (4·16, 32) floats. */
  CHECK(bill->n_bytes[ALLOC_ACTIVATIONS] - acts0 >= 3 * 4 * 16 * 32 * sizeof(real));
  CHECK(bill->n_bytes[ALLOC_WORKSPACE] > 0);
  size_t peak = bill->peak_bytes[ALLOC_ACTIVATIONS];
  model_acts_free(&a);
  model_free(&m);
  CHECK(bill->n_live == live);
  CHECK(bill->n_bytes[ALLOC_PARAMS] == params0 && bill->n_bytes[ALLOC_ACTIVATIONS] == acts0);
  CHECK(bill->peak_bytes[ALLOC_ACTIVATIONS] == peak); /* the peak stays after the free */
  alloc_reset_peaks();
  CHECK(bill->peak_bytes[ALLOC_ACTIVATIONS] == acts0);
}

TEST_MAIN(TEST(init_depends_only_on_seed_and_name),
          TEST(init_is_the_stated_formula),
          TEST(padded_vocab_rows_are_zero_and_the_rest_unchanged),
          TEST(parameter_table_has_hugging_face_names_and_shapes),
          TEST(the_bill_counts_parameters_gradients_and_activations))
