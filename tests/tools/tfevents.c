/* tfevents: reads TensorBoard event files as TensorBoard does, without Python, for
 * tests/e2e/run_tensorboard.sh ($TYCHO_TFEVENTS). For each file it checks the record framing —
 * a little-endian uint64 length, the masked CRC32C of those 8 bytes, the payload, the masked
 * CRC32C of the payload, and nothing after the last record — and decodes each payload as an
 * Event, printing one line per thing found:
 *   version TEXT          (file_version)
 *   start STEP            (a SessionLog with status START)
 *   scalar STEP TAG VALUE (a Summary value's simple_value, %.9g)
 * Its CRC32C is computed bit by bit, apart from tycho's table, so the two are checked against
 * each other. Exit 0, or 1 with "FILE: record N at byte B: what is wrong" on stderr.
 * usage: tfevents FILE... */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t crc32c_bitwise(const unsigned char *p, size_t n)
{
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++)
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}

static uint32_t masked(uint32_t crc)
{
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static uint64_t le(const unsigned char *p, int bytes)
{
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* protobuf wire format: a field at *pos of [p, end); 0 ok, -1 malformed */
struct field {
  int number, wire;
  uint64_t v;              /* varint, fixed32, fixed64 */
  const unsigned char *b;  /* length-delimited */
  size_t len;
};

static int varint(const unsigned char *p, size_t n, size_t *pos, uint64_t *out)
{
  uint64_t v = 0;
  for (int shift = 0; shift < 70 && *pos < n; shift += 7) {
    const unsigned char c = p[(*pos)++];
    v |= (uint64_t)(c & 0x7F) << shift;
    if (!(c & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -1;
}

static int next_field(const unsigned char *p, size_t n, size_t *pos, struct field *f)
{
  uint64_t key;
  if (varint(p, n, pos, &key))
    return -1;
  f->number = (int)(key >> 3);
  f->wire = (int)(key & 7);
  switch (f->wire) {
  case 0: return varint(p, n, pos, &f->v);
  case 1:
    if (n - *pos < 8)
      return -1;
    f->v = le(p + *pos, 8);
    *pos += 8;
    return 0;
  case 5:
    if (n - *pos < 4)
      return -1;
    f->v = le(p + *pos, 4);
    *pos += 4;
    return 0;
  case 2:
    if (varint(p, n, pos, &f->v) || f->v > n - *pos)
      return -1;
    f->b = p + *pos;
    f->len = (size_t)f->v;
    *pos += f->len;
    return 0;
  default: return -1;
  }
}

/* Summary { repeated Value value = 1 }, Value { string tag = 1; float simple_value = 2 } */
static int summary(const unsigned char *p, size_t n, long long step)
{
  struct field f, g;
  for (size_t pos = 0; pos < n;) {
    if (next_field(p, n, &pos, &f))
      return -1;
    if (f.number != 1 || f.wire != 2)
      continue;
    char tag[512] = "";
    int has_value = 0;
    float value = 0;
    for (size_t q = 0; q < f.len;) {
      if (next_field(f.b, f.len, &q, &g))
        return -1;
      if (g.number == 1 && g.wire == 2)
        snprintf(tag, sizeof tag, "%.*s", (int)g.len, (const char *)g.b);
      else if (g.number == 2 && g.wire == 5) {
        const uint32_t bits = (uint32_t)g.v;
        memcpy(&value, &bits, sizeof value);
        has_value = 1;
      }
    }
    if (!tag[0] || !has_value)
      return -1;
    printf("scalar %lld %s %.9g\n", step, tag, (double)value);
  }
  return 0;
}

static int event(const unsigned char *p, size_t n)
{
  struct field f;
  long long step = 0;
  const unsigned char *sum = NULL, *log = NULL;
  size_t sum_len = 0, log_len = 0;
  int has_time = 0;
  for (size_t pos = 0; pos < n;) {
    if (next_field(p, n, &pos, &f))
      return -1;
    if (f.number == 1 && f.wire == 1)
      has_time = 1;
    else if (f.number == 2 && f.wire == 0)
      step = (long long)f.v;
    else if (f.number == 3 && f.wire == 2)
      printf("version %.*s\n", (int)f.len, (const char *)f.b);
    else if (f.number == 5 && f.wire == 2)
      sum = f.b, sum_len = f.len;
    else if (f.number == 7 && f.wire == 2)
      log = f.b, log_len = f.len;
  }
  if (!has_time)
    return -1;
  if (log) {
    for (size_t q = 0; q < log_len;) {
      if (next_field(log, log_len, &q, &f))
        return -1;
      if (f.number == 1 && f.wire == 0 && f.v == 1)
        printf("start %lld\n", step);
    }
  }
  return sum ? summary(sum, sum_len, step) : 0;
}

static int check_file(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return 1;
  }
  unsigned char head[12], *buf = NULL;
  long long at = 0;
  int rc = 0;
  for (int record = 1;; record++) {
    size_t got = fread(head, 1, sizeof head, f);
    if (got == 0)
      break;
    const char *bad = NULL;
    uint64_t len = 0;
    if (got < sizeof head)
      bad = "a truncated header";
    else if ((uint32_t)le(head + 8, 4) != masked(crc32c_bitwise(head, 8)))
      bad = "the length's CRC does not match";
    else if ((len = le(head, 8)) > (1u << 30))
      bad = "an impossible length";
    unsigned char crc[4];
    if (!bad && !(buf = realloc(buf, len ? len : 1)))
      bad = "out of memory";
    if (!bad && (fread(buf, 1, len, f) != len || fread(crc, 1, 4, f) != 4))
      bad = "a truncated payload";
    if (!bad && (uint32_t)le(crc, 4) != masked(crc32c_bitwise(buf, len)))
      bad = "the payload's CRC does not match";
    if (!bad && event(buf, len))
      bad = "the payload is not a well-formed Event";
    if (bad) {
      fprintf(stderr, "%s: record %d at byte %lld: %s\n", path, record, at, bad);
      rc = 1;
      break;
    }
    at += 16 + (long long)len;
  }
  free(buf);
  fclose(f);
  return rc;
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "usage: tfevents FILE...\n");
    return 2;
  }
  int rc = 0;
  for (int i = 1; i < argc; i++)
    rc |= check_file(argv[i]);
  return rc;
}
