/* linkdrive: plays the REPL's front-end from a script, to test the ranks' side of the link
 * (host/repl/link.h) without a terminal: it listens on DIR/sock, writes a token to DIR/token
 * (mode 0600), starts the command (which runs `tycho repl --frontend DIR` on each rank), sends
 * frames and prints every frame the ranks send, with the time it came, for the test to check.
 *
 * usage: linkdrive DIR SCRIPT -- COMMAND [ARG...]
 *
 * SCRIPT holds one command per line (empty lines and lines starting with '#' are skipped):
 *
 *   hello N          accept N connections and read each one's hello; fails unless the ranks are
 *                    0..N-1, each says size N, a pid and the token. Prints "hello R N token"
 *   chunk TEXT       a chunk to every rank; TEXT "@SEL CODE" targets SEL, escapes \n \t \\
 *   interrupt        an interrupt to every rank
 *   complete WORD    a completion request to rank 0
 *   quit CODE        a quit with CODE to every rank
 *   until done|candidates
 *                    print frames until every rank has sent a done since the last chunk
 *                    (candidates: rank 0, since the last completion request)
 *   sleep SECS       wait, printing the frames that come meanwhile
 *   idle SECS MAX    as sleep; fails if a rank's process (its hello's pid) used more than MAX
 *                    seconds of CPU meanwhile. Prints "idle R SECONDS"
 *   exit CODE        wait for the command to end (the frames it still sends printed); fails
 *                    unless its exit code is CODE
 *
 * Each frame prints as "SECONDS RANK TYPE PAYLOAD" (SECONDS since the start, 3 decimals; TYPE
 * output, done or candidates; newlines in the payload as \n). Every wait gives up after 30 s.
 * Exit code: 0 when every command held, 1 (with the reason on stderr) when one did not. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "repl/link.h"

enum { MAX_RANKS = 16, WAIT_SECONDS = 30 };

static int fds[MAX_RANKS], n_ranks;
static long pids[MAX_RANKS];
static int got_done[MAX_RANKS], got_candidates; /* since the last chunk, the last completion request */
static double t0;
static pid_t child = -1;
static int child_done, child_status;

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "linkdrive: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  if (child > 0 && !child_done)
    kill(child, SIGKILL);
  exit(1);
}

static void reap(void)
{
  if (child > 0 && !child_done && waitpid(child, &child_status, WNOHANG) == child)
    child_done = 1;
}

static void print_frame(int rank, int type, const char *p, size_t n)
{
  const char *name = type == LINK_OUTPUT ? "output" : type == LINK_DONE ? "done" : type == LINK_CANDIDATES ? "candidates"
                     : type == LINK_HELLO ? "hello" : "other";
  printf("%.3f %d %s ", now() - t0, rank, name);
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\n')
      fputs("\\n", stdout);
    else
      putchar(p[i]);
  }
  putchar('\n');
  fflush(stdout);
}

/* Reads and prints frames until `type` came from every rank since the last chunk (candidates:
 * from rank 0 since the last completion request), or `seconds` passed when type is 0, or every
 * connection ended. */
static void pump(int type, double seconds)
{
  int open[MAX_RANKS];
  for (int r = 0; r < n_ranks; r++) open[r] = fds[r] >= 0;
  const double end = now() + (type ? WAIT_SECONDS : seconds);
  for (;;) {
    int need = 0, any_open = 0;
    for (int r = 0; r < n_ranks; r++) {
      any_open |= open[r];
      if (type == LINK_DONE ? !got_done[r] : type == LINK_CANDIDATES && r == 0 && !got_candidates)
        need = 1;
    }
    if (type && !need)
      return;
    if (!any_open) {
      if (type)
        fail("every connection ended before the %s frames came", type == LINK_DONE ? "done" : "candidates");
      return;
    }
    double left = end - now();
    if (left <= 0) {
      if (type)
        fail("no %s frame from every rank within the wait", type == LINK_DONE ? "done" : "candidates");
      return;
    }
    struct pollfd p[MAX_RANKS];
    int at[MAX_RANKS], k = 0;
    for (int r = 0; r < n_ranks; r++)
      if (open[r]) {
        p[k] = (struct pollfd){ fds[r], POLLIN, 0 };
        at[k++] = r;
      }
    int ready = poll(p, (nfds_t)k, (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR)
      fail("poll: %s", strerror(errno));
    for (int i = 0; ready > 0 && i < k; i++) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      int t;
      char *payload, err[256];
      size_t n;
      int rc = link_recv(p[i].fd, &t, &payload, &n, NULL, err, sizeof err);
      if (rc) {
        open[at[i]] = 0;
        continue;
      }
      print_frame(at[i], t, payload, n);
      free(payload);
      if (t == LINK_DONE)
        got_done[at[i]] = 1;
      if (t == LINK_CANDIDATES && at[i] == 0)
        got_candidates = 1;
    }
    reap();
  }
}

