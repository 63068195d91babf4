/* The JSON writer (util/strbuf.h) and reader (util/json.h) agree: every string the writer is
 * given — quotes, backslashes, every control byte, DEL, multi-byte UTF-8 — reads back as the
 * same bytes, and a byte that is not UTF-8 is written as \ufffd, so the writer never produces
 * text the reader refuses. The reader takes every escape the writer or another program may use
 * (\uXXXX, surrogate pairs) and refuses invalid UTF-8 and lone surrogates with a one-line
 * message. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "util/json.h"
#include "util/strbuf.h"

/* Writes {"kk": s, s: 1} (and s as a key too) and reads it back; returns the decoded value in out. */
static int round_trip(const char *s, char *out, size_t n, long *replaced, char *err, size_t err_size)
{
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  json_begin_object(&j);
  json_key(&j, "kk"); /* no test string is "kk": the two keys differ */
  json_string(&j, s);
  json_key(&j, s);
  json_int(&j, 1);
  json_end_object(&j);
  *replaced = b.replaced;
  struct json_doc d;
  int rc = b.failed || json_parse(&d, b.s, b.n, "test", 0, err, err_size);
  if (!rc) {
    int k = json_member(&d, 0, "kk");
    rc = k < 0 || d.nodes[k].type != JSON_STRING;
    if (!rc) {
      snprintf(out, n, "%s", d.nodes[k].str);
      /* the same string as a key: the key's node is the second member */
      int second = d.nodes[k].next;
      rc = second < 0 || strcmp(d.nodes[second].key, d.nodes[k].str) != 0;
    }
  }
  json_free(&d);
  sb_free(&b);
  return rc;
}

static void hostile_strings_read_back_as_the_same_bytes(void)
{
  const char *cases[] = {
    "plain", "with \"quotes\"", "back\\slash\\", "\\\"", "\"\\\"\\", "tab\there", "new\nline\r\n",
    "\x01\x02\x03\x1e\x1f", "del \x7f", "\xc3\xa9t\xc3\xa9", /* é (2 bytes) */
    "\xe2\x82\xac", /* € (3 bytes) */ "\xf0\x9f\x98\x80", /* U+1F600 (4 bytes) */
    "\xef\xbf\xbf\xf4\x8f\xbf\xbf", /* U+FFFF, U+10FFFF */ "/slash/", "",
  };
  char out[256], err[256];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    long replaced = -1;
    err[0] = 0;
    int rc = round_trip(cases[i], out, sizeof out, &replaced, err, sizeof err);
    CHECK_MSG(rc == 0 && strcmp(out, cases[i]) == 0 && replaced == 0, "case %zu: rc %d (%s), replaced %ld",
              i, rc, err, replaced);
  }
  /* every byte 0x01..0x7f, alone and all together */
  char all[128];
  for (int c = 1; c < 128; c++) {
    char one[2] = { (char)c, 0 };
    long replaced = -1;
    int rc = round_trip(one, out, sizeof out, &replaced, err, sizeof err);
    CHECK_MSG(rc == 0 && strcmp(out, one) == 0 && replaced == 0, "byte 0x%02x: rc %d (%s)", c, rc, err);
    all[c - 1] = (char)c;
  }
  all[127] = 0;
  long replaced = -1;
  int rc = round_trip(all, out, sizeof out, &replaced, err, sizeof err);
  CHECK_MSG(rc == 0 && strcmp(out, all) == 0, "bytes 0x01..0x7f together: rc %d (%s)", rc, err);
}

static void control_bytes_are_escaped(void)
{
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  json_string(&j, "\x01\b\f\x1f\"\\\n\r\t\x7f");
  CHECK_MSG(strcmp(b.s, "\"\\u0001\\u0008\\u000c\\u001f\\\"\\\\\\n\\r\\t\x7f\"") == 0, "wrote %s", b.s);
  sb_free(&b);
}

