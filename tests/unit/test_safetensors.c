/* safetensors: write -> read round trips bitwise (a link at path.tmp never written through),
 * F16/BF16 decode to known values, the sharded index finds every tensor across shards, and each
 * kind of malformed header is refused with a message that names the cause. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "io/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static char err[512];

/* A safetensors image in memory: u64 header length, header, data. */
static size_t make_image(uint8_t *buf, const char *header, const void *data, size_t data_bytes)
{
  uint64_t n = strlen(header);
  memcpy(buf, &n, 8);
  memcpy(buf + 8, header, n);
  if (data_bytes) memcpy(buf + 8 + n, data, data_bytes);
  return 8 + n + data_bytes;
}

/* Parse an image built from header + data_bytes zero bytes; returns st_parse's status. */
static int parse_header(const char *header, size_t data_bytes)
{
  static uint8_t buf[4096];
  static const uint8_t zeros[1024];
  struct st_file f;
  size_t n = make_image(buf, header, zeros, data_bytes);
  err[0] = '\0';
  int rc = st_parse(&f, buf, n, "bad.safetensors", err, sizeof err);
  if (rc == 0) st_close(&f);
  return rc;
}

static char *temp_dir(void)
{
  static char dir[64];
  strcpy(dir, "/tmp/test_safetensors.XXXXXX");
  return mkdtemp(dir);
}

