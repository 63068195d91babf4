/* The REPL's front-end (frontend.h): the ranks' start and connections, the prompt, each chunk's
 * output shown as it arrives, Ctrl-C, and the end of the job whatever ends it. Every wait is a
 * poll() over the ranks' connections, the launcher's output and a pipe the signal handlers write
 * to, so nothing spins and nothing goes unnoticed while the user sits at the prompt. */
#define _GNU_SOURCE
#include "repl/frontend.h"

#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
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

#ifdef TYCHO_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

#include "comm/comm.h"
#include "repl/frontend_internal.h"
#include "repl/link.h"
#include "repl/repl_internal.h"
#include "util/err.h"
#include "util/launch.h"
#include "util/strbuf.h"

/* The session: one per process (signal handlers and readline's callbacks reach it). */
static struct {
  int n;
  struct rank_link *r;
  char dir[4096], sock[4200], token_file[4200];
  int listen_fd;
  pid_t launcher;
  int launcher_out, launcher_exited, launcher_code, launcher_quiet;
  struct strbuf launcher_line;
  int sig[2];
  int in_readline, dropped;
  int attached;           /* --attach: one connection to a running job, no launcher */
  double last_interrupt;
} F = { .listen_fd = -1, .launcher = -1, .launcher_out = -1, .sig = { -1, -1 } };

static void on_signal(int sig)
{
  int e = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t w = write(F.sig[1], &b, 1);
  (void)w;
  errno = e;
}

/* The folder, its token and socket: gone at every end (atexit, and before a signal's exit). */
static void remove_files(void)
{
  if (F.sock[0])
    unlink(F.sock);
  if (F.token_file[0])
    unlink(F.token_file);
  if (F.dir[0])
    rmdir(F.dir);
}

/* ---- the launcher ---- */

/* Text printed while the prompt is up goes above it. */
static void print_above(FILE *to, const char *s, size_t n)
{
#ifdef TYCHO_HAVE_READLINE
  if (F.in_readline)
    rl_clear_visible_line();
#endif
  fwrite(s, 1, n, to);
  fflush(to);
#ifdef TYCHO_HAVE_READLINE
  if (F.in_readline)
    rl_forced_update_display();
#endif
}

/* The launcher's output (the ranks' stray stdout and stderr, the launcher's own messages): shown
 * line by line as it comes; the rest at its end. */
static void launcher_read(void)
{
  char buf[4096];
  ssize_t k = read(F.launcher_out, buf, sizeof buf);
  if (k < 0 && (errno == EINTR || errno == EAGAIN))
    return;
  if (k <= 0) {
    close(F.launcher_out);
    F.launcher_out = -1;
    if (F.launcher_line.n && !F.launcher_quiet) {
      sb_put(&F.launcher_line, "\n", 1);
      print_above(stderr, F.launcher_line.s, F.launcher_line.n);
    }
    F.launcher_line.n = 0;
    return;
  }
  sb_put(&F.launcher_line, buf, (size_t)k);
  char *s = F.launcher_line.s;
  char *last = s ? memrchr(s, '\n', F.launcher_line.n) : NULL;
  if (!last)
    return;
  size_t whole = (size_t)(last - s) + 1;
  if (!F.launcher_quiet)
    print_above(stderr, s, whole);
  memmove(s, s + whole, F.launcher_line.n - whole);
  F.launcher_line.n -= whole;
}