static void invalid_utf8_is_written_as_replacement_characters(void)
{
  static const struct { const char *in, *out; long replaced; } cases[] = {
    { "\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd", 2 },         /* never in UTF-8 */
    { "a\x80z", "a\xef\xbf\xbdz", 1 },                     /* a lone continuation byte */
    { "\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd", 2 },          /* an overlong '/' */
    { "\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3 }, /* a surrogate (U+D800) */
    { "\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4 }, /* past U+10FFFF */
    { "\xe2\x82", "\xef\xbf\xbd\xef\xbf\xbd", 2 },          /* cut short at the end */
    { "\xe2\x82z\xc3\xa9", "\xef\xbf\xbd\xef\xbf\xbdz\xc3\xa9", 2 }, /* cut short, then valid text */
  };
  char out[256], err[256];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    long replaced = -1;
    err[0] = 0;
    int rc = round_trip(cases[i].in, out, sizeof out, &replaced, err, sizeof err);
    /* the key was written too: each bad byte counted twice */
    CHECK_MSG(rc == 0 && strcmp(out, cases[i].out) == 0 && replaced == 2 * cases[i].replaced,
              "case %zu: rc %d (%s), replaced %ld", i, rc, err, replaced);
  }
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  json_string(&j, "\xff");
  CHECK_MSG(strcmp(b.s, "\"\\ufffd\"") == 0, "wrote %s", b.s); /* ASCII, so visibly replaced */
  sb_free(&b);
}

/* Parses text; 0 and the string value of its only member "k" in out, or 1 and the message. */
static int read_k(const char *text, char *out, size_t n, char *err, size_t err_size)
{
  struct json_doc d;
  int rc = json_parse(&d, text, strlen(text), "t.json", 0, err, err_size);
  if (!rc) {
    int k = json_member(&d, 0, "k");
    rc = k < 0 || d.nodes[k].type != JSON_STRING;
    if (!rc)
      snprintf(out, n, "%s", d.nodes[k].str);
  }
  json_free(&d);
  return rc;
}

static void reader_takes_escapes_and_refuses_what_is_not_utf8(void)
{
  char out[64], err[256];
  CHECK(read_k("{\"k\":\"\\u00e9\\u20ac\\ud83d\\ude00\\u0001\\/\"}", out, sizeof out, err, sizeof err) == 0 &&
        strcmp(out, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x01/") == 0);
  CHECK(read_k("{\"k\":\"\\uFFFD\"}", out, sizeof out, err, sizeof err) == 0 && strcmp(out, "\xef\xbf\xbd") == 0);
  static const struct { const char *text, *message; } bad[] = {
    { "{\"k\":\"\xff\"}", "t.json: bad JSON at byte 6: invalid UTF-8 in string" },
    { "{\"k\":\"a\xc0\xaf\"}", "t.json: bad JSON at byte 7: invalid UTF-8 in string" },
    { "{\"k\":\"\xed\xa0\x80\"}", "t.json: bad JSON at byte 6: invalid UTF-8 in string" },
    { "{\"k\":\"\xe2\x82\"}", "t.json: bad JSON at byte 6: invalid UTF-8 in string" },
    { "{\"\xff\":1}", "t.json: bad JSON at byte 2: invalid UTF-8 in string" },
    { "{\"k\":\"\\ud83d\"}", "t.json: bad JSON at byte 6: high surrogate \\ud83d without a low one" },
    { "{\"k\":\"\\ude00\"}", "t.json: bad JSON at byte 6: lone low surrogate \\ude00" },
    { "{\"k\":\"\\u0000\"}", "t.json: bad JSON at byte 6: \\u0000 in a string is not supported" },
    { "{\"k\":\"\x01\"}", "t.json: bad JSON at byte 6: control character 0x01 in string" },
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = 0;
    int rc = read_k(bad[i].text, out, sizeof out, err, sizeof err);
    CHECK_MSG(rc != 0 && strcmp(err, bad[i].message) == 0, "case %zu: rc %d, message \"%s\"", i, rc, err);
  }
}

TEST_MAIN(TEST(hostile_strings_read_back_as_the_same_bytes),
          TEST(control_bytes_are_escaped),
          TEST(invalid_utf8_is_written_as_replacement_characters),
          TEST(reader_takes_escapes_and_refuses_what_is_not_utf8))
