/* A REPL attached to a running job (repl.h, `tycho run --listen ADDR`): rank 0 listens; between
 * two steps every rank asks rank 0 whether its front-end sent something, and runs what it sent
 * as the REPL runs a chunk under an outside launcher (rank 0 broadcasts it, every rank runs it,
 * rank 0 gathers and collapses the output), with `t` the job's own trainer.
 *
 * The listening socket is rank 0's door, served by a thread of its own: it accepts, reads each
 * connection's hello without blocking (all of it within HELLO_SECONDS, at most HELLO_MAX bytes),
 * checks the token, answers, and only then hands the connection to the training thread. The
 * training thread never reads from a connection that has not shown the token: at a step boundary
 * its share of the door is one lock held around two integers and a poll() that does not wait,
 * well under 1 ms, so no client without the token can delay a step by more than that, however
 * slowly or silently it speaks and however many connect. (The attached front-end, which has the
 * token, can hold the job on purpose: t:pause().) */
#define _GNU_SOURCE
#include "repl/repl.h"

#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "repl/link.h"
#include "repl/repl_internal.h"
#include "util/err.h"
#include "util/strbuf.h"

/* What the session's chunk message carries between steps, besides a chunk (CHUNK_RUN) and the
 * front-end's end (CHUNK_QUIT: detach). */
enum { CHUNK_NOTHING = 0 };

static struct attach {
  struct repl_attach_options o;
  struct repl_options ro;   /* for closing dropped trainers, as the REPL does */
  struct link_addr addr;
  int listen_fd, conn_fd;   /* rank 0; −1 when none */
  int paused, detach;
  int agreed_paused;        /* rank 0's pause as the last message carried it (the same everywhere) */
  int bound;                /* t is the trainer */
  lua_State *L;
  FILE *log;                /* rank 0: the job's output */
  char token[40];
  int open;
} A = { .listen_fd = -1, .conn_fd = -1 };

#define S (*repl_state)

/* ---- rank 0: the socket ---- */

/* Removes what a previous job left at the address: a socket nobody listens on, its token file.
 * Anything else there is refused (nothing of the user's is removed). */
