/* The SPMD REPL (repl.h). Shaped like Lua's lua.c: rank 0 reads and compiles to see whether a
 * chunk is complete; every rank compiles and runs what rank 0 sends (or, served by a front-end,
 * what the front-end sends it). This file holds the session: its state, Ctrl-C, running a chunk,
 * serving a front-end and the loop; reading, completion and the plan's open are in repl_read.c,
 * the chunk broadcast and the dropped trainers' agreement in repl_agree.c, showing the output in
 * repl_show.c, values in repl_value.c, a running job's REPL in repl_attach.c (repl_internal.h). */
#define _POSIX_C_SOURCE 200809L
#include "repl/repl.h"

#include <errno.h>
#include <lauxlib.h>
#include <lualib.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef TYCHO_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

#include "comm/comm.h"
#include "repl/link.h"
#include "repl/repl_internal.h"
#include "repl/repl_value.h"
#include "util/err.h"
#include "util/strbuf.h"

/* ---- the session's state ---- */

static struct repl_session S;
struct repl_session *const repl_state = &S;

/* ---- the front-end's connection (repl --frontend) ---- */

/* Every frame this rank sends goes under send_lock, so frames never interleave. */
static pthread_mutex_t send_lock = PTHREAD_MUTEX_INITIALIZER;

static void link_out(int type, const void *p, size_t n)
{
  pthread_mutex_lock(&send_lock);
  char err[256];
  if (S.link_fd >= 0 && !S.link_broken && link_send(S.link_fd, type, p, n, err, sizeof err))
    S.link_broken = 1; /* the front-end is gone: its reader sees the end and the session quits */
  pthread_mutex_unlock(&send_lock);
}

/* Sends the output held back (a partial line too). */
static void line_flush(void)
{
  if (!S.line.n)
    return;
  link_out(LINK_OUTPUT, S.line.s, S.line.n);
  S.line_open = S.line.s[S.line.n - 1] != '\n';
  S.line.n = 0;
}

/* Output with a front-end: whole lines go out as they are made, a partial line waits for its end
 * (or for 4 KiB of it). */
static void line_put(const char *s, size_t n)
{
  sb_put(&S.line, s, n);
  if (S.line.n >= 4096) {
    line_flush();
    return;
  }
  size_t end = S.line.n;
  while (end && S.line.s[end - 1] != '\n')
    end--;
  if (!end)
    return;
  link_out(LINK_OUTPUT, S.line.s, end);
  S.line_open = 0;
  memmove(S.line.s, S.line.s + end, S.line.n - end);
  S.line.n -= end;
}

static void out_put(const char *s, size_t n)
{
  if (S.link_fd >= 0) {
    size_t room = S.out_total < OUTPUT_MAX_BYTES ? OUTPUT_MAX_BYTES - S.out_total : 0;
    size_t take = n < room ? n : room;
    S.out_total += take;
    S.out_cut += (int)(n - take);
    if (take)
      line_put(s, take);
    return;
  }
  if (S.out.n + n > OUTPUT_MAX_BYTES) {
    size_t room = S.out.n < OUTPUT_MAX_BYTES ? OUTPUT_MAX_BYTES - S.out.n : 0;
    sb_put(&S.out, s, room);
    S.out_cut += (int)(n - room);
    return;
  }
  sb_put(&S.out, s, n);
}

/* print, captured: as Lua's (tostring of each, tabs between, a newline). */
static int l_print(lua_State *L)
{
  int n = lua_gettop(L);
  for (int i = 1; i <= n; i++) {
    size_t len;
    const char *s = luaL_tolstring(L, i, &len);
    if (i > 1)
      out_put("\t", 1);
    out_put(s, len);
    lua_pop(L, 1);
  }
  out_put("\n", 1);
  return 0;
}

/* io.write, captured (strings and numbers, as io.write takes them). */
static int l_io_write(lua_State *L)
{
  int n = lua_gettop(L);
  for (int i = 1; i <= n; i++) {
    size_t len;
    const char *s = lua_type(L, i) == LUA_TNUMBER ? luaL_tolstring(L, i, &len) : luaL_checklstring(L, i, &len);
    out_put(s, len);
    if (lua_type(L, i) == LUA_TNUMBER)
      lua_pop(L, 1);
  }
  return 0;
}