static void launcher_reap(void)
{
  if (F.launcher <= 0 || F.launcher_exited)
    return;
  int st;
  if (waitpid(F.launcher, &st, WNOHANG) == F.launcher) {
    F.launcher_exited = 1;
    F.launcher_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
}

/* Waits up to `seconds` for the launcher to end, showing its output (then the rest of it, up to
 * a second more). 1 when it has ended. */
static int launcher_wait(double seconds)
{
  const double end = fe_now() + seconds;
  for (;;) {
    launcher_reap();
    double left = end - fe_now();
    if (F.launcher_exited && (F.launcher_out < 0 || left <= 0))
      return 1;
    if (F.launcher_exited && left > 1.0) /* its output: the ranks may hold the pipe a moment */
      left = 1.0;
    if (left <= 0)
      return 0;
    struct pollfd p[2] = { { F.sig[0], POLLIN, 0 }, { F.launcher_out, POLLIN, 0 } };
    int ms = (int)(left * 1000) + 1;
    if (poll(p, F.launcher_out >= 0 ? 2 : 1, F.launcher_exited ? ms : (ms < 100 ? ms : 100)) < 0 && errno != EINTR)
      return F.launcher_exited;
    if (p[0].revents) {
      unsigned char b[64];
      while (read(F.sig[0], b, sizeof b) > 0) {
      }
    }
    if (F.launcher_out >= 0 && p[1].revents)
      launcher_read();
    if (F.launcher_exited && F.launcher_out < 0)
      return 1;
  }
}

/* Ends the job: SIGTERM to the launcher's process group, SIGKILL after 3 s. */
static void job_terminate(void)
{
  for (int q = 0; q < F.n && F.r; q++)
    if (F.r[q].fd >= 0) { /* ranks the launcher cannot reach see their connection end */
      close(F.r[q].fd);
      F.r[q].fd = -1;
    }
  if (F.launcher <= 0 || F.launcher_exited)
    return;
  kill(-F.launcher, SIGTERM);
  if (launcher_wait(3.0))
    return;
  kill(-F.launcher, SIGKILL);
  int st;
  while (waitpid(F.launcher, &st, 0) < 0 && errno == EINTR) {
  }
  F.launcher_exited = 1;
  F.launcher_code = 128 + SIGKILL;
}

enum launcher_note { NOTE_NONE, NOTE_EXITED, NOTE_DID_NOT_START };

/* Ends the session from anywhere: the terminal restored, the job ended (its output shown unless
 * quiet), "tycho repl: MESSAGE" with the launcher's exit code as `note` says, the files removed. */
static _Noreturn void fe_end(int code, enum launcher_note note, int quiet, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static _Noreturn void fe_end(int code, enum launcher_note note, int quiet, const char *fmt, ...)
{
#ifdef TYCHO_HAVE_READLINE
  if (F.in_readline) {
    rl_free_line_state();
    rl_cleanup_after_signal();
    F.in_readline = 0;
    fputs("\n", stdout);
  }
#endif
  fflush(stdout);
  F.launcher_quiet = quiet;
  job_terminate();
  char msg[2048] = "";
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
  }
  if (msg[0]) {
    if (note == NOTE_EXITED)
      fprintf(stderr, "tycho repl: %s; the launcher exited with code %d\n", msg, F.launcher_code);
    else if (note == NOTE_DID_NOT_START)
      fprintf(stderr, "tycho repl: %s (launcher exit code %d)\n", msg, F.launcher_code);
    else
      fprintf(stderr, "tycho repl: %s\n", msg);
  }
  remove_files();
  exit(code);
}

/* A rank's connection closed (or broke) outside a quit: the launcher gets a moment to end on its
 * own (it notices a dead rank and says so), then the rest of the job is ended. */
static _Noreturn void rank_ended(int q, const char *when, const char *why)
{
  close(F.r[q].fd);
  F.r[q].fd = -1;
  if (F.attached)
    fe_end(1, NOTE_NONE, 0, "the job closed the connection %s (%s)", when, why && *why ? why : "it ended, or stopped listening");
  launcher_wait(5.0);
  fe_end(1, NOTE_EXITED, 0, "rank %d ended %s (%s)", q, when, why && *why ? why : "its connection closed");
}

/* ---- the ranks' frames ---- */

/* One frame from rank q: output queued, the end of its chunk noted. Its connection's end ends the
 * session (rank_ended). */
static void rank_frame(int q, const char *when)
{
  int type = 0;
  char *p = NULL;
  size_t n = 0;
  char why[256] = "";
  int rc = link_recv(F.r[q].fd, &type, &p, &n, NULL, why, sizeof why);
  if (rc)
    rank_ended(q, when, rc < 0 ? why : NULL);
  if (type == LINK_OUTPUT) {
    fe_output(&F.r[q], p, n);
  } else if (type == LINK_DONE) {
    int flags = 0, code = 0;
    sscanf(p, "%d %d", &flags, &code);
    F.r[q].done = 1;
    F.r[q].flags = flags;
    F.r[q].quit_code = code;
  } /* anything else (a late completion's answer) is left unread */
  free(p);
}

/* Reads the signals noted since the last call: SIGCHLD reaps the launcher, SIGTERM and SIGHUP
 * end the session. Returns how many SIGINTs came. */
static int take_signals(void)
{
  unsigned char b[64];
  ssize_t k;
  int interrupts = 0;
  while ((k = read(F.sig[0], b, sizeof b)) > 0)
    for (ssize_t i = 0; i < k; i++) {
      if (b[i] == SIGINT)
        interrupts++;
      else if (b[i] == SIGCHLD)
        launcher_reap();
      else if (b[i] == SIGTERM || b[i] == SIGHUP)
        fe_end(128 + b[i], NOTE_NONE, 1, "ended by signal %d: the job is ended too", b[i]);
    }
  return interrupts;
}

/* The poll set: the signal pipe, the launcher's output, then each rank's connection (its index in
 * which[]), then extra (or −1). Returns how many. */
static int poll_set(struct pollfd *p, int *which, int extra)
{
  int k = 0;
  p[k++] = (struct pollfd){ F.sig[0], POLLIN, 0 };
  p[k++] = (struct pollfd){ F.launcher_out, POLLIN, 0 }; /* −1: ignored by poll */
  for (int q = 0; q < F.n; q++)
    if (F.r[q].fd >= 0) {
      which[k] = q;
      p[k++] = (struct pollfd){ F.r[q].fd, POLLIN, 0 };
    }
  if (extra >= 0)
    p[k++] = (struct pollfd){ extra, POLLIN, 0 };
  return k;
}

/* Waits until fd has input, serving everything else meanwhile (between chunks the ranks only
 * speak when they end: that ends the session). 0: fd is readable; 1: Ctrl-C came. */
static int wait_input(int fd)
{
  struct pollfd *p = calloc((size_t)F.n + 3, sizeof *p);
  int *which = calloc((size_t)F.n + 3, sizeof *which);
  if (!p || !which)
    fe_end(1, NOTE_NONE, 0, "out of memory at the prompt");
  for (;;) {
    int k = poll_set(p, which, fd);
    if (poll(p, (nfds_t)k, -1) < 0) {
      if (errno == EINTR)
        continue;
      fe_end(1, NOTE_NONE, 0, "poll at the prompt: %s", strerror(errno));
    }
    int interrupted = p[0].revents ? take_signals() : 0;
    if (F.launcher_out >= 0 && p[1].revents)
      launcher_read();
    for (int i = 2; i < k - 1; i++) /* a rank's end first: it names the rank */
      if (p[i].revents) {
        rank_frame(which[i], "while the session was at the prompt");
        struct strbuf out;
        sb_init(&out);
        fe_show_ready(F.r, F.n, &out);
        if (out.n)
          print_above(stdout, out.s, out.n);
        sb_free(&out);
      }
    if (F.launcher_exited)
      fe_end(1, NOTE_NONE, 0, "the launcher exited with code %d while the session was at the prompt", F.launcher_code);
    if (interrupted || p[k - 1].revents) {
      free(p);
      free(which);
      return interrupted ? 1 : 0;
    }
  }
}

#ifdef TYCHO_HAVE_READLINE
/* readline's input: a byte of the terminal once there is one. Ctrl-C clears the line; at a
 * continuation line (">> ") it drops the whole chunk (an end of input for readline, marked). */
static int fe_getc(FILE *in)
{
  for (;;) {
    if (wait_input(fileno(in))) {
      if (rl_prompt && strcmp(rl_prompt, ">> ") == 0) {
        rl_replace_line("", 0);
        F.dropped = 1;
        return EOF;
      }
      ssize_t w = write(STDOUT_FILENO, "\n", 1);
      (void)w;
      rl_replace_line("", 0);
      rl_on_new_line();
      rl_redisplay();
      continue;
    }
    unsigned char c;
    ssize_t k = read(fileno(in), &c, 1);
    if (k == 1)
      return c;
    if (k < 0 && errno == EINTR)
      continue;
    return EOF;
  }
}

/* Completion asks rank 0, whose values these are: its candidates, one per line. */
static struct strbuf candidates;
static size_t candidate_at;

static char *candidate(const char *text, int state)
{
  (void)text;
  if (!state)
    candidate_at = 0;
  if (!candidates.s || candidate_at >= candidates.n)
    return NULL;
  char *s = candidates.s + candidate_at, *nl = memchr(s, '\n', candidates.n - candidate_at);
  size_t len = nl ? (size_t)(nl - s) : candidates.n - candidate_at;
  candidate_at += len + 1;
  return len ? strndup(s, len) : candidate(text, 1);
}

static char **fe_complete(const char *text, int start, int end)
{
  (void)start;
  (void)end;
  rl_attempted_completion_over = 1;
  candidates.n = 0;
  char why[256];
  if (F.r[0].fd < 0 || link_send(F.r[0].fd, LINK_COMPLETE, text, strlen(text), why, sizeof why))
    return NULL; /* its end shows at the next wait */
  const double end_at = fe_now() + 10;
  for (;;) {
    struct pollfd p = { F.r[0].fd, POLLIN, 0 };
    double left = end_at - fe_now();
    if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) == 0)
      return NULL;
    if (!p.revents)
      continue;
    int type = 0;
    char *s = NULL;
    size_t n = 0;
    int rc = link_recv(F.r[0].fd, &type, &s, &n, NULL, why, sizeof why);
    if (rc)
      rank_ended(0, "while the session was at the prompt", rc < 0 ? why : NULL);
    if (type == LINK_CANDIDATES) {
      sb_put(&candidates, s, n);
      free(s);
      break;
    }
    free(s);
  }
  return rl_completion_matches(text, candidate);
}
#endif