static int clear_address(const struct link_addr *a, char *err, size_t n)
{
  struct stat st;
  if (!a->tcp && lstat(a->path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return errf(err, n, "--listen %s: the path exists and is not a socket; give a new path", a->path);
    char why[256];
    int fd = link_connect_unix(a->path, why, sizeof why);
    if (fd >= 0) {
      close(fd);
      return errf(err, n, "--listen %s: another job listens there", a->path);
    }
    if (unlink(a->path))
      return errf(err, n, "--listen %s: cannot remove the stale socket: %s", a->path, strerror(errno));
  }
  if (lstat(a->token_file, &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return errf(err, n, "--listen: %s exists and is not a regular file", a->token_file);
    if (unlink(a->token_file))
      return errf(err, n, "--listen: cannot replace %s: %s", a->token_file, strerror(errno));
  }
  return 0;
}

/* The token file: created 0600 (never through a link), the token and a newline. */
static int write_token(const char *path, const char *token, char *err, size_t n)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return errf(err, n, "--listen: cannot create %s: %s", path, strerror(errno));
  char line[64];
  int k = snprintf(line, sizeof line, "%s\n", token);
  ssize_t w = write(fd, line, (size_t)k);
  int e = errno;
  if (close(fd) || w != k)
    return errf(err, n, "--listen: cannot write %s: %s", path, strerror(w < 0 ? e : EIO));
  return 0;
}

static int door_open(char *err, size_t n);

static int rank0_listen(char *err, size_t n)
{
  char why[256];
  if (link_parse_addr(A.o.addr, &A.addr, why, sizeof why))
    return errf(err, n, "--listen %s", why);
  if (clear_address(&A.addr, err, n) || link_new_token(A.token, sizeof A.token, err, n))
    return -1;
  A.listen_fd = link_listen_addr(&A.addr, err, n);
  if (A.listen_fd < 0)
    return -1;
  fcntl(A.listen_fd, F_SETFL, fcntl(A.listen_fd, F_GETFL) | O_NONBLOCK);
  if (write_token(A.addr.token_file, A.token, err, n)) {
    close(A.listen_fd);
    A.listen_fd = -1;
    if (!A.addr.tcp)
      unlink(A.addr.path);
    return -1;
  }
  if (door_open(err, n)) {
    close(A.listen_fd);
    A.listen_fd = -1;
    if (!A.addr.tcp)
      unlink(A.addr.path);
    unlink(A.addr.token_file);
    return -1;
  }
  if (A.log) {
    fprintf(A.log, "listening for `tycho repl --attach %s` (token in %s, readable by you only)\n", A.o.addr,
            A.addr.token_file);
    fflush(A.log);
  }
  return 0;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
  if (!A.log)
    return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(A.log, fmt, ap);
  va_end(ap);
  fflush(A.log);
}

/* ---- rank 0: the door (a thread of its own, see the header) ---- */

enum {
  HELLO_SECONDS = 5,  /* a connection's whole hello must arrive within this */
  HELLO_MAX = 512,    /* the longest hello payload taken ("- - PID TOKEN" is under 64 bytes) */
  PENDING_MAX = 16,   /* connections read at once; a 17th drops the oldest */
};

struct pending {
  int fd;
  double deadline;
  size_t got;                      /* bytes of the frame read so far */
  unsigned char buf[5 + HELLO_MAX]; /* the frame: type, length, payload */
};

static struct door {
  pthread_t thread;
  int started;
  int stop[2];              /* a pipe: a byte written ends the thread */
  pthread_mutex_t lock;     /* guards handed and attached, held around those two only */
  int handed;               /* a connection that showed the token, for the training thread; −1 */
  int attached;             /* the training thread holds a front-end */
  long long step;           /* the last step boundary the training thread saw, for the log */
  struct pending p[PENDING_MAX];
  int n;
  double next_log;          /* the log's next refusal line not before this (mono_now) */
  long long quiet;          /* refusals left out of the log since its last such line */
} D = { .stop = { -1, -1 }, .lock = PTHREAD_MUTEX_INITIALIZER, .handed = -1 };

static double mono_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long long door_step(void)
{
  return __atomic_load_n(&D.step, __ATOMIC_RELAXED);
}

/* 1 when a front-end is attached or about to be (handed, not yet taken). */
static int door_busy(void)
{
  pthread_mutex_lock(&D.lock);
  int busy = D.attached || D.handed >= 0;
  pthread_mutex_unlock(&D.lock);
  return busy;
}

/* Logs a refusal: at most one line a second, so that a flood of connections cannot flood the
 * job's output; the line after a quiet spell counts the refusals it left out. */
static void log_refusal(const char *why)
{
  const double t = mono_now();
  if (t < D.next_log) {
    D.quiet++;
    return;
  }
  D.next_log = t + 1;
  char more[64] = "";
  if (D.quiet)
    snprintf(more, sizeof more, " (and %lld more since the last such line)", D.quiet);
  D.quiet = 0;
  say("tycho: refused a REPL connection (%s) at step %lld%s\n", why, door_step(), more);
}

/* Tells the connection why (a message frame, never waiting: its send buffer is empty), closes it
 * and logs the refusal. */
static void refuse(int fd, const char *why, const char *to_peer)
{
  char err[256];
  link_send(fd, LINK_OUTPUT, to_peer, strlen(to_peer), err, sizeof err);
  close(fd);
  log_refusal(why);
}

static void refuse_hello(int fd, const char *why)
{
  char msg[4300];
  snprintf(msg, sizeof msg, "refused: %s (the token is in %s)\n", why, A.addr.token_file);
  refuse(fd, why, msg);
}

static void refuse_busy(int fd)
{
  refuse(fd, "another front-end is attached", "another front-end is attached to this job\n");
}

static void drop_pending(int i)
{
  D.p[i] = D.p[--D.n];
}

/* A whole hello in p: the token checked, the job's hello sent back, the connection handed to the
 * training thread (blocking again, as the link expects). */
static void hello_complete(struct pending *p)
{
  const size_t len = p->got - 5;
  char payload[HELLO_MAX + 1];
  memcpy(payload, p->buf + 5, len);
  payload[len] = 0;
  const char *tok = strrchr(payload, ' ');
  tok = tok ? tok + 1 : payload;
  if (strlen(tok) != strlen(A.token) || strcmp(tok, A.token) != 0) {
    refuse_hello(p->fd, "a wrong token");
    return;
  }
  if (door_busy()) {
    refuse_busy(p->fd);
    return;
  }
  char hello[64], err[256];
  int k = snprintf(hello, sizeof hello, "0 1 %ld -", (long)getpid());
  fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) & ~O_NONBLOCK);
  if (link_send(p->fd, LINK_HELLO, hello, (size_t)k, err, sizeof err)) {
    close(p->fd);
    return;
  }
  /* not busy above, and only the door hands: nothing took the slot meanwhile */
  pthread_mutex_lock(&D.lock);
  D.handed = p->fd;
  pthread_mutex_unlock(&D.lock);
}