static void write_then_read_round_trips_names_shapes_and_bits(void)
{
  char *dir = temp_dir(), path[128];
  CHECK(dir != NULL);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  real a[6], b[3] = { 0.0f, -0.0f, 1e-42f /* subnormal */ }, c = 3.5f;
  uint32_t nan_bits = 0x7fc12345u, inf_bits = 0xff800000u;
  float nan_value, inf_value; /* F32 values, so they come back exactly in either build */
  memcpy(&nan_value, &nan_bits, 4);
  memcpy(&inf_value, &inf_bits, 4);
  for (int k = 0; k < 6; k++) a[k] = (float)k * 0.1f - 0.2f;
  a[4] = nan_value;
  a[5] = inf_value;
  struct st_write_tensor w[] = {
    { "model.layers.0.self_attn.q_proj.weight", 2, {2, 3}, a },
    { "b\"quoted\\name\n", 1, {3}, b },
    { "scalar", 0, {0}, &c },
    { "empty", 2, {0, 5}, NULL },
  };
  CHECK_MSG(st_write_f32(path, w, 4, err, sizeof err) == 0, "%s", err);

  struct st_file f;
  CHECK_MSG(st_open(&f, path, err, sizeof err) == 0, "%s", err);
  CHECK(f.n_tensors == 4);
  CHECK(f.n_metadata == 1);
  if (f.n_metadata == 1) {
    CHECK(strcmp(f.metadata_keys[0], "format") == 0);
    CHECK(strcmp(f.metadata_values[0], "pt") == 0);
  }
  uint64_t header_bytes;
  memcpy(&header_bytes, f.map, 8);
  CHECK(header_bytes % 8 == 0);
  CHECK(memcmp((const char *)f.map + 8, "{\"__metadata__\":{\"format\":\"pt\"}", 31) == 0);
  for (int k = 0; k < 4 && k < f.n_tensors; k++) {
    const struct st_tensor *t = &f.tensors[k];
    CHECK(strcmp(t->name, w[k].name) == 0); /* header order kept */
    CHECK(t->dtype == ST_F32);
    CHECK(t->n_dims == w[k].n_dims);
    for (int d = 0; d < t->n_dims; d++) CHECK(t->shape[d] == w[k].shape[d]);
    CHECK(st_find(&f, w[k].name) == t);
  }
  CHECK(st_find(&f, "missing") == NULL);
  real out[6];
  const struct st_tensor *t = st_find(&f, w[0].name);
  CHECK(t && t->n_elems == 6 && st_read_real(&f, t, out, 6, err, sizeof err) == 0);
  CHECK(memcmp(out, a, sizeof a) == 0);
  t = st_find(&f, w[1].name);
  CHECK(t && st_read_real(&f, t, out, 3, err, sizeof err) == 0 && memcmp(out, b, sizeof b) == 0);
  t = st_find(&f, "scalar");
  CHECK(t && t->n_elems == 1 && st_read_real(&f, t, out, 1, err, sizeof err) == 0 && out[0] == c);
  t = st_find(&f, "empty");
  CHECK(t && t->n_elems == 0 && t->n_bytes == 0 && st_read_real(&f, t, out, 0, err, sizeof err) == 0);
  t = st_find(&f, w[0].name);
  CHECK(t && st_read_real(&f, t, out, 5, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "has 6 elements but the buffer holds 5");
  st_close(&f);
  st_close(&f); /* idempotent */

  /* Overwriting goes through path.tmp and leaves no temporary behind. */
  CHECK_MSG(st_write_f32(path, w, 1, err, sizeof err) == 0, "%s", err);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(access(tmp, F_OK) != 0);
  CHECK_MSG(st_open(&f, path, err, sizeof err) == 0, "%s", err);
  CHECK(f.n_tensors == 1);
  st_close(&f);

  /* A link at path.tmp (a leftover, or planted) is replaced, never written through: the file it
   * points to keeps its bytes. */
  char other[160];
  snprintf(other, sizeof other, "%s/other", dir);
  FILE *o = fopen(other, "w");
  CHECK(o && fputs("not tycho's", o) >= 0 && fclose(o) == 0);
  CHECK(symlink(other, tmp) == 0);
  CHECK_MSG(st_write_f32(path, w, 1, err, sizeof err) == 0, "%s", err);
  char kept[32] = "";
  o = fopen(other, "r");
  CHECK(o && fread(kept, 1, sizeof kept - 1, o) == 11 && fclose(o) == 0);
  CHECK_MSG(strcmp(kept, "not tycho's") == 0, "the link's target now holds '%s'", kept);
  CHECK(access(tmp, F_OK) != 0);
  unlink(other);
  unlink(path);
  rmdir(dir);
}

static void writer_refuses_duplicate_and_reserved_names(void)
{
  real x = 1.0f;
  struct st_write_tensor w[] = { { "a", 1, {1}, &x }, { "a", 1, {1}, &x } };
  CHECK(st_write_f32("/tmp/test_safetensors_dup.safetensors", w, 2, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "duplicate tensor name 'a'");
  struct st_write_tensor m[] = { { "__metadata__", 1, {1}, &x } };
  CHECK(st_write_f32("/tmp/test_safetensors_dup.safetensors", m, 1, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "not __metadata__");
  CHECK(access("/tmp/test_safetensors_dup.safetensors", F_OK) != 0);
}

static float from_bits(uint32_t u)
{
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static uint32_t to_bits(float x)
{
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static void f16_and_bf16_decode_known_bit_patterns(void)
{
  /* F16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), 1023·2^-24 (largest subnormal),
   * 2^-14 (smallest normal), -0, +inf, -inf, nan with payload, 0x3555 = 0.333251953125. */
  const uint16_t half[11] = { 0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x8000, 0x7c00,
                              0xfc00, 0x7e01, 0x3555 };
  const uint32_t half_expect[11] = {
    0x3f800000, 0xc0000000, to_bits(65504.0f), 0x33800000, to_bits(1023.0f / 16777216.0f),
    0x38800000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc02000, to_bits(0.333251953125f) };
  /* BF16: the top half of a float32: 1, -3, 3.140625, +inf, smallest subnormal, nan. */
  const uint16_t bf[6] = { 0x3f80, 0xc040, 0x4049, 0x7f80, 0x0001, 0x7fc1 };
  uint8_t data[34], buf[512];
  memcpy(data, half, 22);
  memcpy(data + 22, bf, 12);
  const char *header = "{\"h\":{\"dtype\":\"F16\",\"shape\":[11],\"data_offsets\":[0,22]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[22,34]}}";
  size_t n = make_image(buf, header, data, sizeof data);
  struct st_file f;
  CHECK_MSG(st_parse(&f, buf, n, "known.safetensors", err, sizeof err) == 0, "%s", err);
  real out[11];
  const struct st_tensor *t = st_find(&f, "h");
  CHECK(t && t->dtype == ST_F16 && st_read_real(&f, t, out, 11, err, sizeof err) == 0);
  for (int k = 0; k < 11; k++)
    CHECK_MSG(to_bits(out[k]) == half_expect[k], "half 0x%04x -> 0x%08x, expected 0x%08x",
              half[k], to_bits(out[k]), half_expect[k]);
  CHECK(out[3] == 5.9604644775390625e-8f && out[2] == 65504.0f);
  t = st_find(&f, "b");
  CHECK(t && t->dtype == ST_BF16 && t->n_dims == 2 && st_read_real(&f, t, out, 6, err, sizeof err) == 0);
  CHECK(out[0] == 1.0f && out[1] == -3.0f && out[2] == 3.140625f);
  CHECK(to_bits(out[3]) == 0x7f800000 && to_bits(out[4]) == 0x00010000 && to_bits(out[5]) == 0x7fc10000);
  CHECK(from_bits(0x00010000) == out[4]);
  st_close(&f);
}

static void integer_dtypes_parse_but_do_not_convert(void)
{
  uint8_t buf[256], data[16] = {0};
  size_t n = make_image(buf, "{\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
                        data, 16);
  struct st_file f;
  real out[2];
  CHECK_MSG(st_parse(&f, buf, n, "ints.safetensors", err, sizeof err) == 0, "%s", err);
  CHECK(f.n_tensors == 1 && f.tensors[0].dtype == ST_I64 && f.tensors[0].n_bytes == 16);
  CHECK(st_read_real(&f, &f.tensors[0], out, 2, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "ints.safetensors: tensor 'i' is I64; only F32, F16, BF16 and F64");
  st_close(&f);
}

static void json_escapes_decode_to_utf8(void)
{
  uint8_t buf[512], data[4] = {0};
  /* "a\u00e9\ud83d\ude00\t/" = a, é (2 bytes), 😀 (4 bytes), tab, slash */
  const char *header = "{\"__metadata__\":{\"k\\\"ey\":\"v\\\\al\\u0041\"},"
                       " \"a\\u00e9\\ud83d\\ude00\\t\\/\" : {\"shape\":[],\"dtype\":\"F32\","
                       "\"data_offsets\":[0,4]}}   ";
  size_t n = make_image(buf, header, data, 4);
  struct st_file f;
  CHECK_MSG(st_parse(&f, buf, n, "esc.safetensors", err, sizeof err) == 0, "%s", err);
  CHECK(f.n_tensors == 1 && strcmp(f.tensors[0].name, "a\xc3\xa9\xf0\x9f\x98\x80\t/") == 0);
  CHECK(f.n_metadata == 1 && strcmp(f.metadata_keys[0], "k\"ey") == 0 &&
        strcmp(f.metadata_values[0], "v\\alA") == 0);
  CHECK(f.tensors[0].n_dims == 0 && f.tensors[0].n_elems == 1);
  st_close(&f);
}

static void malformed_headers_are_refused_with_their_cause(void)
{
  static uint8_t buf[64];
  struct st_file f;
  uint64_t big = 1000;
  memcpy(buf, &big, 8);
  memcpy(buf + 8, "{}", 2);
  CHECK(st_parse(&f, buf, 40, "short.safetensors", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "short.safetensors: header length 1000 is larger than the 32 bytes "
                     "after the length prefix (file is 40 bytes)");
  big = (uint64_t)1 << 40;
  memcpy(buf, &big, 8);
  CHECK(st_parse(&f, buf, 40, "huge.safetensors", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "huge.safetensors: header length 1099511627776 is over the");
  CHECK(st_parse(&f, buf, 5, "tiny.safetensors", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "file is 5 bytes, shorter than the 8-byte header length");

  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8));
  CHECK_STR_CONTAINS(err, "bad.safetensors: tensor 'w': data_offsets [0, 16] run past the end "
                     "of the 8-byte data area");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16));
  CHECK_STR_CONTAINS(err, "tensor 'w': data_offsets [0, 8] hold 8 bytes but shape [3] of F32 "
                     "needs 12");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16));
  CHECK_STR_CONTAINS(err, "data_offsets [8, 0] are out of order");
  CHECK(parse_header("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"y\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[4,12]}}", 16));
  CHECK_STR_CONTAINS(err, "tensors 'x' [0, 8] and 'y' [4, 12] overlap");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16));
  CHECK_STR_CONTAINS(err, "bad.safetensors: bad JSON at byte 8: duplicate key \"w\" in object");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16));
  CHECK_STR_CONTAINS(err, "tensor 'w': unknown dtype 'F17'");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 16));
  CHECK_STR_CONTAINS(err, "bad.safetensors: bad JSON at byte 62: expected a string key in object");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 16));
  CHECK_STR_CONTAINS(err, "expected ',' or '}'");
  CHECK(parse_header("{\"w\" {}}", 0));
  CHECK_STR_CONTAINS(err, "bad JSON at byte 13: expected ':' after object key");
  CHECK(parse_header("{} x", 0));
  CHECK_STR_CONTAINS(err, "trailing characters after the JSON value");
  CHECK(parse_header("[]", 0));
  CHECK_STR_CONTAINS(err, "bad.safetensors: header is not a JSON object");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 16));
  CHECK_STR_CONTAINS(err, "shape must hold non-negative integers");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16));
  CHECK_STR_CONTAINS(err, "shape must hold non-negative integers");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                     "\"data_offsets\":[0,8]}}", 16));
  CHECK_STR_CONTAINS(err, "shape overflows");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 16));
  CHECK_STR_CONTAINS(err, "tensor 'w': missing 'data_offsets'");
  CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 16));
  CHECK_STR_CONTAINS(err, "tensor 'w': unknown field 'x'");
  CHECK(parse_header("{\"w\":[1]}", 0));
  CHECK_STR_CONTAINS(err, "tensor 'w': expected an object");
  CHECK(parse_header("{\"__metadata__\":{\"a\":1}}", 0));
  CHECK_STR_CONTAINS(err, "__metadata__ value of 'a' is not a string");
  CHECK(parse_header("{\"a\\x\":1}", 0));
  CHECK_STR_CONTAINS(err, "bad escape '\\x'");
  CHECK(parse_header("{\"\\ud800\":1}", 0));
  CHECK_STR_CONTAINS(err, "high surrogate \\ud800 without a low one");
  CHECK(parse_header("{\"a\xff\":1}", 0));
  CHECK_STR_CONTAINS(err, "invalid UTF-8 in string");
  CHECK(parse_header("{\"a\nb\":1}", 0));
  CHECK_STR_CONTAINS(err, "control character 0x0a in string");
  CHECK(parse_header("{\"a\":01}", 0));
  CHECK_STR_CONTAINS(err, "expected ',' or '}'");
  CHECK(parse_header("{\"a\":tru}", 0));
  CHECK_STR_CONTAINS(err, "unexpected character");
  char deep[200] = "{\"a\":";
  for (int k = 0; k < 70; k++) strcat(deep, "[");
  CHECK(parse_header(deep, 0));
  CHECK_STR_CONTAINS(err, "nesting deeper than 64 levels");
  CHECK(parse_header("", 0));
  CHECK_STR_CONTAINS(err, "unexpected end of JSON");

  CHECK(st_open(&f, "/nonexistent/model.safetensors", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "/nonexistent/model.safetensors: cannot open: No such file or directory");
}