/* The CPU seconds (user and system) process pid has used, from /proc; −1 when unknown. */
static double cpu_seconds(long pid)
{
  char path[64], buf[2048];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the fields after the command's name */
  unsigned long long utime, stime;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
    return -1;
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static void send_all(int type, const char *p, size_t n, int only_rank0)
{
  char err[256];
  for (int r = 0; r < (only_rank0 ? 1 : n_ranks); r++)
    if (link_send(fds[r], type, p, n, err, sizeof err))
      fail("%s", err);
}

/* TEXT with \n \t \\ turned into their bytes, in place; its new length. */
static size_t unescape(char *s)
{
  char *w = s;
  for (const char *r = s; *r; r++) {
    if (*r == '\\' && r[1]) {
      r++;
      *w++ = *r == 'n' ? '\n' : *r == 't' ? '\t' : *r;
    } else {
      *w++ = *r;
    }
  }
  *w = 0;
  return (size_t)(w - s);
}

static void hello(int listener, int n, const char *token)
{
  if (n < 1 || n > MAX_RANKS)
    fail("hello: %d ranks is not 1..%d", n, MAX_RANKS);
  int seen[MAX_RANKS] = { 0 };
  for (int i = 0; i < n; i++) {
    struct pollfd p = { listener, POLLIN, 0 };
    if (poll(&p, 1, WAIT_SECONDS * 1000) <= 0)
      fail("hello: rank %d of %d did not connect within the wait", i + 1, n);
    int fd = accept(listener, NULL, NULL);
    if (fd < 0)
      fail("accept: %s", strerror(errno));
    int type;
    char *payload, err[256];
    size_t len;
    if (link_recv(fd, &type, &payload, &len, NULL, err, sizeof err))
      fail("hello: %s", err);
    int rank, size;
    long pid;
    char tok[128];
    if (type != LINK_HELLO || sscanf(payload, "%d %d %ld %127s", &rank, &size, &pid, tok) != 4)
      fail("hello: '%s' is not RANK SIZE PID TOKEN", payload);
    if (rank < 0 || rank >= n || seen[rank] || size != n || pid <= 0)
      fail("hello: '%s' has a wrong rank, size or pid", payload);
    const int token_ok = strcmp(tok, token) == 0;
    printf("hello %d %d %s\n", rank, size, token_ok ? "token" : "wrong-token");
    fflush(stdout);
    seen[rank] = 1;
    fds[rank] = fd;
    pids[rank] = pid;
    free(payload);
  }
  n_ranks = n;
}

int main(int argc, char **argv)
{
  if (argc < 5 || strcmp(argv[3], "--") != 0) {
    fprintf(stderr, "usage: linkdrive DIR SCRIPT -- COMMAND [ARG...]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  t0 = now();
  for (int r = 0; r < MAX_RANKS; r++) fds[r] = -1;
  const char *dir = argv[1];
  char path[4096], token[33], err[512];
  if (link_new_token(token, sizeof token, err, sizeof err))
    fail("%s", err);
  snprintf(path, sizeof path, "%s/token", dir);
  int tf = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (tf < 0 || write(tf, token, strlen(token)) != (ssize_t)strlen(token) || close(tf))
    fail("cannot write the token: %s", strerror(errno));
  snprintf(path, sizeof path, "%s/sock", dir);
  int listener = link_listen_unix(path, err, sizeof err);
  if (listener < 0)
    fail("%s", err);
  FILE *script = fopen(argv[2], "r");
  if (!script)
    fail("cannot open the script: %s", strerror(errno));
  child = fork();
  if (child < 0)
    fail("fork: %s", strerror(errno));
  if (child == 0) {
    close(listener);
    execvp(argv[4], argv + 4);
    perror("linkdrive: exec");
    _exit(127);
  }
  char line[8192];
  while (fgets(line, sizeof line, script)) {
    line[strcspn(line, "\n")] = 0;
    if (!line[0] || line[0] == '#')
      continue;
    char *arg = strchr(line, ' ');
    if (arg)
      *arg++ = 0;
    else
      arg = line + strlen(line);
    if (strcmp(line, "hello") == 0) {
      hello(listener, atoi(arg), token);
    } else if (strcmp(line, "chunk") == 0) {
      char msg[8192];
      size_t k = 0;
      if (arg[0] == '@') { /* the selector, then a '\0', then the code */
        char *space = strchr(arg, ' ');
        size_t sl = space ? (size_t)(space - arg - 1) : strlen(arg) - 1;
        memcpy(msg, arg + 1, sl);
        k = sl;
        arg = space ? space + 1 : arg + strlen(arg);
      }
      msg[k++] = 0;
      size_t n = unescape(arg);
      memcpy(msg + k, arg, n);
      memset(got_done, 0, sizeof got_done);
      send_all(LINK_CHUNK, msg, k + n, 0);
    } else if (strcmp(line, "interrupt") == 0) {
      send_all(LINK_INTERRUPT, "", 0, 0);
    } else if (strcmp(line, "complete") == 0) {
      got_candidates = 0;
      send_all(LINK_COMPLETE, arg, strlen(arg), 1);
    } else if (strcmp(line, "quit") == 0) {
      send_all(LINK_QUIT, arg, strlen(arg), 0);
    } else if (strcmp(line, "until") == 0) {
      pump(strcmp(arg, "done") == 0 ? LINK_DONE : LINK_CANDIDATES, 0);
    } else if (strcmp(line, "sleep") == 0) {
      pump(0, atof(arg));
    } else if (strcmp(line, "idle") == 0) {
      double secs = 0, most = 0, before[MAX_RANKS];
      if (sscanf(arg, "%lf %lf", &secs, &most) != 2)
        fail("idle takes SECS MAX_CPU_SECONDS");
      for (int r = 0; r < n_ranks; r++) before[r] = cpu_seconds(pids[r]);
      pump(0, secs);
      for (int r = 0; r < n_ranks; r++) {
        const double used = cpu_seconds(pids[r]) - before[r];
        if (before[r] < 0)
          fail("idle: rank %d's CPU time is unknown (/proc/%ld/stat)", r, pids[r]);
        printf("idle %d %.2f\n", r, used);
        fflush(stdout);
        if (used > most)
          fail("idle: rank %d used %.2f s of CPU in %.1f s at the prompt (more than %.2f s)", r, used, secs, most);
      }
    } else if (strcmp(line, "exit") == 0) {
      pump(0, WAIT_SECONDS); /* until every connection ends */
      const double end = now() + WAIT_SECONDS;
      while (!child_done && now() < end) {
        reap();
        if (!child_done)
          usleep(20000);
      }
      if (!child_done)
        fail("exit: the command did not end within the wait");
      const int code = WIFEXITED(child_status) ? WEXITSTATUS(child_status) : 128 + WTERMSIG(child_status);
      printf("exit %d\n", code);
      fflush(stdout);
      if (code != atoi(arg))
        fail("exit: the command's exit code is %d, not %s", code, arg);
    } else {
      fail("unknown script command '%s'", line);
    }
  }
  if (child > 0 && !child_done)
    kill(child, SIGKILL);
  return 0;
}
