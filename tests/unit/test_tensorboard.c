/* The log.tensorboard writer (runtime/train/tensorboard.h): its CRC32C gives the standard check
 * value, the first record of a new event file is framed and masked as TFRecord wants and holds
 * "brain.Event:2", a metrics line's numbers become the documented tags (moe layers, experts,
 * eval/loss, memory/held), records are kept until a flush and then written whole, a second file
 * made in the same second takes a later name, and a symbolic link at the folder is refused (2)
 * with nothing created. */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "runtime/train/tensorboard.h"

static char tmp[256];

static void make_tmp(void)
{
  if (!tmp[0]) {
    snprintf(tmp, sizeof tmp, "/tmp/tycho-test-tb-XXXXXX");
    if (!mkdtemp(tmp))
      tmp[0] = '\0';
  }
}

static long file_size(const char *path)
{
  struct stat st;
  return stat(path, &st) ? -1 : (long)st.st_size;
}

static size_t read_all(const char *path, unsigned char *buf, size_t cap)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return 0;
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

static int contains(const unsigned char *buf, size_t n, const char *s)
{
  const size_t k = strlen(s);
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(buf + i, s, k) == 0)
      return 1;
  return 0;
}

static uint64_t le(const unsigned char *p, int bytes)
{
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static void crc32c_check_value(void)
{
  CHECK(tb_crc32c("123456789", 9) == 0xE3069283u); /* the standard check value of CRC-32C */
  CHECK(tb_crc32c("", 0) == 0);
  const uint32_t c = 0x12345678u;
  CHECK(tb_masked_crc(c) == (((c >> 15) | (c << 17)) + 0xa282ead8u));
}

static void first_record_is_the_file_version(void)
{
  make_tmp();
  char dir[300], err[512];
  snprintf(dir, sizeof dir, "%s/first", tmp);
  struct tb_log w;
  CHECK_MSG(tb_open(&w, dir, 0, 0, err, sizeof err) == 0, "%s", err);
  CHECK(strstr(w.path, "/events.out.tfevents.") != NULL && strstr(w.path, ".tycho") != NULL);
  unsigned char buf[4096];
  const size_t n = read_all(w.path, buf, sizeof buf);
  CHECK(n > 16);
  if (n > 16) {
    const uint64_t len = le(buf, 8);
    CHECK(n == 16 + len); /* one record, whole */
    CHECK((uint32_t)le(buf + 8, 4) == tb_masked_crc(tb_crc32c(buf, 8)));
    CHECK(len + 16 <= n && (uint32_t)le(buf + 12 + len, 4) == tb_masked_crc(tb_crc32c(buf + 12, len)));
    CHECK(contains(buf, n, "brain.Event:2"));
  }
  tb_close(&w);
}

static void lines_become_tags_and_wait_for_a_flush(void)
{
  make_tmp();
  char dir[300], err[512];
  snprintf(dir, sizeof dir, "%s/tags", tmp);
  struct tb_log w;
  CHECK_MSG(tb_open(&w, dir, 0, 1, err, sizeof err) == 0, "%s", err); /* per rank: DIR/rank0 */
  CHECK(strstr(w.path, "/tags/rank0/events.out.tfevents.") != NULL);
  const long before = file_size(w.path);
  CHECK(tb_line(&w, TB_TRAIN, 1, "{\"step\": 0, \"loss\": 4.5, \"skipped\": true, \"moe\": {\"aux\": 0.25, "
                "\"layers\": [{\"layer\": 3, \"aux\": 0.5, \"tokens\": [7, 9]}]}}\n", err, sizeof err) == 0);
  CHECK(tb_line(&w, TB_EVAL, 1, "{\"step\": 1, \"val_loss\": 3.5, \"accuracy\": 0.5}\n", err, sizeof err) == 0);
  CHECK(tb_line(&w, TB_MEMORY, -1, "{\"event\": \"memory\", \"rank\": 0, \"peak\": {\"params\": 10}, "
                "\"held\": {\"params\": 8}}\n", err, sizeof err) == 0);
  CHECK(tb_line(&w, TB_MEMORY, -1, "{\"event\": \"memory\", \"rank\": 2, \"peak\": {\"params\": 12}, "
                "\"held\": {}}\n", err, sizeof err) == 0);
  CHECK(file_size(w.path) == before); /* kept: less than TB_FLUSH_SECONDS since the file opened */
  CHECK(tb_flush(&w, 1, err, sizeof err) == 0);
  unsigned char buf[8192];
  const size_t n = read_all(w.path, buf, sizeof buf);
  CHECK((long)n > before);
  static const char *const tags[] = { "train/loss", "train/skipped", "moe/aux", "moe/layer3/aux",
                                      "moe/layer3/tokens/expert1", "eval/loss", "eval/accuracy",
                                      "memory/params", "memory/held/params", "memory/rank2/params" };
  for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++)
    CHECK_MSG(contains(buf, n, tags[i]), "no tag %s", tags[i]);
  CHECK(!contains(buf, n, "train/step") && !contains(buf, n, "layers") && !contains(buf, n, "val_loss"));
  /* the records end the file whole: walking the lengths lands on its end */
  size_t at = 0;
  while (at + 16 <= n)
    at += 16 + (size_t)le(buf + at, 8);
  CHECK(at == n);
  tb_close(&w);
}

static void a_second_file_in_the_same_second_sorts_after(void)
{
  make_tmp();
  char dir[300], err[512], first[4608];
  snprintf(dir, sizeof dir, "%s/twice", tmp);
  struct tb_log a, b;
  CHECK_MSG(tb_open(&a, dir, 0, 0, err, sizeof err) == 0, "%s", err);
  snprintf(first, sizeof first, "%s", a.path);
  CHECK_MSG(tb_open(&b, dir, 0, 0, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(first, b.path) < 0); /* TensorBoard reads a folder's files in name order */
  tb_close(&a);
  tb_close(&b);
}

static void a_link_at_the_folder_is_refused(void)
{
  make_tmp();
  char dir[300], target[300], err[512];
  snprintf(target, sizeof target, "%s/target", tmp);
  snprintf(dir, sizeof dir, "%s/link", tmp);
  CHECK(mkdir(target, 0755) == 0 && symlink(target, dir) == 0);
  struct tb_log w;
  CHECK(tb_open(&w, dir, 0, 0, err, sizeof err) == 2);
  CHECK_MSG(strstr(err, "is a symbolic link") != NULL, "%s", err);
  CHECK(w.fd < 0);
  DIR *d = opendir(target);
  int entries = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    entries += e->d_name[0] != '.';
  if (d)
    closedir(d);
  CHECK(entries == 0); /* nothing written through the link */
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  CHECK(system(cmd) == 0);
}

TEST_MAIN(TEST(crc32c_check_value),
          TEST(first_record_is_the_file_version),
          TEST(lines_become_tags_and_wait_for_a_flush),
          TEST(a_second_file_in_the_same_second_sorts_after),
          TEST(a_link_at_the_folder_is_refused))