static void sharded_index_round_trips_and_finds_tensors_across_shards(void)
{
  char *dir = temp_dir(), p1[128], p2[128], pi[128];
  CHECK(dir != NULL);
  snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
  snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
  snprintf(pi, sizeof pi, "%s/model.safetensors.index.json", dir);
  real a[4] = { 1, 2, 3, 4 }, b[2] = { 5, 6 }, c[3] = { 7, 8, 9 };
  struct st_write_tensor s1[] = { { "a", 2, {2, 2}, a }, { "b", 1, {2}, b } };
  struct st_write_tensor s2[] = { { "c", 1, {3}, c } };
  CHECK_MSG(st_write_f32(p1, s1, 2, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(st_write_f32(p2, s2, 1, err, sizeof err) == 0, "%s", err);
  const char *names[] = { "c", "a", "b" };
  const char *files[] = { "model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors",
                          "model-00001-of-00002.safetensors" };
  CHECK_MSG(st_index_write(pi, names, files, 3, 36, err, sizeof err) == 0, "%s", err);

  struct st_index ix;
  CHECK_MSG(st_index_open(&ix, pi, err, sizeof err) == 0, "%s", err);
  CHECK(ix.n_shards == 2 && ix.n_entries == 3);
  const struct st_file *file = NULL;
  real out[4];
  const struct st_tensor *t = st_index_find(&ix, "a", &file);
  CHECK(t && file == &ix.shards[0] && t->n_dims == 2 && t->shape[1] == 2);
  CHECK(t && st_read_real(file, t, out, 4, err, sizeof err) == 0 && memcmp(out, a, sizeof a) == 0);
  t = st_index_find(&ix, "c", &file);
  CHECK(t && file == &ix.shards[1]);
  CHECK(t && st_read_real(file, t, out, 3, err, sizeof err) == 0 && memcmp(out, c, sizeof c) == 0);
  t = st_index_find(&ix, "b", NULL);
  CHECK(t && t->n_elems == 2);
  CHECK(st_index_find(&ix, "d", &file) == NULL);
  st_index_close(&ix);
  st_index_close(&ix);

  /* The index names a tensor that its shard does not hold. */
  const char *names2[] = { "a", "zz" };
  const char *files2[] = { files[1], files[0] };
  CHECK_MSG(st_index_write(pi, names2, files2, 2, 0, err, sizeof err) == 0, "%s", err);
  CHECK(st_index_open(&ix, pi, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "model.safetensors.index.json: tensor 'zz' is listed in the index but "
                     "missing from shard");
  CHECK_STR_CONTAINS(err, "model-00002-of-00002.safetensors");
  unlink(p1);
  unlink(p2);
  unlink(pi);
  rmdir(dir);
}

static void index_json_is_checked(void)
{
  struct st_index ix;
  const char *ok = "{\"metadata\":{\"total_size\":8},\"weight_map\":{\"x\":\"s1.safetensors\","
                   "\"y\":\"s0.safetensors\",\"z\":\"s1.safetensors\"}}";
  CHECK_MSG(st_index_parse(&ix, ok, strlen(ok), "i.json", err, sizeof err) == 0, "%s", err);
  CHECK(ix.n_shards == 2 && strcmp(ix.shard_files[0], "s0.safetensors") == 0);
  CHECK(ix.n_entries == 3 && strcmp(ix.entries[0].name, "x") == 0 && ix.entries[0].shard == 1);
  st_index_close(&ix);
  const char *escape = "{\"weight_map\":{\"x\":\"../secret.safetensors\"}}";
  CHECK(st_index_parse(&ix, escape, strlen(escape), "i.json", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "i.json: weight_map entry 'x' must be a file name inside the index's folder");
  const char *none = "{\"metadata\":{}}";
  CHECK(st_index_parse(&ix, none, strlen(none), "i.json", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "i.json: no \"weight_map\" object");
  const char *dup = "{\"weight_map\":{\"x\":\"a\",\"x\":\"b\"}}";
  CHECK(st_index_parse(&ix, dup, strlen(dup), "i.json", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "duplicate key \"x\"");
  CHECK(st_index_open(&ix, "/nonexistent/index.json", err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "/nonexistent/index.json: cannot open: No such file or directory");
}

TEST_MAIN(TEST(write_then_read_round_trips_names_shapes_and_bits),
          TEST(writer_refuses_duplicate_and_reserved_names),
          TEST(f16_and_bf16_decode_known_bit_patterns),
          TEST(integer_dtypes_parse_but_do_not_convert),
          TEST(json_escapes_decode_to_utf8),
          TEST(malformed_headers_are_refused_with_their_cause),
          TEST(sharded_index_round_trips_and_finds_tensors_across_shards),
          TEST(index_json_is_checked))
