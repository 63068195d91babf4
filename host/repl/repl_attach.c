/* A REPL attached to a running job (repl.h, `tycho run --listen ADDR`): rank 0 listens; between
 * two steps every rank asks rank 0 whether its front-end sent something, and runs what it sent
 * as the REPL runs a chunk under an outside launcher (rank 0 broadcasts it, every rank runs it,
 * rank 0 gathers and collapses the output), with `t` the job's own trainer. */
#define _GNU_SOURCE
#include "repl/repl.h"

#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

/* A connection waiting at the listening socket: the first is checked (its LINK_HELLO must
 * carry the token, within 5 s) and becomes the front-end; while one is attached, others are told
 * so and closed. Every refusal is logged. */
static void accept_pending(long long step)
{
  for (;;) {
    int fd = accept4(A.listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      return;
    char err[256];
    if (A.conn_fd >= 0) {
      static const char msg[] = "another front-end is attached to this job\n";
      link_send(fd, LINK_OUTPUT, msg, sizeof msg - 1, err, sizeof err);
      close(fd);
      say("tycho: refused a REPL connection (%s) at step %lld\n", "another front-end is attached", step);
      continue;
    }
    struct timeval tv = { 5, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int type = 0;
    char *payload = NULL;
    size_t len = 0;
    int ok = link_recv(fd, &type, &payload, &len, NULL, err, sizeof err) == 0 && type == LINK_HELLO;
    const char *why = !ok ? "no hello" : "a wrong token";
    if (ok) {
      const char *tok = strrchr(payload, ' ');
      tok = tok ? tok + 1 : payload;
      ok = strlen(tok) == strlen(A.token) && strcmp(tok, A.token) == 0;
    }
    free(payload);
    if (!ok) {
      char msg[128];
      int k = snprintf(msg, sizeof msg, "refused: %s (the token is in %s)\n", why, A.addr.token_file);
      link_send(fd, LINK_OUTPUT, msg, (size_t)k, err, sizeof err);
      close(fd);
      say("tycho: refused a REPL connection (%s) at step %lld\n", why, step);
      continue;
    }
    tv.tv_sec = 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char hello[64];
    int k = snprintf(hello, sizeof hello, "0 1 %ld -", (long)getpid());
    if (link_send(fd, LINK_HELLO, hello, (size_t)k, err, sizeof err)) {
      close(fd);
      continue;
    }
    A.conn_fd = fd;
    say("tycho: a REPL attached at step %lld\n", step);
  }
}

/* Rank 0: the next thing its front-end asks for, without waiting unless `wait`. Completions are
 * answered here (from rank 0's state); an interrupt between chunks means nothing. Returns
 * CHUNK_RUN with the chunk in *sel / *code, CHUNK_QUIT when the front-end left, CHUNK_NOTHING. */
static int next_request(int wait, long long step, char **payload, size_t *len)
{
  *payload = NULL;
  *len = 0;
  for (;;) {
    accept_pending(step);
    if (A.conn_fd < 0 && !wait)
      return CHUNK_NOTHING;
    struct pollfd p[2] = { { A.conn_fd, POLLIN, 0 }, { A.listen_fd, POLLIN, 0 } };
    int r = poll(p, 2, wait ? -1 : 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return CHUNK_NOTHING;
    if (p[1].revents)
      accept_pending(step);
    if (A.conn_fd < 0 || !(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
      continue;
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