/* quit([code]) and os.exit([code]): end the session on every rank after this chunk. */
static int l_quit(lua_State *L)
{
  S.quit = 1;
  S.quit_code = lua_isboolean(L, 1) ? (lua_toboolean(L, 1) ? 0 : 1) : (int)luaL_optinteger(L, 1, 0);
  return 0;
}

static int msghandler(lua_State *L)
{
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* ---- Ctrl-C ---- */

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One rank alone: Ctrl-C in Lua code raises "interrupted!" at the next instruction, as lua.c
 * does. With several ranks an error raised at a different point on each rank could send one of
 * them into a collective alone, so there only step boundaries stop (agreed) — unless this rank
 * has begun no comm operation since the chunk began (a pure Lua loop, interrupted through the
 * front-end on every rank): then no peer can be waiting for it. */
static void interrupt_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  if (S.size > 1 && comm_ops_started() != S.ops_at_chunk)
    return; /* the step boundary decides (interrupt_pending stays) */
  S.interrupt_pending = 0;
  luaL_error(L, "interrupted!");
}

enum { HOOK_MASK = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT };

/* Guards, with a front-end, the interrupt state the reader thread and the main thread share:
 * in_chunk, interrupt_pending, chunks_queued / chunks_done, and setting the hook. */
static pthread_mutex_t chunk_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long chunks_queued, chunks_done;

/* The reader thread, on LINK_INTERRUPT or the front-end's end: a chunk queued or running is
 * interrupted; between chunks nothing is. */
static void link_interrupt(void)
{
  pthread_mutex_lock(&chunk_lock);
  if (chunks_queued > chunks_done) {
    S.interrupt_pending = 1;
    if (S.in_chunk && S.L)
      lua_sethook(S.L, interrupt_hook, HOOK_MASK, 1);
  }
  pthread_mutex_unlock(&chunk_lock);
}

static void on_sigint(int sig)
{
  (void)sig;
  if (S.in_chunk && S.size == 1 && S.L)
    lua_sethook(S.L, interrupt_hook, HOOK_MASK, 1);
  if (S.in_chunk) {
    double t = now_seconds();
    if (S.last_interrupt > 0 && t - S.last_interrupt < 2.0) {
      static const char msg[] = "\ntycho repl: interrupted twice: ending the job\n";
      ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
      (void)w;
      _exit(130);
    }
    S.interrupt_pending = 1;
    S.last_interrupt = t;
    if (S.size > 1) {
      static const char msg[] = "\n(interrupt: every rank stops at the next step boundary; again within 2 s ends the job)\n";
      ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
      (void)w;
    }
    return;
  }
  S.at_prompt = 2; /* the reader clears the line */
#ifdef TYCHO_HAVE_READLINE
  if (isatty(STDIN_FILENO)) {
    ssize_t w = write(STDOUT_FILENO, "\n", 1);
    (void)w;
    rl_replace_line("", 0);
    rl_on_new_line();
    rl_redisplay();
  }
#endif
}

int repl_stop_requested(void *ctx)
{
  (void)ctx;
  if (!S.group)
    return 0;
  if (S.restricted) /* part of the job: no agreement possible, and a step there is refused anyway */
    return 0;
  if (S.chunk_interrupted)
    return 2; /* every later step of the chunk: it ends */
  if (S.rank == 0 && S.poll_interrupt) /* an attached front-end's Ctrl-C (repl_attach.c) */
    S.poll_interrupt();
  unsigned char flag = S.rank == 0 ? (unsigned char)(S.interrupt_pending != 0) : 0;
  char err[256];
  /* timed: inside a chunk every rank is due here, and one the chunk left out never comes */
  if (S.size > 1 && comm_control_bcast_timed(S.interrupt_group, &flag, 1, 0,
                                             "the REPL's interrupt check at a step boundary", err, sizeof err))
    return 0;
  if (flag) {
    S.interrupt_pending = 0;
    S.chunk_interrupted = 1;
    if (S.L)
      lua_sethook(S.L, NULL, 0, 0); /* handled here: t:step returns normally */
  }
  return flag;
}

