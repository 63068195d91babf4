/* The log.tensorboard writer (tensorboard.h): TFRecord framing and the few protobuf fields of an
 * Event, encoded here by hand. The messages written are small and fixed — Event { double
 * wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; SessionLog
 * session_log = 7 }, Summary { repeated Value value = 1 }, Value { string tag = 1; float
 * simple_value = 2 }, SessionLog { enum status = 1 } — so a varint, a length prefix and a table
 * CRC32C are all it takes; a protobuf runtime and a CRC library would be two more packages to
 * install for about a hundred lines. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* gethostname */
#include "runtime/train/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/json.h"
#include "util/path.h"

static const char FIELD[] = "log.tensorboard";

uint32_t tb_crc32c(const void *data, size_t n)
{
  static uint32_t table[256];
  static int made;
  if (!made) { /* idempotent: two threads making it at once write the same values */
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++)
        c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      table[i] = c;
    }
    made = 1;
  }
  const unsigned char *p = data;
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++)
    crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t tb_masked_crc(uint32_t crc)
{
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static double monotonic(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_time(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- encoding: a growing byte buffer (fails once, then stays failed) ---- */

struct enc {
  unsigned char *b;
  size_t len, cap;
  int oom;
};

static void put(struct enc *e, const void *p, size_t n)
{
  if (e->oom)
    return;
  if (e->len + n > e->cap) {
    size_t cap = e->cap ? e->cap : 256;
    while (cap < e->len + n)
      cap *= 2;
    unsigned char *b = realloc(e->b, cap);
    if (!b) {
      e->oom = 1;
      return;
    }
    e->b = b;
    e->cap = cap;
  }
  memcpy(e->b + e->len, p, n);
  e->len += n;
}

static void put_le(struct enc *e, uint64_t v, int bytes)
{
  unsigned char b[8];
  for (int i = 0; i < bytes; i++)
    b[i] = (unsigned char)(v >> (8 * i));
  put(e, b, (size_t)bytes);
}

static void put_varint(struct enc *e, uint64_t v)
{
  unsigned char b[10];
  size_t n = 0;
  do {
    b[n] = (unsigned char)(v & 0x7F);
    v >>= 7;
    if (v)
      b[n] |= 0x80;
    n++;
  } while (v);
  put(e, b, n);
}

enum { WIRE_VARINT = 0, WIRE_64 = 1, WIRE_LEN = 2, WIRE_32 = 5 };

static void put_key(struct enc *e, int field, int wire)
{
  put_varint(e, (uint64_t)field << 3 | (uint64_t)wire);
}

static void put_bytes(struct enc *e, int field, const void *p, size_t n)
{
  put_key(e, field, WIRE_LEN);
  put_varint(e, n);
  put(e, p, n);
}

/* Event's wall_time (1) and step (2); the rest of the Event follows. */
static void put_event_head(struct enc *e, long long step)
{
  uint64_t bits;
  const double t = wall_time();
  memcpy(&bits, &t, sizeof bits);
  put_key(e, 1, WIRE_64);
  put_le(e, bits, 8);
  put_key(e, 2, WIRE_VARINT);
  put_varint(e, (uint64_t)step); /* int64: a negative step is ten bytes, as protobuf has it */
}

/* Value { tag = 1; simple_value = 2 } as one element of Summary's value (1). */
static void put_value(struct enc *e, const char *tag, double v)
{
  const float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  const size_t tl = strlen(tag);
  struct enc inner = { 0 };
  put_bytes(&inner, 1, tag, tl);
  put_key(&inner, 2, WIRE_32);
  put_le(&inner, bits, 4);
  if (inner.oom)
    e->oom = 1;
  else
    put_bytes(e, 1, inner.b, inner.len);
  free(inner.b);
}

/* ---- records ---- */

/* The payload framed as a record at the end of w's kept bytes. */
static int keep_record(struct tb_log *w, const struct enc *payload, char *err, size_t n)
{
  if (payload->oom)
    return errf(err, n, "%s %s: out of memory for a record", FIELD, w->path);
  struct enc r = { w->buf, w->len, w->cap, 0 };
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char)((uint64_t)payload->len >> (8 * i));
  put(&r, len8, 8);
  put_le(&r, tb_masked_crc(tb_crc32c(len8, 8)), 4);
  put(&r, payload->b, payload->len);
  put_le(&r, tb_masked_crc(tb_crc32c(payload->b, payload->len)), 4);
  w->buf = r.b;
  w->cap = r.cap;
  if (r.oom) /* w->len unchanged: the record is not kept at all */
    return errf(err, n, "%s %s: out of memory for a record", FIELD, w->path);
  w->len = r.len;
  return 0;
}

int tb_flush(struct tb_log *w, int force, char *err, size_t n)
{
  if (w->fd < 0 || !w->len)
    return 0;
  const double now = monotonic();
  if (!force && now - w->last_write < TB_FLUSH_SECONDS)
    return 0;
  char why[64];
  if (file_write_all(w->fd, w->path, w->buf, w->len, why, sizeof why)) {
    const int e = errno;
    (void)!ftruncate(w->fd, w->size); /* no half record left for a reader */
    (void)!lseek(w->fd, w->size, SEEK_SET);
    w->len = 0; /* dropped, as log.metrics drops the line it could not write */
    return errf(err, n, "%s: cannot write to %s: %s", FIELD, w->path, strerror(e));
  }
  w->size += (off_t)w->len;
  w->len = 0;
  w->last_write = now;
  return 0;
}

void tb_init(struct tb_log *w)
{
  memset(w, 0, sizeof *w);
  w->fd = -1;
  w->last_step = -1;
}

void tb_close(struct tb_log *w)
{
  if (w->fd >= 0)
    close(w->fd);
  free(w->buf);
  tb_init(w);
}

/* ---- opening ---- */

/* The folder `dir` made when absent (not its parents) and refused unless it is a folder of its
 * own name: 0, −1 or 2. */
static int own_folder(const char *dir, char *err, size_t n)
{
  struct stat st;
  if (lstat(dir, &st) && errno == ENOENT && mkdir(dir, 0755) && errno != EEXIST) /* EEXIST: another rank's */
    return errf(err, n, "%s %s: cannot make the folder: %s%s", FIELD, dir, strerror(errno),
                errno == ENOENT ? " (its parent folder must exist)" : "");
  if (lstat(dir, &st))
    return errf(err, n, "%s %s: %s", FIELD, dir, strerror(errno));
  if (S_ISLNK(st.st_mode)) {
    errf(err, n, "%s %s: is a symbolic link; give the folder itself", FIELD, dir);
    return 2;
  }
  if (!S_ISDIR(st.st_mode)) {
    errf(err, n, "%s %s: is %s, not a folder", FIELD, dir, path_kind(st.st_mode));
    return 2;
  }
  return 0;
}

int tb_open(struct tb_log *w, const char *dir, int rank, int per_rank, char *err, size_t n)
{
  tb_init(w);
  w->rank = rank;
  char folder[4200], host[256] = "host";
  int rc = own_folder(dir, err, n);
  if (rc)
    return rc;
  snprintf(folder, sizeof folder, "%s", dir);
  if (per_rank) {
    snprintf(folder, sizeof folder, "%s/rank%d", dir, rank);
    if ((rc = own_folder(folder, err, n)) != 0)
      return rc;
  }
  /* the folder opened without following a link, and the file made in it: a link swapped in
   * after the checks above is not followed either */
  const int dfd = open(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    errf(err, n, "%s %s: cannot open the folder: %s", FIELD, folder, strerror(errno));
    return errno == ELOOP || errno == ENOTDIR ? 2 : -1;
  }
  if (gethostname(host, sizeof host - 1))
    snprintf(host, sizeof host, "host");
  host[sizeof host - 1] = '\0';
  for (char *c = host; *c; c++)
    if (*c == '/')
      *c = '_';
  const long long t0 = (long long)time(NULL);
  char name[400];
  int fd = -1;
  for (long long t = t0; fd < 0 && t < t0 + 1000; t++) { /* O_EXCL: never an existing file or link */
    snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.tycho", t, host);
    fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST)
      break;
  }
  const int e = errno;
  close(dfd);
  snprintf(w->path, sizeof w->path, "%s/%s", folder, name);
  if (fd < 0)
    return errf(err, n, "%s %s: cannot create the event file %s: %s", FIELD, dir, w->path, strerror(e));
  w->fd = fd;
  struct enc ev = { 0 };
  put_event_head(&ev, 0);
  put_bytes(&ev, 3, "brain.Event:2", 13);
  rc = keep_record(w, &ev, err, n);
  free(ev.b);
  if (!rc)
    rc = tb_flush(w, 1, err, n);
  if (rc) {
    (void)unlink(w->path); /* ours: made O_EXCL above */
    tb_close(w);
    return -1;
  }
  return 0;
}

/* ---- metrics lines ---- */

struct walk {
  const struct json_doc *j;
  struct enc *e;
  int count;
};

/* Every number (and true) under node id, tagged prefix/key...; the naming rules are in
 * tensorboard.h. */
static void walk_values(struct walk *k, int id, const char *prefix)
{
  const struct json_node *nd = &k->j->nodes[id];
  char tag[512];
  double v;
  if (nd->type == JSON_NUMBER && json_double(k->j, id, &v)) {
    put_value(k->e, prefix, v);
    k->count++;
  } else if (nd->type == JSON_TRUE) {
    put_value(k->e, prefix, 1.0);
    k->count++;
  } else if (nd->type == JSON_OBJECT) {
    for (int c = nd->first; c >= 0; c = k->j->nodes[c].next) {
      snprintf(tag, sizeof tag, "%s/%s", prefix, k->j->nodes[c].key);
      walk_values(k, c, tag);
    }
  } else if (nd->type == JSON_ARRAY) {
    const char *slash = strrchr(prefix, '/');
    const char *key = slash ? slash + 1 : prefix;
    const size_t up = slash ? (size_t)(slash - prefix) : 0;
    int i = 0;
    for (int c = nd->first; c >= 0; c = k->j->nodes[c].next, i++) {
      const struct json_node *el = &k->j->nodes[c];
      const int layer = el->type == JSON_OBJECT ? json_member(k->j, c, "layer") : -1;
      if (layer >= 0 && json_double(k->j, layer, &v)) { /* moe's layers: parent/layer<L>/... */
        snprintf(tag, sizeof tag, "%.*s/layer%.0f", (int)up, prefix, v);
        for (int m = el->first; m >= 0; m = k->j->nodes[m].next) {
          if (m == layer)
            continue;
          char sub[600];
          snprintf(sub, sizeof sub, "%s/%s", tag, k->j->nodes[m].key);
          walk_values(k, m, sub);
        }
      } else { /* a list of numbers: tokens per expert, else by index */
        snprintf(tag, sizeof tag, strcmp(key, "tokens") == 0 ? "%s/expert%d" : "%s/%d", prefix, i);
        walk_values(k, c, tag);
      }
    }
  }
}

int tb_line(struct tb_log *w, enum tb_line kind, long long step, const char *line, char *err, size_t n)
{
  if (w->fd < 0)
    return 0;
  struct json_doc j;
  char why[512];
  if (json_parse(&j, line, strlen(line), "a metrics line", 0, why, sizeof why)) {
    json_free(&j);
    return errf(err, n, "%s %s: %s", FIELD, w->path, why);
  }
  if (kind == TB_MEMORY && step < 0)
    step = w->last_step < 0 ? 0 : w->last_step;
  struct enc values = { 0 };
  struct walk k = { &j, &values, 0 };
  for (int c = j.n_nodes ? j.nodes[0].first : -1; c >= 0; c = j.nodes[c].next) {
    const char *key = j.nodes[c].key;
    char tag[512];
    if (strcmp(key, "step") == 0 || strcmp(key, "event") == 0 || strcmp(key, "rank") == 0)
      continue;
    if (kind == TB_TRAIN) {
      snprintf(tag, sizeof tag, strcmp(key, "moe") == 0 ? "%s" : "train/%s", key);
    } else if (kind == TB_EVAL) {
      snprintf(tag, sizeof tag, "eval/%s", strcmp(key, "val_loss") == 0 ? "loss" : key);
    } else {
      const int r = json_member(&j, 0, "rank");
      double rv = w->rank;
      if (r >= 0)
        json_double(&j, r, &rv);
      char where[32] = "memory";
      if ((int)rv != w->rank)
        snprintf(where, sizeof where, "memory/rank%d", (int)rv);
      if (strcmp(key, "peak") == 0)
        snprintf(tag, sizeof tag, "%s", where);
      else
        snprintf(tag, sizeof tag, "%s/%s", where, key);
    }
    walk_values(&k, c, tag);
  }
  json_free(&j);
  int rc = 0;
  if (!k.count) {
    free(values.b);
    return 0;
  }
  if (!w->started) { /* SessionLog { status: START } at the run's first step (tensorboard.h) */
    struct enc ev = { 0 };
    const unsigned char start[2] = { 0x08, 0x01 };
    put_event_head(&ev, step);
    put_bytes(&ev, 7, start, sizeof start);
    rc = keep_record(w, &ev, err, n);
    free(ev.b);
    w->started = !rc;
  }
  struct enc ev = { 0 };
  put_event_head(&ev, step);
  if (values.oom)
    ev.oom = 1;
  else
    put_bytes(&ev, 5, values.b, values.len);
  free(values.b);
  if (!rc)
    rc = keep_record(w, &ev, err, n);
  free(ev.b);
  if (!rc && step > w->last_step)
    w->last_step = step;
  return rc ? rc : tb_flush(w, 0, err, n);
}