/* stdin that is not a terminal, read through wait_input (fopencookie). */
static ssize_t stdin_read(void *cookie, char *buf, size_t size)
{
  (void)cookie;
  for (;;) {
    if (wait_input(STDIN_FILENO))
      continue; /* nothing typed to clear */
    ssize_t k = read(STDIN_FILENO, buf, size);
    if (k < 0 && errno == EINTR)
      continue;
    return k;
  }
}

/* ---- the ranks' start ---- */

/* Rank connections until all N have said hello with the session's token: each checked (a wrong
 * token is refused and reported; a wrong job size or a rank twice ends the session). The
 * launcher ending first ends it with its exit code. At a terminal, a start slower than
 * SAY_WAITING_AFTER says what the prompt waits for, once (a slow launcher is no blank screen). */
#define SAY_WAITING_AFTER 2.0
static void accept_ranks(const char *token, double limit)
{
  const double deadline = fe_now() + limit, say_at = fe_now() + SAY_WAITING_AFTER;
  int connected = 0, said = !isatty(STDERR_FILENO);
  while (connected < F.n) {
    struct pollfd p[3] = { { F.sig[0], POLLIN, 0 }, { F.launcher_out, POLLIN, 0 }, { F.listen_fd, POLLIN, 0 } };
    double left = deadline - fe_now();
    if (left <= 0)
      fe_end(1, NOTE_NONE, 0, "%d of %d ranks connected within %.0f s: ending the job", connected, F.n, limit);
    if (!said && fe_now() >= say_at) {
      fprintf(stderr, "tycho repl: waiting for %d rank%s to connect (%d so far)...\n", F.n, F.n == 1 ? "" : "s",
              connected);
      said = 1;
    }
    if (!said && say_at - fe_now() < left)
      left = say_at - fe_now() > 0 ? say_at - fe_now() : 0;
    if (poll(p, 3, (int)(left * 1000) + 1) < 0 && errno != EINTR)
      fe_end(1, NOTE_NONE, 0, "poll while the ranks start: %s", strerror(errno));
    if (p[0].revents && take_signals())
      fe_end(130, NOTE_NONE, 1, "interrupted while the ranks started: the job is ended");
    if (p[1].revents)
      launcher_read();
    if (F.launcher_exited) {
      launcher_wait(1.0);
      fe_end(1, NOTE_DID_NOT_START, 0, "the ranks did not start");
    }
    if (!p[2].revents)
      continue;
    int c = accept4(F.listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
      continue;
    struct pollfd h = { c, POLLIN, 0 };
    int type = 0;
    char *s = NULL;
    size_t n = 0;
    char why[256] = "";
    if (poll(&h, 1, 10000) != 1 || link_recv(c, &type, &s, &n, NULL, why, sizeof why) != 0 || type != LINK_HELLO) {
      fprintf(stderr, "tycho repl: a connection to %s sent no greeting: refused\n", F.sock);
      free(s);
      close(c);
      continue;
    }
    int rank = -1, size = -1, pid = 0;
    char theirs[80] = "";
    int fields = sscanf(s, "%d %d %d %79s", &rank, &size, &pid, theirs);
    free(s);
    if (fields != 4 || strcmp(theirs, token) != 0) {
      fprintf(stderr, "tycho repl: a connection to %s without the session's token: refused\n", F.sock);
      close(c);
      continue;
    }
    if (size != F.n || rank < 0 || rank >= F.n || F.r[rank].fd >= 0) {
      close(c);
      fe_end(1, NOTE_NONE, 0,
             size != F.n ? "a rank says the job has %d ranks, not %d: does the launcher start {n} ranks?"
                         : "rank %d of %d connected twice",
             size != F.n ? size : rank, F.n);
    }
    F.r[rank].fd = c;
    connected++;
  }
}

/* ---- chunks ---- */

/* Sends one frame to every rank still connected; a rank that cannot take it has ended. */
static void send_all(int type, const void *payload, size_t n, const char *when)
{
  char why[256];
  for (int q = 0; q < F.n; q++)
    if (F.r[q].fd >= 0 && link_send(F.r[q].fd, type, payload, n, why, sizeof why))
      rank_ended(q, when, NULL);
}

/* Runs a chunk on every rank (the selector picks who runs it; the others answer at once) and
 * shows its output as it arrives. Sets *failed when it failed on some rank, *quit_code (≥ 0)
 * when some rank called quit(code). */
static void run_chunk(const char *sel, const char *code, size_t code_n, int *failed, int *quit_code)
{
  struct strbuf m;
  sb_init(&m);
  sb_put(&m, sel, strlen(sel) + 1);
  sb_put(&m, code, code_n);
  if (m.failed) {
    fprintf(stderr, "tycho repl: out of memory for a chunk of %zu bytes\n", code_n);
    *failed = 1;
    sb_free(&m);
    return;
  }
  for (int q = 0; q < F.n; q++) {
    F.r[q].done = F.r[q].flags = F.r[q].quit_code = 0;
    F.r[q].partial.n = 0;
  }
  send_all(LINK_CHUNK, m.s, m.n, "during the chunk");
  sb_free(&m);
  struct pollfd *p = calloc((size_t)F.n + 2, sizeof *p);
  int *which = calloc((size_t)F.n + 2, sizeof *which);
  if (!p || !which)
    fe_end(1, NOTE_NONE, 0, "out of memory running a chunk");
  F.last_interrupt = 0;
  struct strbuf out;
  sb_init(&out);
  for (;;) {
    int all_done = 1;
    for (int q = 0; q < F.n; q++) all_done &= F.r[q].done;
    if (all_done)
      break;
    out.n = 0;
    double due = fe_show_ready(F.r, F.n, &out);
    if (out.n) {
      fwrite(out.s, 1, out.n, stdout);
      fflush(stdout);
    }
    int k = poll_set(p, which, -1);
    if (poll(p, (nfds_t)k, due < 0 ? -1 : (int)(due * 1000) + 1) < 0) {
      if (errno == EINTR)
        continue;
      fe_end(1, NOTE_NONE, 0, "poll during a chunk: %s", strerror(errno));
    }
    if (p[0].revents && take_signals()) {
      const double t = fe_now();
      if (F.last_interrupt > 0 && t - F.last_interrupt < 2.0) {
        fflush(stdout);
        fputs(F.attached ? "\ntycho repl: interrupted twice: detaching (the job goes on)\n"
                         : "\ntycho repl: interrupted twice: ending the job\n", stderr);
        fe_end(130, NOTE_NONE, 1, NULL);
      }
      F.last_interrupt = t;
      fputs(F.attached ? "\n(interrupt: t:step stops at the next step boundary; again within 2 s detaches)\n"
                       : "\n(interrupt: every rank stops at the next step boundary; again within 2 s ends the job)\n",
            stderr);
      char why[256];
      for (int q = 0; q < F.n; q++)
        if (!F.r[q].done && F.r[q].fd >= 0 && link_send(F.r[q].fd, LINK_INTERRUPT, "", 0, why, sizeof why))
          rank_ended(q, "during the chunk", NULL);
    }
    if (F.launcher_out >= 0 && p[1].revents)
      launcher_read();
    for (int i = 2; i < k; i++)
      if (p[i].revents)
        rank_frame(which[i], "during the chunk");
    if (F.launcher_exited) /* its ranks' ends may still be in the pipe: the launcher's code says it */
      fe_end(1, NOTE_NONE, 0, "the launcher exited with code %d during the chunk", F.launcher_code);
  }
  sb_free(&out);
  free(p);
  free(which);
  fe_show_rest(F.r, F.n);
  for (int q = 0; q < F.n; q++) {
    if (F.r[q].flags & RANK_FAILED)
      *failed = 1;
    if ((F.r[q].flags & RANK_QUIT) && *quit_code < 0)
      *quit_code = F.r[q].quit_code; /* the lowest quitting rank's code */
  }
}

/* ---- the session ---- */

static int start_error(int code, char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int start_error(int code, char *err, size_t err_size, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_size, fmt, ap);
  va_end(ap);
  if (F.listen_fd >= 0)
    close(F.listen_fd);
  F.listen_fd = -1;
  remove_files();
  return code;
}

/* The N ranks started through the launcher, each connected (accept_ranks). 0, or the exit code
 * with err. */
static int start_ranks(const struct repl_frontend_options *o, char *err, size_t err_size)
{
  /* a private folder: the token and the socket only this user can reach */
  const char *tmp = getenv("TMPDIR");
  snprintf(F.dir, sizeof F.dir, "%s/tycho-repl-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(F.dir)) {
    int e = errno;
    char dir[sizeof F.dir];
    snprintf(dir, sizeof dir, "%s", F.dir);
    F.dir[0] = 0;
    return start_error(1, err, err_size, "cannot create the session's folder %s: %s", dir, strerror(e));
  }
  snprintf(F.token_file, sizeof F.token_file, "%s/token", F.dir);
  char token[64], why[1024];
  if (link_new_token(token, sizeof token, why, sizeof why))
    return start_error(1, err, err_size, "%s", why);
  int tf = open(F.token_file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (tf < 0 || write(tf, token, strlen(token)) != (ssize_t)strlen(token)) {
    int e = errno;
    if (tf >= 0)
      close(tf);
    return start_error(1, err, err_size, "%s: cannot write the session's token: %s", F.token_file, strerror(e));
  }
  close(tf);
  snprintf(F.sock, sizeof F.sock, "%s/sock", F.dir);
  F.listen_fd = link_listen_unix(F.sock, why, sizeof why);
  if (F.listen_fd < 0)
    return start_error(1, err, err_size, "%s", why);

  char seconds[32];
  snprintf(seconds, sizeof seconds, "%.0f", o->timeout);
  const char *args[] = { "repl", "--frontend", F.dir, "--timeout", seconds };
  int rc = launch_self_start(o->launcher ? o->launcher : launch_default(), F.n, o->self, args, 5, &F.launcher,
                             &F.launcher_out, why, sizeof why);
  if (rc)
    return start_error(rc == 2 ? 2 : 1, err, err_size, "%s", why);
  fcntl(F.launcher_out, F_SETFL, O_NONBLOCK);
  accept_ranks(token, 60 + o->timeout);
  /* every rank is in: nobody else may connect */
  close(F.listen_fd);
  F.listen_fd = -1;
  unlink(F.sock);
  unlink(F.token_file);
  return 0;
}

/* --attach: one connection to a running job's --listen, the token from its file, the job's
 * greeting back (or its refusal, shown). 0, or the exit code with err. */
static int attach_job(const struct repl_frontend_options *o, char *err, size_t err_size)
{
  struct link_addr a;
  char why[1024];
  if (link_parse_addr(o->attach, &a, why, sizeof why))
    return start_error(2, err, err_size, "--attach %s", why);
  const char *tf = o->token_file ? o->token_file : a.token_file;
  char token[128] = "";
  FILE *f = fopen(tf, "r");
  if (!f)
    return start_error(2, err, err_size, "--attach %s: cannot read the job's token %s: %s", o->attach, tf, strerror(errno));
  size_t k = fread(token, 1, sizeof token - 1, f);
  fclose(f);
  token[k] = 0;
  while (k && (token[k - 1] == '\n' || token[k - 1] == ' ' || token[k - 1] == '\r'))
    token[--k] = 0;
  int fd = link_connect_addr(&a, why, sizeof why);
  if (fd < 0)
    return start_error(1, err, err_size, "--attach: %s (is a `tycho run --listen %s` running?)", why, o->attach);
  char hello[256];
  int n = snprintf(hello, sizeof hello, "- - %ld %s", (long)getpid(), token);
  int type = 0;
  char *reply = NULL;
  size_t len = 0;
  struct pollfd p = { fd, POLLIN, 0 };
  /* the job's accept thread answers at once (repl_attach.c); no deadline: a job stopped by the
   * user (SIGSTOP) answers when it is continued */
  if (link_send(fd, LINK_HELLO, hello, (size_t)n, why, sizeof why) || poll(&p, 1, -1) != 1 ||
      link_recv(fd, &type, &reply, &len, NULL, why, sizeof why)) {
    close(fd);
    free(reply);
    return start_error(1, err, err_size, "--attach %s: the job did not answer (%s)", o->attach, why);
  }
  if (type != LINK_HELLO) {
    close(fd);
    while (len && reply[len - 1] == '\n')
      reply[--len] = 0;
    start_error(1, err, err_size, "--attach %s: the job refused this front-end: %s", o->attach, reply ? reply : "");
    free(reply);
    return 1;
  }
  free(reply);
  F.r[0].fd = fd;
  return 0;
}

int repl_frontend_run(const struct repl_frontend_options *o, char *err, size_t err_size)
{
  err[0] = 0;
  if (o->ranks < 1 && !o->attach)
    return start_error(2, err, err_size, "-n needs at least 1 rank");
  FILE *script = NULL;
  if (o->script && !(script = fopen(o->script, "r")))
    return start_error(2, err, err_size, "cannot open %s: %s", o->script, strerror(errno));
  F.n = o->attach ? 1 : o->ranks;
  F.attached = o->attach != NULL;
  F.r = calloc((size_t)F.n, sizeof *F.r);
  if (!F.r)
    return start_error(1, err, err_size, "out of memory for %d ranks", F.n);
  for (int q = 0; q < F.n; q++) {
    F.r[q].fd = -1;
    sb_init(&F.r[q].partial);
  }
  sb_init(&F.launcher_line);
  if (pipe2(F.sig, O_CLOEXEC | O_NONBLOCK))
    return start_error(1, err, err_size, "cannot create a pipe: %s", strerror(errno));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGCHLD, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  atexit(remove_files);

  int started = o->attach ? attach_job(o, err, err_size) : start_ranks(o, err, err_size);
  if (started)
    return started;

  lua_State *L = luaL_newstate(); /* the front-end's own: whether a chunk is complete */
  if (!L)
    fe_end(1, NOTE_NONE, 0, "cannot create a Lua state: not enough memory");
  struct reader r = { script ? script : stdin, 0, 0, 0, NULL };
  r.tty = !script && isatty(STDIN_FILENO);
  r.echo = !r.tty;
  FILE *piped = NULL;
  if (!script && !r.tty) {
    cookie_io_functions_t io = { .read = stdin_read };
    piped = fopencookie(NULL, "r", io);
    if (piped)
      r.in = piped;
  }
  static char history[1024];
#ifdef TYCHO_HAVE_READLINE
  if (r.tty) {
    rl_readline_name = "tycho";
    rl_catch_signals = 0;
    rl_getc_function = fe_getc;
    rl_attempted_completion_function = fe_complete;
    const char *home = getenv("HOME");
    if (home) {
      snprintf(history, sizeof history, "%s/.tycho_history", home);
      read_history(history);
      r.history = history;
    }
    stifle_history(1000);
  }
#endif

  int failed = 0, quit_code = -1, at_end = 0;
  struct strbuf chunk;
  sb_init(&chunk);
  char sel[256] = "";
  if (o->plan) {
    repl_open_chunk(&chunk, o->plan, o->sets, o->n_sets);
    run_chunk("", chunk.s ? chunk.s : "", chunk.n, &failed, &quit_code);
  }
  while (quit_code < 0) {
    F.dropped = 0;
    F.in_readline = r.tty;
    int end = repl_read_chunk(&r, L, &chunk, sel, sizeof sel);
    F.in_readline = 0;
    if (F.dropped) { /* Ctrl-C at a continuation line: the chunk is dropped */
      fputs("\n", stdout);
      continue;
    }
    if (end) {
      quit_code = !r.tty && failed ? 1 : 0;
      at_end = 1;
      if (r.tty)
        fputs("\n", stdout);
      break;
    }
    run_chunk(sel, chunk.s ? chunk.s : "", chunk.n, &failed, &quit_code);
  }
  fflush(stdout);
  sb_free(&chunk);
  lua_close(L);
  if (piped)
    fclose(piped);
  if (script)
    fclose(script);

  /* every rank ends: the quit, then the launcher's end */
  /* the ranks exit 0 (the session's code is this process's; a launcher would report theirs) */
  char why[256];
  for (int q = 0; q < F.n; q++)
    if (F.r[q].fd >= 0) {
      link_send(F.r[q].fd, LINK_QUIT, "0", 1, why, sizeof why);
      close(F.r[q].fd);
      F.r[q].fd = -1;
    }
  if (!F.attached && !launcher_wait(o->timeout + 30)) {
    fprintf(stderr, "tycho repl: the ranks did not end within %.0f s of the quit: ending the job\n", o->timeout + 30);
    job_terminate();
  }
  remove_files();
  for (int q = 0; q < F.n; q++) {
    sb_free(&F.r[q].partial);
    free(F.r[q].q);
  }
  free(F.r);
  F.r = NULL;
  sb_free(&F.launcher_line);
  if (at_end && quit_code == 1)
    snprintf(err, err_size, "a chunk failed");
  return quit_code;
}