/* ---- running (every rank) ---- */

static int get_coord(lua_State *L)
{
  /* (t, axis) -> t[axis], under pcall: a non-trainer t may raise */
  lua_gettable(L, 1);
  return 1;
}

static int coords_of_t(lua_State *L, int c[3], char *err, size_t n)
{
  static const char *const axes[3] = { "tp", "dp", "pp" };
  for (int a = 0; a < 3; a++) {
    lua_pushcfunction(L, get_coord);
    lua_getglobal(L, "t");
    if (lua_isnil(L, -1)) {
      lua_pop(L, 2);
      return errf(err, n, "a coordinate selector needs the trainer t (tycho repl PLAN.lua, or t = tycho.open(...))"), -1;
    }
    lua_pushstring(L, axes[a]);
    int st = lua_pcall(L, 2, 1, 0);
    if (st != LUA_OK || !lua_isinteger(L, -1)) {
      lua_pop(L, 1);
      return errf(err, n, "a coordinate selector needs the trainer t; t.%s is not a number here", axes[a]), -1;
    }
    c[a] = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  return 0;
}

/* Runs code on this rank with output captured into S.out; returns RANK_* flags. */
static int run_chunk(lua_State *L, const char *code, size_t n)
{
  S.out.n = 0;
  S.out_cut = 0;
  S.out_total = 0;
  int flags = RANK_RAN;
  lua_pushcfunction(L, msghandler);
  int base = lua_gettop(L);
  int status = luaL_loadbuffer(L, code, n, "=stdin");
  if (status == LUA_OK) {
    pthread_mutex_lock(&chunk_lock);
    S.in_chunk = 1;
    S.chunk_interrupted = 0;
    S.ops_at_chunk = comm_ops_started();
    if (S.link_fd >= 0 && S.interrupt_pending) /* it came before the chunk started */
      lua_sethook(L, interrupt_hook, HOOK_MASK, 1);
    pthread_mutex_unlock(&chunk_lock);
    status = lua_pcall(L, 0, LUA_MULTRET, base);
    pthread_mutex_lock(&chunk_lock);
    S.in_chunk = 0;
    lua_sethook(L, NULL, 0, 0);
    pthread_mutex_unlock(&chunk_lock);
  }
  if (status != LUA_OK) {
    size_t len;
    const char *msg = lua_tolstring(L, -1, &len);
    out_put(msg ? msg : "(error)", msg ? len : 7);
    out_put("\n", 1);
    flags |= RANK_FAILED;
  } else if (lua_gettop(L) > base) { /* values returned: shown by their contents (repl_value.h) */
    int nres = lua_gettop(L) - base;
    lua_pushcfunction(L, repl_format_values);
    lua_insert(L, base + 1);
    size_t len;
    const int shown = lua_pcall(L, nres, 1, base);
    const char *text = lua_tolstring(L, -1, &len);
    out_put(text ? text : "(error)", text ? len : 7);
    if (shown != LUA_OK) {
      out_put("\n", 1);
      flags |= RANK_FAILED;
    }
  }
  lua_settop(L, base - 1);
  if (S.out_cut) {
    char note[96];
    int k = snprintf(note, sizeof note, "(%d more bytes of output cut)\n", S.out_cut);
    if (S.link_fd >= 0) { /* on a line of its own */
      if (S.line.n ? S.line.s[S.line.n - 1] != '\n' : S.line_open)
        sb_put(&S.line, "\n", 1);
      sb_put(&S.line, note, (size_t)k);
    } else {
      if (S.out.n && S.out.s[S.out.n - 1] != '\n') /* on a line of its own */
        sb_put(&S.out, "\n", 1);
      sb_put(&S.out, note, (size_t)k);
    }
  }
  if (S.link_fd >= 0)
    line_flush();
  if (S.quit)
    flags |= RANK_QUIT;
  return flags;
}

/* Runs one chunk message on every rank (collective: every rank calls it for every message, in
 * the same order): who runs it by its selector (sel, without '@'; "" for every rank; have 0 when
 * this rank could not receive the message), then the chunk on those ranks, restricted to them.
 * The RANK_* flags into *flags (0: not selected); −1 with err when the comm layer failed. */
int repl_run_message(lua_State *L, const char *sel, const char *code, size_t code_n, int have, int *flags,
                       char *err, size_t err_size)
{
  unsigned char *members = calloc((size_t)S.size, 1);
  *flags = 0;
  char why[512] = "";
  int sel_kind = !have ? -1 : sel[0] ? (members ? repl_parse_selector(sel, S.size, members, why, sizeof why) : -1) : 2;
  int me = 0;
  if (sel_kind == 2) {
    if (members)
      memset(members, 1, (size_t)S.size);
    me = 1;
  } else if (sel_kind == 0) {
    me = members[S.rank];
  } else if (sel_kind == 1) {
    int c[3];
    int match = coords_of_t(L, c, why, sizeof why) ? -1 : repl_selector_match(sel, c[0], c[1], c[2], why, sizeof why);
    me = match == 1;
    /* every rank's answer, so the comm layer knows the chunk's set */
    unsigned char mine = (unsigned char)(match < 0 ? 2 : match);
    char *all[1] = { NULL };
    char **per = S.rank == 0 ? calloc((size_t)S.size, sizeof *per) : all;
    size_t *counts = S.rank == 0 ? calloc((size_t)S.size, sizeof *counts) : NULL;
    if (comm_control_gather(S.group, &mine, 1, 0, per, counts, "the REPL's selector gather", err, err_size)) {
      free(members);
      return -1;
    }
    /* rank 0 sends every rank's answer (0, 1, or 2 for "could not tell"), in members */
    if (S.rank == 0)
      for (int q = 0; q < S.size; q++) {
        if (members)
          members[q] = per[q] && counts[q] == 1 ? (unsigned char)per[q][0] : 2;
        free(per[q]);
      }
    if (S.rank == 0) {
      free(per);
      free(counts);
    }
    if (!members)
      return errf(err, err_size, "out of memory for the REPL's selector");
    if (comm_control_bcast(S.group, members, (size_t)S.size, 0, "the REPL's selector broadcast", err, err_size)) {
      free(members);
      return -1;
    }
    int bad = 0;
    for (int q = 0; q < S.size; q++) {
      bad |= members[q] == 2;
      members[q] = members[q] == 1;
    }
    if (bad)
      sel_kind = -1; /* every rank says why (its own reason, or the set's) */
    if (bad && !why[0])
      snprintf(why, sizeof why, "@%s: some rank could not tell its coordinates", sel);
  }
  if (!have) {
    snprintf(why, sizeof why, "out of memory receiving a chunk");
    sel_kind = -1;
  }
  if (sel_kind < 0) {
    out_put(why, strlen(why));
    out_put("\n", 1);
    *flags = RANK_RAN | RANK_FAILED;
  } else {
    int all = 1;
    for (int q = 0; q < S.size && members; q++) all &= members[q];
    S.restricted = !all;
    if (S.restricted)
      comm_restrict(members, S.size);
    if (me)
      *flags = run_chunk(L, code, code_n);
    comm_restrict(NULL, 0);
    S.restricted = 0;
  }
  free(members);
  return 0;
}

/* ---- serving a front-end (repl --frontend DIR) ---- */

/* What the reader thread hands the main thread: chunks, quits and completion requests, in the
 * order they came (under chunk_lock; q_ready signalled at each). */
struct item {
  int type;
  char *payload;
  size_t n;
  struct item *next;
};
static struct item *q_head, *q_tail;
static pthread_cond_t q_ready = PTHREAD_COND_INITIALIZER;
static pthread_t reader_thread;
static int reader_started;

static void enqueue(int type, char *payload, size_t n)
{
  struct item *it = malloc(sizeof *it);
  if (!it) {
    free(payload);
    return;
  }
  *it = (struct item){ type, payload, n, NULL };
  pthread_mutex_lock(&chunk_lock);
  if (type == LINK_CHUNK)
    chunks_queued++;
  if (q_tail)
    q_tail->next = it;
  else
    q_head = it;
  q_tail = it;
  pthread_cond_signal(&q_ready);
  pthread_mutex_unlock(&chunk_lock);
}

/* Blocks (no spinning: an idle session sleeps here) until the reader hands something over. */
static struct item *dequeue(void)
{
  pthread_mutex_lock(&chunk_lock);
  while (!q_head)
    pthread_cond_wait(&q_ready, &chunk_lock);
  struct item *it = q_head;
  q_head = it->next;
  if (!q_head)
    q_tail = NULL;
  pthread_mutex_unlock(&chunk_lock);
  return it;
}

/* The reader thread: sleeps in read(). An interrupt acts at once; the end of the connection (the
 * front-end is gone) interrupts the running chunk and quits with 1 after it. */
static void *link_reader(void *arg)
{
  (void)arg;
  for (;;) {
    int type;
    char *payload;
    size_t n;
    char err[256];
    if (link_recv(S.link_fd, &type, &payload, &n, NULL, err, sizeof err)) {
      link_interrupt();
      char *one = malloc(2);
      if (one)
        memcpy(one, "1", 2);
      enqueue(LINK_QUIT, one, one ? 1 : 0);
      return NULL;
    }
    if (type == LINK_INTERRUPT) {
      free(payload);
      link_interrupt();
    } else if (type == LINK_CHUNK || type == LINK_QUIT || type == LINK_COMPLETE) {
      enqueue(type, payload, n);
      if (type == LINK_QUIT)
        return NULL;
    } else {
      free(payload); /* not a front-end's message: ignored */
    }
  }
}

/* Connects to DIR/sock and says hello ("RANK SIZE PID TOKEN", the token from DIR/token). */
static int link_open(const char *dir, char *err, size_t err_size)
{
  char path[4096], token[256];
  snprintf(path, sizeof path, "%s/token", dir);
  FILE *f = fopen(path, "r");
  if (!f)
    return errf(err, err_size, "%s: cannot read the session's token: %s", path, strerror(errno));
  size_t k = fread(token, 1, sizeof token - 1, f);
  fclose(f);
  token[k] = 0;
  while (k && (token[k - 1] == '\n' || token[k - 1] == '\r' || token[k - 1] == ' '))
    token[--k] = 0;
  if (!k)
    return errf(err, err_size, "%s: the session's token is empty", path);
  snprintf(path, sizeof path, "%s/sock", dir);
  int fd = link_connect_unix(path, err, err_size);
  if (fd < 0)
    return -1;
  char hello[384];
  int n = snprintf(hello, sizeof hello, "%d %d %ld %s", S.rank, S.size, (long)getpid(), token);
  if (link_send(fd, LINK_HELLO, hello, (size_t)n, err, err_size)) {
    close(fd);
    return -1;
  }
  S.link_fd = fd;
  return 0;
}

static void link_close(void)
{
  if (S.link_fd < 0)
    return;
  shutdown(S.link_fd, SHUT_RDWR); /* the reader's read() returns */
  if (reader_started)
    pthread_join(reader_thread, NULL);
  reader_started = 0;
  close(S.link_fd);
  S.link_fd = -1;
  while (q_head) {
    struct item *it = q_head;
    q_head = it->next;
    free(it->payload);
    free(it);
  }
  q_tail = NULL;
  sb_free(&S.line);
}

/* The session with a front-end: every rank takes the chunks from its own connection (the
 * front-end sends each one to every rank, in one order) and streams its output back; the
 * front-end shows it and collects the ends. The exit code, or −1 with err (the comm layer
 * failed). */
static int serve_frontend(const struct repl_options *o, lua_State *L, char *err, size_t err_size)
{
  for (;;) {
    struct item *it = dequeue();
    if (it->type == LINK_QUIT) {
      long code = it->payload ? strtol(it->payload, NULL, 10) : 1;
      free(it->payload);
      free(it);
      return code < 0 || code > 255 ? 1 : (int)code;
    }
    if (it->type == LINK_COMPLETE) {
      struct strbuf names;
      sb_init(&names);
      repl_completions(L, it->payload, &names);
      link_out(LINK_CANDIDATES, names.s ? names.s : "", names.n);
      sb_free(&names);
      free(it->payload);
      free(it);
      continue;
    }
    /* a chunk: selector '\0' code (without a '\0', all of it is code) */
    const size_t sel_n = strnlen(it->payload, it->n);
    const char *sel = sel_n < it->n ? it->payload : "";
    const char *code = sel_n < it->n ? it->payload + sel_n + 1 : it->payload;
    const size_t code_n = sel_n < it->n ? it->n - sel_n - 1 : it->n;
    S.out_cut = 0;
    S.out_total = 0;
    S.line.n = 0;
    S.line_open = 0;
    int flags = 0;
    int rc = repl_run_message(L, sel, code, code_n, 1, &flags, err, err_size);
    free(it->payload);
    free(it);
    line_flush();
    if (rc)
      return -1;
    char done[64];
    int k = snprintf(done, sizeof done, "%d %d", flags, (flags & RANK_QUIT) ? S.quit_code : 0);
    link_out(LINK_DONE, done, (size_t)k);
    S.quit = 0;
    S.quit_code = 0;
    pthread_mutex_lock(&chunk_lock);
    chunks_done++;
    S.interrupt_pending = 0;
    pthread_mutex_unlock(&chunk_lock);
    if (repl_close_dropped(o, L, err, err_size))
      return -1;
  }
}

/* ---- the session ---- */

void repl_install_capture(lua_State *L)
{
  lua_pushcfunction(L, l_print);
  lua_setglobal(L, "print");
  lua_pushcfunction(L, l_quit);
  lua_setglobal(L, "quit");
  repl_install_help(L);
  if (lua_getglobal(L, "io") == LUA_TTABLE) {
    lua_pushcfunction(L, l_io_write);
    lua_setfield(L, -2, "write");
  }
  lua_pop(L, 1);
  if (lua_getglobal(L, "os") == LUA_TTABLE) {
    lua_pushcfunction(L, l_quit);
    lua_setfield(L, -2, "exit");
  }
  lua_pop(L, 1);
}

int repl_run(const struct repl_options *o, char *err, size_t err_size)
{
  memset(&S, 0, sizeof S);
  S.world = comm_world();
  S.rank = S.world->rank;
  S.size = S.world->size;
  if (comm_group_split(S.world, 0, S.rank, "repl", &S.group, err, err_size) ||
      comm_group_split(S.world, 0, S.rank, "repl-interrupt", &S.interrupt_group, err, err_size))
    return 1;
  comm_set_timeout(o->timeout);
  lua_State *L = luaL_newstate();
  if (!L)
    return errf(err, err_size, "cannot create a Lua state: not enough memory"), 1;
  S.L = L;
  o->open_libs(L);
  repl_install_capture(L);
  sb_init(&S.out);

  struct reader r = { stdin, 0, 0, 0, NULL };
  FILE *script = NULL;
  int usage = 0;
  S.link_fd = -1;
  if (o->frontend) {
    usage = link_open(o->frontend, err, err_size);
    signal(SIGINT, SIG_IGN); /* interrupts come from the front-end, as messages */
  } else if (S.rank == 0) {
    if (o->script) {
      script = fopen(o->script, "r");
      if (!script)
        usage = errf(err, err_size, "cannot open %s: %s", o->script, strerror(errno));
      r.in = script;
    }
    r.tty = !script && isatty(STDIN_FILENO);
    r.echo = !r.tty;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL); /* no SA_RESTART: fgets at the prompt returns */
#ifdef TYCHO_HAVE_READLINE
    if (r.tty) {
      rl_catch_signals = 0;
      rl_attempted_completion_function = repl_complete_names;
      const char *home = getenv("HOME");
      if (home) {
        static char path[1024];
        snprintf(path, sizeof path, "%s/.tycho_history", home);
        read_history(path);
        r.history = path;
      }
      stifle_history(1000);
    }
#endif
  } else {
    signal(SIGINT, SIG_IGN); /* rank 0 relays interrupts; a forwarded one must not end a rank */
  }
  /* agree that rank 0 could start (its script file), that every rank reached its front-end: a
   * usage error, exit 2 on every rank */
  if (comm_agree_err(S.group, usage, err, err_size, COMM_AGREE_PLAIN)) {
    link_close();
    lua_close(L);
    return 2;
  }
  int served = -1;
  if (S.link_fd >= 0) {
    if (pthread_create(&reader_thread, NULL, link_reader, NULL) == 0) {
      reader_started = 1;
      served = serve_frontend(o, L, err, err_size);
    } else {
      errf(err, err_size, "cannot start the REPL's reader thread");
    }
  }

  int any_failed = 0, exit_code = -1, first = 1, next_kind = CHUNK_RUN, next_code = 0, quit_now = 0;
  struct strbuf chunk;
  sb_init(&chunk);
  char sel[256];
  if (S.link_fd >= 0)
    exit_code = served; /* the front-end's session is over: no reading here */
  while (S.link_fd < 0) {
    /* rank 0: the next chunk; the plan's open comes first */
    if (S.rank == 0) {
      int kind = CHUNK_RUN;
      if (quit_now) {
        kind = CHUNK_QUIT;
      } else if (first && o->plan) {
        chunk.n = 0;
        sel[0] = 0;
        repl_open_chunk(&chunk, o->plan, o->sets, o->n_sets);
      } else if (repl_read_chunk(&r, L, &chunk, sel, sizeof sel)) {
        kind = CHUNK_QUIT;
      }
      next_kind = kind;
      next_code = kind == CHUNK_QUIT ? (exit_code >= 0 ? exit_code : (!r.tty && any_failed ? 1 : 0)) : 0;
    }
    first = 0;
    char *m = NULL;
    size_t n = 0;
    if (repl_exchange_chunk(next_kind, next_code, sel, chunk.s, chunk.n, 1, &m, &n, err, err_size))
      break;
    int kind = 0, code_exit = 0;
    sscanf(m ? m : "0 0", "%d %d", &kind, &code_exit);
    if (kind == CHUNK_QUIT) {
      free(m);
      exit_code = code_exit;
      break;
    }
    const char *msel = m ? m + strlen(m) + 1 : "", *code = m ? msel + strlen(msel) + 1 : "";
    const size_t code_n = m ? n - (size_t)(code - m) - 1 : 0;

    int flags = 0;
    S.out.n = 0;
    if (repl_run_message(L, msel, code, code_n, m != NULL, &flags, err, err_size)) {
      free(m);
      break;
    }
    free(m);
    S.interrupt_pending = 0;

    /* every rank's status and output, shown by rank 0 */
    int rc = repl_gather_show(flags, S.quit_code, "the REPL's end-of-chunk gather", stdout, &any_failed, &exit_code,
                              err, err_size);
    S.quit = 0;
    if (rc)
      break;
    if (repl_close_dropped(o, L, err, err_size))
      break;
    /* a chunk asked to quit: rank 0 sends the quit with its code next */
    if (S.rank == 0 && exit_code >= 0)
      quit_now = 1;
  }
  sb_free(&chunk);
  link_close();
  if (script)
    fclose(script);
  lua_close(L); /* finalizes the trainers: closed now on one rank, set aside with peers */
  if (o->collected && o->close_collected) {
    unsigned long long serials[256];
    int n = o->collected(serials, 256); /* every rank set aside every trainer it had: the same set */
    n = n < 256 ? n : 256;
    for (int i = 1; i < n; i++) /* in one order everywhere: closing frees groups, collectively */
      for (int j = i; j > 0 && serials[j - 1] > serials[j]; j--) {
        unsigned long long x = serials[j];
        serials[j] = serials[j - 1];
        serials[j - 1] = x;
      }
    o->close_collected(serials, n);
  }
  sb_free(&S.out);
  char why[256];
  comm_group_free(S.interrupt_group, why, sizeof why);
  comm_group_free(S.group, why, sizeof why);
  S.group = S.interrupt_group = NULL;
  return exit_code < 0 ? 1 : exit_code;
}
