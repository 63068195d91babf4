/* util/file.h: every byte written past short writes and interrupted calls; an atomic replacement
 * that leaves the old file whole when the write fails midway, replaces a link instead of writing
 * through it, refuses a FIFO without waiting on it and leaves no PATH.tmp behind; a file mapped
 * whole, an empty one as nothing, a folder or a FIFO refused with the path and what it is. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "util/file.h"

static char dir[64];

/* dir/name, in one of 32 buffers used in turn (no test names more paths than that). */
static const char *at(const char *name)
{
  static char buf[32][160];
  static int next;
  char *p = buf[next++ % 32];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

static void put(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

/* The whole file as a string ("" when it cannot be read). */
static const char *get(const char *path)
{
  static char buf[256];
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (f) {
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
  }
  return buf;
}

static int exists(const char *path)
{
  struct stat st;
  return lstat(path, &st) == 0;
}

/* ---- writing all of a buffer -------------------------------------------------------------- */

static volatile sig_atomic_t ticks;
static void on_tick(int sig)
{
  (void)sig;
  ticks++;
}

struct drain {
  int fd;
  unsigned char *got;
  size_t n;
};

/* Reads the pipe slowly (a few KiB, then a pause), so the writer blocks and is interrupted. */
static void *drain_pipe(void *arg)
{
  struct drain *d = arg;
  for (;;) {
    ssize_t r = read(d->fd, d->got + d->n, 4096);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    d->n += (size_t)r;
    nanosleep(&(struct timespec){ 0, 200000 }, NULL);
  }
  return NULL;
}

static void write_all_survives_interrupted_and_short_writes(void)
{
  enum { N = 1 << 20 };
  unsigned char *src = malloc(N), *got = malloc(N + 1);
  for (size_t i = 0; i < N; i++)
    src[i] = (unsigned char)(i * 131 + (i >> 9));
  int p[2];
  CHECK(pipe(p) == 0);
  /* a handler without SA_RESTART, firing every millisecond: a blocked write returns early, with
   * what it wrote so far (a short write) or, having written nothing, EINTR */
  struct sigaction sa, old_sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tick;
  sigaction(SIGALRM, &sa, &old_sa);
  struct drain d = { p[0], got, 0 };
  pthread_t reader;
  sigset_t block, old_mask; /* the ticks land on this thread, the writer */
  sigemptyset(&block);
  sigaddset(&block, SIGALRM);
  pthread_sigmask(SIG_BLOCK, &block, &old_mask);
  pthread_create(&reader, NULL, drain_pipe, &d);
  pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
  struct itimerval every = { { 0, 1000 }, { 0, 1000 } }, off = { { 0, 0 }, { 0, 0 } };
  setitimer(ITIMER_REAL, &every, NULL);
  char err[256] = "";
  const int rc = file_write_all(p[1], "the pipe", src, N, err, sizeof err);
  setitimer(ITIMER_REAL, &off, NULL);
  sigaction(SIGALRM, &old_sa, NULL);
  close(p[1]);
  pthread_join(reader, NULL);
  close(p[0]);
  CHECK_MSG(rc == 0, "%s", err);
  CHECK_MSG(ticks > 10, "only %d interruptions during the write", (int)ticks);
  CHECK_MSG(d.n == N && memcmp(src, got, N) == 0, "read back %zu bytes of %d", d.n, N);
  free(src);
  free(got);
}

static void write_all_names_the_path_and_keeps_errno(void)
{
  char err[256] = "";
  int fd = open("/dev/full", O_WRONLY);
  if (fd >= 0) { /* a device that is always full: every write fails with ENOSPC */
    errno = 0;
    CHECK(file_write_all(fd, "/dev/full", "x", 1, err, sizeof err) != 0);
    CHECK(errno == ENOSPC);
    CHECK_MSG(strcmp(err, "cannot write /dev/full: No space left on device") == 0, "%s", err);
    close(fd);
  }
  int p[2];
  CHECK(pipe(p) == 0);
  close(p[0]);
  struct sigaction ign = { .sa_handler = SIG_IGN }, old;
  sigaction(SIGPIPE, &ign, &old);
  CHECK(file_write_all(p[1], "the pipe", "x", 1, err, sizeof err) != 0 && errno == EPIPE);
  CHECK_MSG(strcmp(err, "cannot write the pipe: Broken pipe") == 0, "%s", err);
  sigaction(SIGPIPE, &old, NULL);
  close(p[1]);
}

/* ---- atomic replacement ------------------------------------------------------------------ */

static void atomic_replace_writes_the_new_file_and_no_tmp(void)
{
  char err[256] = "";
  const char *f = at("a.txt"), *tmp = at("a.txt.tmp");
  CHECK_MSG(file_write_atomic(NULL, f, "first", 5, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(get(f), "first") == 0);
  put(tmp, "a crashed write's leftover, longer than the new text");
  CHECK_MSG(file_write_atomic(NULL, f, "second", 6, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(get(f), "second") == 0);
  CHECK(!exists(tmp));
  /* a leftover PATH.tmp that is a second name of another file: that file keeps its bytes */
  const char *other = at("other.txt");
  put(other, "other");
  CHECK(link(other, tmp) == 0);
  CHECK_MSG(file_write_atomic(NULL, f, "third", 5, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(get(f), "third") == 0 && strcmp(get(other), "other") == 0 && !exists(tmp));
  /* streamed, then abandoned: the old file stays, the temporary goes */
  struct file_atomic a;
  CHECK_MSG(file_atomic_begin(&a, NULL, f, err, sizeof err) == 0, "%s", err);
  CHECK(file_atomic_write(&a, "fourth", 6, err, sizeof err) == 0);
  CHECK(exists(tmp));
  CHECK(file_atomic_end(&a, 0, err, sizeof err) == 0);
  CHECK(strcmp(get(f), "third") == 0 && !exists(tmp));
}

static void atomic_replace_keeps_the_old_file_when_the_write_fails(void)
{
  char err[256] = "";
  const char *f = at("b.txt"), *tmp = at("b.txt.tmp");
  put(f, "old");
  /* a file-size limit below the new file, SIGXFSZ ignored: the write fails midway (EFBIG) */
  enum { N = 64 * 1024 };
  char *big = calloc(N, 1);
  struct rlimit saved, small;
  getrlimit(RLIMIT_FSIZE, &saved);
  small = saved;
  small.rlim_cur = 4096;
  struct sigaction ign = { .sa_handler = SIG_IGN }, old;
  sigaction(SIGXFSZ, &ign, &old);
  CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
  const int rc = file_write_atomic(NULL, f, big, N, err, sizeof err);
  setrlimit(RLIMIT_FSIZE, &saved);
  sigaction(SIGXFSZ, &old, NULL);
  free(big);
  CHECK(rc != 0);
  char want[256];
  snprintf(want, sizeof want, "cannot write %s: File too large", tmp);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  CHECK(strcmp(get(f), "old") == 0);
  CHECK(!exists(tmp));
}

static void atomic_replace_replaces_a_link_never_its_target(void)
{
  char err[256] = "";
  const char *target = at("target.txt"), *l = at("l.txt");
  put(target, "target");
  CHECK(symlink(target, l) == 0);
  CHECK_MSG(file_write_atomic(NULL, l, "new", 3, err, sizeof err) == 0, "%s", err);
  struct stat st;
  CHECK(lstat(l, &st) == 0 && S_ISREG(st.st_mode));
  CHECK(strcmp(get(l), "new") == 0);
  CHECK(strcmp(get(target), "target") == 0);
  /* a link at PATH.tmp is removed, not written through */
  const char *g = at("g.txt"), *gtmp = at("g.txt.tmp");
  CHECK(symlink(target, gtmp) == 0);
  CHECK_MSG(file_write_atomic(NULL, g, "g", 1, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(get(g), "g") == 0 && strcmp(get(target), "target") == 0 && !exists(gtmp));
  /* a dangling link as the destination: replaced */
  const char *dangling = at("dangling.txt");
  CHECK(symlink(at("nowhere"), dangling) == 0);
  CHECK_MSG(file_write_atomic(NULL, dangling, "d", 1, err, sizeof err) == 0, "%s", err);
  CHECK(lstat(dangling, &st) == 0 && S_ISREG(st.st_mode) && !exists(at("nowhere")));
  /* file_create refuses a link outright */
  int fd;
  CHECK(file_create(l, &fd, err, sizeof err) == 0);
  close(fd);
  CHECK(unlink(l) == 0 && symlink(target, l) == 0);
  CHECK(file_create(l, &fd, err, sizeof err) != 0 && fd == -1);
  char want[256];
  snprintf(want, sizeof want, "cannot create %s: Too many levels of symbolic links", l);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  CHECK(strcmp(get(target), "target") == 0);
}

static void special_files_are_refused_without_waiting(void)
{
  char err[256] = "", want[256];
  alarm(20); /* a FIFO waited on would hang: the alarm ends the test instead */
  const char *p = at("p"), *q = at("q.txt"), *qtmp = at("q.txt.tmp");
  CHECK(mkfifo(p, 0644) == 0);
  CHECK(file_write_atomic("export.path", p, "x", 1, err, sizeof err) != 0);
  snprintf(want, sizeof want, "export.path %s: is a FIFO, not a regular file", p);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  struct stat st;
  CHECK(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode) && !exists(at("p.tmp")));
  /* a FIFO at PATH.tmp: refused and left as it is */
  CHECK(mkfifo(qtmp, 0644) == 0);
  CHECK(file_write_atomic(NULL, q, "x", 1, err, sizeof err) != 0);
  snprintf(want, sizeof want, "%s: is a FIFO, not a regular file", qtmp);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  CHECK(lstat(qtmp, &st) == 0 && S_ISFIFO(st.st_mode) && !exists(q));
  /* a folder as the destination */
  CHECK(file_write_atomic(NULL, dir, "x", 1, err, sizeof err) != 0);
  snprintf(want, sizeof want, "%s: is a folder, not a regular file", dir);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  /* file_create on a FIFO (no reader): refused, not waited on */
  int fd;
  CHECK(file_create(p, &fd, err, sizeof err) != 0);
  snprintf(want, sizeof want, "%s: is a FIFO, not a regular file", p);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  alarm(0);
}

static void sync_folder_names_the_folder(void)
{
  char err[256] = "";
  CHECK_MSG(file_sync_folder(dir, err, sizeof err) == 0, "%s", err);
  const char *none = at("none");
  CHECK(file_sync_folder(none, err, sizeof err) != 0);
  char want[256];
  snprintf(want, sizeof want, "cannot sync %s: No such file or directory", none);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  const char *s = at("synced.txt");
  CHECK_MSG(file_write_synced(s, "abc", 3, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(get(s), "abc") == 0);
  CHECK_MSG(file_write_synced(s, "d", 1, err, sizeof err) == 0, "%s", err); /* truncated first */
  CHECK(strcmp(get(s), "d") == 0);
}

/* ---- mapping --------------------------------------------------------------------------- */

static void map_reads_regular_files_and_refuses_the_rest(void)
{
  char err[256] = "", want[256];
  struct file_map m = { (void *)1, 7 };
  const char *e = at("empty"), *full = at("full");
  put(e, "");
  CHECK_MSG(file_map(NULL, e, 0, &m, err, sizeof err) == 0, "%s", err);
  CHECK(m.data == NULL && m.bytes == 0);
  file_unmap(&m);
  put(full, "mapped bytes");
  CHECK_MSG(file_map(NULL, full, 0, &m, err, sizeof err) == 0, "%s", err);
  CHECK(m.bytes == 12 && m.data && memcmp(m.data, "mapped bytes", 12) == 0);
  file_unmap(&m);
  CHECK(m.data == NULL && m.bytes == 0);
  CHECK(file_map("init.from", full, 4, &m, err, sizeof err) != 0);
  snprintf(want, sizeof want, "init.from %s: is 12 bytes, more than the 4 such a file may have", full);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  CHECK(file_map(NULL, dir, 0, &m, err, sizeof err) != 0 && m.data == NULL);
  snprintf(want, sizeof want, "%s: is a folder, not a regular file", dir);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  alarm(20);
  const char *p = at("map_fifo");
  CHECK(mkfifo(p, 0644) == 0);
  CHECK(file_map("data.train", p, 0, &m, err, sizeof err) != 0);
  snprintf(want, sizeof want, "data.train %s: is a FIFO, not a regular file", p);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
  alarm(0);
  const char *none = at("none");
  CHECK(file_map(NULL, none, 0, &m, err, sizeof err) != 0);
  snprintf(want, sizeof want, "%s: cannot open: No such file or directory", none);
  CHECK_MSG(strcmp(err, want) == 0, "'%s', expected '%s'", err, want);
}

static void remove_dir(void)
{
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
}

static void make_dir(void)
{
  strcpy(dir, "/tmp/test_file.XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
}

static void run_in_a_fresh_folder(void (*fn)(void))
{
  make_dir();
  fn();
  remove_dir();
}

/* Each test of files in a folder of its own, removed after it. */
#define IN_FOLDER(name) static void name##_in_folder(void) { run_in_a_fresh_folder(name); }
#define FOLDER_TEST(name) { #name, name##_in_folder }
IN_FOLDER(atomic_replace_writes_the_new_file_and_no_tmp)
IN_FOLDER(atomic_replace_keeps_the_old_file_when_the_write_fails)
IN_FOLDER(atomic_replace_replaces_a_link_never_its_target)
IN_FOLDER(special_files_are_refused_without_waiting)
IN_FOLDER(sync_folder_names_the_folder)
IN_FOLDER(map_reads_regular_files_and_refuses_the_rest)

TEST_MAIN(TEST(write_all_survives_interrupted_and_short_writes),
          TEST(write_all_names_the_path_and_keeps_errno),
          FOLDER_TEST(atomic_replace_writes_the_new_file_and_no_tmp),
          FOLDER_TEST(atomic_replace_keeps_the_old_file_when_the_write_fails),
          FOLDER_TEST(atomic_replace_replaces_a_link_never_its_target),
          FOLDER_TEST(special_files_are_refused_without_waiting),
          FOLDER_TEST(sync_folder_names_the_folder),
          FOLDER_TEST(map_reads_regular_files_and_refuses_the_rest))