/* Reads what pending connection i has sent. 1 when the connection left the list (refused,
 * handed or closed), 0 when it still waits for more. */
static int read_pending(int i)
{
  struct pending *p = &D.p[i];
  for (;;) {
    size_t want = p->got < 5 ? 5 : 5 + ((size_t)p->buf[1] | (size_t)p->buf[2] << 8 | (size_t)p->buf[3] << 16 |
                                        (size_t)p->buf[4] << 24);
    if (p->got >= 5 && (p->buf[0] != LINK_HELLO || want > sizeof p->buf)) {
      refuse_hello(p->fd, "no hello");
      drop_pending(i);
      return 1;
    }
    if (p->got == want && p->got >= 5) {
      hello_complete(p);
      drop_pending(i);
      return 1;
    }
    ssize_t r = read(p->fd, p->buf + p->got, want - p->got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    if (r <= 0) { /* gone before its hello ended */
      close(p->fd);
      log_refusal("no hello");
      drop_pending(i);
      return 1;
    }
    p->got += (size_t)r;
  }
}

static void accept_new(void)
{
  for (;;) {
    int fd = accept4(A.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
      return;
    if (door_busy()) {
      refuse_busy(fd);
      continue;
    }
    if (D.n == PENDING_MAX) { /* the oldest has had the longest to speak */
      int oldest = 0;
      for (int i = 1; i < D.n; i++)
        if (D.p[i].deadline < D.p[oldest].deadline)
          oldest = i;
      refuse_hello(D.p[oldest].fd, "no hello");
      drop_pending(oldest);
    }
    D.p[D.n++] = (struct pending){ .fd = fd, .deadline = mono_now() + HELLO_SECONDS };
  }
}

static void *door_main(void *arg)
{
  (void)arg;
  for (;;) {
    struct pollfd f[2 + PENDING_MAX];
    f[0] = (struct pollfd){ D.stop[0], POLLIN, 0 };
    f[1] = (struct pollfd){ A.listen_fd, POLLIN, 0 };
    double now = mono_now(), first = now + 3600;
    for (int i = 0; i < D.n; i++) {
      f[2 + i] = (struct pollfd){ D.p[i].fd, POLLIN, 0 };
      if (D.p[i].deadline < first)
        first = D.p[i].deadline;
    }
    const int n = D.n;
    int r = poll(f, (nfds_t)(2 + n), D.n ? (int)((first - now) * 1000) + 1 : -1);
    if (r < 0 && errno != EINTR)
      break;
    if (r > 0 && f[0].revents)
      break;
    /* from the last: a connection leaving the list moves the last one into its place */
    for (int i = n - 1; r > 0 && i >= 0; i--)
      if (f[2 + i].revents)
        read_pending(i);
    now = mono_now();
    for (int i = D.n - 1; i >= 0; i--)
      if (D.p[i].deadline <= now) {
        refuse_hello(D.p[i].fd, "no hello");
        drop_pending(i);
      }
    if (r > 0 && f[1].revents)
      accept_new();
  }
  return NULL;
}

static int door_open(char *err, size_t n)
{
  D.handed = -1;
  D.attached = 0;
  D.n = 0;
  D.next_log = 0;
  D.quiet = 0;
  if (pipe2(D.stop, O_CLOEXEC))
    return errf(err, n, "--listen: cannot create a pipe: %s", strerror(errno));
  /* the door takes no signal: Ctrl-C and the rest stay the training thread's */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&D.thread, NULL, door_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    close(D.stop[0]);
    close(D.stop[1]);
    D.stop[0] = D.stop[1] = -1;
    return errf(err, n, "--listen: cannot start the thread that accepts front-ends: %s", strerror(rc));
  }
  D.started = 1;
  return 0;
}

static void door_close(void)
{
  if (!D.started)
    return;
  ssize_t w;
  do
    w = write(D.stop[1], "", 1);
  while (w < 0 && errno == EINTR);
  pthread_join(D.thread, NULL);
  D.started = 0;
  for (int i = 0; i < D.n; i++)
    close(D.p[i].fd);
  D.n = 0;
  if (D.quiet)
    say("tycho: refused %lld more REPL connection%s after the last such line\n", D.quiet, D.quiet == 1 ? "" : "s");
  D.quiet = 0;
  if (D.handed >= 0)
    close(D.handed);
  D.handed = -1;
  close(D.stop[0]);
  close(D.stop[1]);
  D.stop[0] = D.stop[1] = -1;
}

/* The training thread, at a step boundary: takes the connection the door handed, if any. */
static void take_handed(long long step)
{
  __atomic_store_n(&D.step, step, __ATOMIC_RELAXED);
  pthread_mutex_lock(&D.lock);
  int fd = D.handed;
  D.handed = -1;
  if (fd >= 0)
    D.attached = 1;
  pthread_mutex_unlock(&D.lock);
  if (fd < 0)
    return;
  A.conn_fd = fd;
  say("tycho: a REPL attached at step %lld\n", step);
}

/* The training thread: its front-end is gone; the door may let another in. */
static void door_detached(void)
{
  pthread_mutex_lock(&D.lock);
  D.attached = 0;
  pthread_mutex_unlock(&D.lock);
}

/* Rank 0: the next thing its front-end asks for, without waiting unless `wait`. Completions are
 * answered here (from rank 0's state); an interrupt between chunks means nothing. Returns
 * CHUNK_RUN with the chunk in *sel / *code, CHUNK_QUIT when the front-end left, CHUNK_NOTHING. */
static int next_request(int wait, long long step, char **payload, size_t *len)
{
  *payload = NULL;
  *len = 0;
  take_handed(step);
  for (;;) {
    if (A.conn_fd < 0)
      return CHUNK_NOTHING;
    struct pollfd p = { A.conn_fd, POLLIN, 0 };
    int r = poll(&p, 1, wait ? -1 : 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return CHUNK_NOTHING;
    int type = 0;
    char *m = NULL;
    size_t n = 0;
    char err[256];
    if (link_recv(A.conn_fd, &type, &m, &n, NULL, err, sizeof err))
      return CHUNK_QUIT;
    if (type == LINK_CHUNK) {
      *payload = m;
      *len = n;
      return CHUNK_RUN;
    }
    if (type == LINK_QUIT) {
      free(m);
      return CHUNK_QUIT;
    }
    if (type == LINK_COMPLETE && A.L) {
      struct strbuf names;
      sb_init(&names);
      repl_completions(A.L, m, &names);
      link_send(A.conn_fd, LINK_CANDIDATES, names.s ? names.s : "", names.n, err, sizeof err);
      sb_free(&names);
    }
    free(m); /* an interrupt between chunks, or something not a front-end's: nothing to do */
  }
}

/* Rank 0, at each step boundary of an attached chunk: the front-end's Ctrl-C. */
static void poll_interrupt(void)
{
  if (A.conn_fd < 0)
    return;
  struct pollfd p = { A.conn_fd, POLLIN, 0 };
  while (poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
    int type = 0;
    char *m = NULL;
    size_t n = 0;
    char err[256];
    if (link_recv(A.conn_fd, &type, &m, &n, NULL, err, sizeof err) || type == LINK_QUIT) {
      S.interrupt_pending = 1; /* gone: stop the chunk, then detach */
      A.detach = 1;
      free(m);
      return;
    }
    if (type == LINK_INTERRUPT)
      S.interrupt_pending = 1;
    free(m);
  }
}

/* ---- every rank ---- */

static int l_pause(lua_State *L)
{
  (void)L;
  A.paused = 1;
  return 0;
}

static int l_resume(lua_State *L)
{
  (void)L;
  A.paused = 0;
  return 0;
}

static int l_detach(lua_State *L)
{
  (void)L;
  A.detach = 1;
  return 0;
}

/* t, the job's trainer, and what only an attached session has: t:pause(), t:resume(), detach(). */
static void bind_trainer(void *trainer)
{
  lua_State *L = A.L;
  A.o.bind_trainer(L, trainer);
  if (lua_getglobal(L, "t") != LUA_TNIL && lua_getmetatable(L, -1)) {
    if (lua_getfield(L, -1, "methods") == LUA_TTABLE) {
      lua_pushcfunction(L, l_pause);
      lua_setfield(L, -2, "pause");
      lua_pushcfunction(L, l_resume);
      lua_setfield(L, -2, "resume");
    }
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, l_detach);
  lua_setglobal(L, "detach");
  A.bound = 1;
}

int repl_attach_open(const struct repl_attach_options *o, char *err, size_t err_size)
{
  memset(&S, 0, sizeof S);
  A.o = *o;
  A.listen_fd = A.conn_fd = -1;
  A.log = o->log;
  S.link_fd = -1;
  S.world = comm_world();
  S.rank = S.world->rank;
  S.size = S.world->size;
  int rc = S.rank == 0 ? rank0_listen(err, err_size) : 0;
  if (comm_agree_err(S.world, rc, err, err_size, COMM_AGREE_NAME_RANK))
    return -1;
  if (comm_group_split(S.world, 0, S.rank, "repl", &S.group, err, err_size) ||
      comm_group_split(S.world, 0, S.rank, "repl-interrupt", &S.interrupt_group, err, err_size))
    return -1;
  A.L = luaL_newstate();
  if (!A.L)
    return errf(err, err_size, "cannot create a Lua state for --listen: not enough memory");
  S.L = A.L;
  o->open_libs(A.L);
  repl_install_capture(A.L);
  sb_init(&S.out);
  S.poll_interrupt = S.rank == 0 ? poll_interrupt : NULL;
  A.ro.open_libs = o->open_libs;
  A.ro.collected = o->collected;
  A.ro.close_collected = o->close_collected;
  A.open = 1;
  return 0;
}

/* One chunk on every rank; rank 0 sends the collapsed output and the end to the front-end. */
static int serve_chunk(const char *m, size_t n, char *err, size_t err_size)
{
  const char *sel = m ? m + strlen(m) + 1 : "", *code = m ? sel + strlen(sel) + 1 : "";
  const size_t code_n = m ? n - (size_t)(code - m) - 1 : 0;
  int flags = 0;
  S.out.n = 0;
  if (repl_run_message(A.L, sel, code, code_n, m != NULL, &flags, err, err_size))
    return -1;
  S.interrupt_pending = 0;
  if (S.quit) /* quit() and os.exit() in an attached session leave the job running */
    A.detach = 1;
  S.quit = 0;
  /* the output shown into memory on rank 0, for the front-end */
  char *shown = NULL;
  size_t shown_n = 0;
  FILE *mem = S.rank == 0 ? open_memstream(&shown, &shown_n) : NULL;
  int any_failed = 0, no_quit = -1;
  int rc = repl_gather_show(flags & ~RANK_QUIT, 0, "the attached REPL's end-of-chunk gather", mem ? mem : stderr,
                            &any_failed, &no_quit, err, err_size);
  if (mem)
    fclose(mem);
  if (!rc && S.rank == 0) {
    char why[256], done[32];
    /* a detach ends the front-end's session as quit(0) would */
    int k = snprintf(done, sizeof done, "%d 0", RANK_RAN | (any_failed ? RANK_FAILED : 0) | (A.detach ? RANK_QUIT : 0));
    if (A.conn_fd >= 0 && ((shown_n && link_send(A.conn_fd, LINK_OUTPUT, shown, shown_n, why, sizeof why)) ||
                           link_send(A.conn_fd, LINK_DONE, done, (size_t)k, why, sizeof why)))
      A.detach = 1; /* the front-end is gone */
  }
  free(shown);
  if (rc)
    return -1;
  return repl_close_dropped(&A.ro, A.L, err, err_size);
}

static void end_attachment(long long step)
{
  A.paused = A.agreed_paused = 0;
  A.detach = 0;
  if (S.rank == 0 && A.conn_fd >= 0) {
    close(A.conn_fd);
    A.conn_fd = -1;
    door_detached();
    say("tycho: the REPL detached at step %lld; training goes on\n", step);
  }
}

int repl_attach_between_steps(void *trainer, const long long *step_now, char *err, size_t err_size)
{
  if (!A.open)
    return 0;
  if (!A.bound)
    bind_trainer(trainer);
  for (;;) {
    const long long step = *step_now; /* a chunk may have stepped the trainer */
    /* rank 0 decides; while paused it sleeps in poll() for its front-end */
    char *payload = NULL;
    size_t len = 0;
    int kind = CHUNK_NOTHING;
    if (S.rank == 0) {
      /* a pause (or resume) a chunk just made is agreed first, so the others' wait matches it */
      kind = A.detach ? CHUNK_QUIT
             : A.paused != A.agreed_paused ? CHUNK_NOTHING
                                           : next_request(A.paused && A.conn_fd >= 0, step, &payload, &len);
      if (kind == CHUNK_NOTHING && A.paused && A.conn_fd < 0)
        kind = CHUNK_QUIT; /* paused, and the front-end is gone: training goes on */
    }
    const size_t sel_n = payload ? strnlen(payload, len) : 0;
    const char *sel = payload && sel_n < len ? payload : "";
    const char *code = payload ? (sel_n < len ? payload + sel_n + 1 : payload) : "";
    const size_t code_n = payload ? (sel_n < len ? len - sel_n - 1 : len) : 0;
    char *m = NULL;
    size_t n = 0;
    /* rank 0's pause goes with every message; the others wait asleep only while it holds */
    int rc = repl_exchange_chunk(kind, S.rank == 0 ? A.paused : 0, sel, code, code_n, A.agreed_paused, &m, &n, err,
                                 err_size);
    free(payload);
    if (rc)
      return -1;
    int agreed = CHUNK_NOTHING, paused = 0;
    sscanf(m ? m : "0 0", "%d %d", &agreed, &paused);
    A.paused = A.agreed_paused = paused;
    if (agreed == CHUNK_QUIT) {
      free(m);
      end_attachment(step);
      return 0;
    }
    if (agreed == CHUNK_NOTHING) {
      free(m);
      if (!A.paused)
        return 0;
      continue;
    }
    rc = serve_chunk(m, n, err, err_size);
    free(m);
    if (rc)
      return -1;
    if (A.detach)
      continue; /* agreed next round: rank 0 sends the quit */
  }
}

void repl_attach_close(void)
{
  if (!A.open)
    return;
  if (A.conn_fd >= 0)
    close(A.conn_fd);
  door_close();
  if (A.listen_fd >= 0) {
    close(A.listen_fd);
    if (!A.addr.tcp)
      unlink(A.addr.path);
    unlink(A.addr.token_file);
  }
  A.conn_fd = A.listen_fd = -1;
  lua_close(A.L); /* t is borrowed: its finalizer leaves the job's trainer alone */
  A.L = NULL;
  S.L = NULL;
  sb_free(&S.out);
  char why[256];
  comm_group_free(S.interrupt_group, why, sizeof why);
  comm_group_free(S.group, why, sizeof why);
  S.group = S.interrupt_group = NULL;
  A.open = 0;
}
