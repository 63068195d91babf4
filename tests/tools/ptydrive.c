/* ptydrive: run a command on a pseudo-terminal of its own and drive it from a script, as a
 * person at a terminal would: type keys, wait for text, check what never appeared, check the
 * exit code. The terminal tests of `tycho repl` use it (readline, Ctrl-C, history, completion);
 * it needs no terminal multiplexer and no daemon, only /dev/ptmx.
 *
 * usage: ptydrive SCRIPT -- COMMAND [ARG...]
 *
 * The command runs in a session of its own with the pseudo-terminal as its controlling terminal
 * (120 columns, 40 rows, TERM=xterm), so a Ctrl-C typed (the byte 0x03) reaches it as SIGINT
 * through the terminal's line discipline, as at a real terminal. What it prints is kept with
 * escape sequences and carriage returns removed. SCRIPT holds one command per line:
 *
 *   send TEXT      type TEXT; escapes: \r (Enter) \t (Tab) \e (Escape) \n \\ \xHH (e.g. \x03)
 *   expect TEXT    wait until TEXT appears after the last match; the match moves past it
 *   absent TEXT    fail if TEXT appears anywhere in the output so far
 *   timeout SECS   the wait of each later expect and exit (default 10)
 *   sleep SECS     wait, reading the output meanwhile
 *   exit CODE      wait for the command to end and check its exit code
 *   # ...          a comment; empty lines are skipped
 *
 * Exit code: 0 when every line held, 1 with the failing line and the output's tail when one did
 * not, 77 when this machine cannot open a pseudo-terminal (the test is then skipped). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static char *out;         /* the cleaned output */
static size_t out_len, out_cap, out_pos; /* out_pos: where the next expect searches from */
static int esc_state;     /* 0 text, 1 after ESC, 2 in CSI, 3 in OSC/string */
static int master = -1;
static pid_t child = -1;
static int child_done, child_status;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void keep(char c) {
  if (out_len + 2 > out_cap) {
    out_cap = out_cap ? 2 * out_cap : 65536;
    out = realloc(out, out_cap);
    if (!out) { perror("ptydrive: realloc"); exit(1); }
  }
  out[out_len++] = c;
  out[out_len] = 0;
}

/* Drop what a terminal would interpret: CSI sequences (ESC [ ... final byte), OSC and other
 * string sequences (ESC ] ... BEL or ESC \), two-byte escapes, carriage returns, bells and
 * backspaces; keep the text. */
static void take(const char *buf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)buf[i];
    switch (esc_state) {
    case 0:
      if (c == 0x1b) esc_state = 1;
      else if (c == '\r' || c == 0x07 || c == 0x08) {}
      else if (c != 0) keep((char)c);
      break;
    case 1:
      if (c == '[') esc_state = 2;
      else if (c == ']' || c == 'P' || c == '_' || c == '^') esc_state = 3;
      else esc_state = 0;
      break;
    case 2:
      if (c >= 0x40 && c <= 0x7e) esc_state = 0;
      break;
    case 3:
      if (c == 0x07) esc_state = 0;
      else if (c == 0x1b) esc_state = 1; /* ESC \ ends it; the backslash is then dropped */
      break;
    }
  }
}

static void reap(void) {
  if (child_done || child < 0) return;
  int st;
  pid_t r = waitpid(child, &st, WNOHANG);
  if (r == child) { child_done = 1; child_status = st; }
}

/* Read whatever the command prints for up to `secs` seconds, or until `until` returns true. */
static int pump(double secs, int (*until)(const void *), const void *arg) {
  double end = now() + secs;
  for (;;) {
    if (until && until(arg)) return 1;
    double left = end - now();
    if (left <= 0) return until ? until(arg) : 1;
    struct pollfd p = {.fd = master, .events = POLLIN};
    int ms = (int)(left * 1000.0) + 1;
    if (ms > 100) ms = 100;
    int r = poll(&p, 1, master >= 0 ? ms : 0);
    if (r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[4096];
      ssize_t n = read(master, buf, sizeof buf);
      if (n > 0) take(buf, (size_t)n);
      else if (n < 0 && errno != EINTR && errno != EAGAIN) {
        close(master); /* EIO: every holder of the terminal has closed it */
        master = -1;
      }
    } else if (master < 0) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    reap();
  }
}

static int seen(const void *text) {
  const char *hit = strstr(out ? out + out_pos : "", (const char *)text);
  if (!hit) return 0;
  out_pos = (size_t)(hit - out) + strlen((const char *)text);
  return 1;
}
static int ended(const void *unused) {
  (void)unused;
  return child_done;
}

static size_t unescape(const char *s, char *dst) {
  size_t n = 0;
  for (; *s; s++) {
    if (*s != '\\' || !s[1]) { dst[n++] = *s; continue; }
    s++;
    switch (*s) {
    case 'r': dst[n++] = '\r'; break;
    case 'n': dst[n++] = '\n'; break;
    case 't': dst[n++] = '\t'; break;
    case 'e': dst[n++] = 0x1b; break;
    case '\\': dst[n++] = '\\'; break;
    case 'x': {
      char hex[3] = {s[1], s[1] ? s[2] : 0, 0};
      dst[n++] = (char)strtol(hex, NULL, 16);
      s += 2;
      break;
    }
    default: dst[n++] = '\\'; dst[n++] = *s; break;
    }
  }
  return n;
}

static void fail(int lineno, const char *line, const char *why) {
  fprintf(stderr, "ptydrive: line %d: %s: %s\n", lineno, line, why);
  size_t from = out_len > 3000 ? out_len - 3000 : 0;
  fprintf(stderr, "--- the terminal's last output (escapes removed):\n%s\n---\n",
          out ? out + from : "");
  if (child > 0 && !child_done) kill(-child, SIGKILL);
  exit(1);
}

int main(int argc, char **argv) {
  if (argc < 4 || strcmp(argv[2], "--") != 0) {
    fprintf(stderr, "usage: ptydrive SCRIPT -- COMMAND [ARG...]\n");
    return 2;
  }
  FILE *script = fopen(argv[1], "r");
  if (!script) {
    fprintf(stderr, "ptydrive: %s: %s\n", argv[1], strerror(errno));
    return 2;
  }
  master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
    fprintf(stderr, "ptydrive: this machine cannot open a pseudo-terminal (%s); skipped\n",
            strerror(errno));
    return 77;
  }
  const char *slave_name = ptsname(master);
  struct winsize ws = {.ws_row = 40, .ws_col = 120};
  child = fork();
  if (child < 0) { perror("ptydrive: fork"); return 1; }
  if (child == 0) {
    setsid();
    int s = open(slave_name, O_RDWR);
    if (s < 0) { perror("ptydrive: open the terminal"); _exit(127); }
    ioctl(s, TIOCSCTTY, 0);
    ioctl(s, TIOCSWINSZ, &ws);
    dup2(s, 0); dup2(s, 1); dup2(s, 2);
    if (s > 2) close(s);
    close(master);
    setenv("TERM", "xterm", 1);
    execvp(argv[3], argv + 3);
    fprintf(stderr, "ptydrive: %s: %s\n", argv[3], strerror(errno));
    _exit(127);
  }
  double wait_s = 10.0;
  char line[4096], text[4096];
  int lineno = 0;
  while (fgets(line, sizeof line, script)) {
    lineno++;
    line[strcspn(line, "\n")] = 0;
    if (!line[0] || line[0] == '#') continue;
    char *arg = strchr(line, ' ');
    if (arg) *arg++ = 0;
    else arg = line + strlen(line);
    if (!strcmp(line, "send")) {
      size_t n = unescape(arg, text);
      if (master < 0 || write(master, text, n) != (ssize_t)n) fail(lineno, arg, "the terminal is closed");
      pump(0.2, NULL, NULL); /* let it echo, as a person types at a human pace */
    } else if (!strcmp(line, "expect")) {
      size_t n = unescape(arg, text);
      text[n] = 0;
      if (!pump(wait_s, seen, text)) {
        char why[128];
        snprintf(why, sizeof why, "not shown within %g s%s", wait_s,
                 child_done ? " (the command has ended)" : "");
        fail(lineno, arg, why);
      }
    } else if (!strcmp(line, "absent")) {
      size_t n = unescape(arg, text);
      text[n] = 0;
      pump(0.05, NULL, NULL);
      if (out && strstr(out, text)) fail(lineno, arg, "shown, and it should not have been");
    } else if (!strcmp(line, "timeout")) {
      wait_s = atof(arg);
    } else if (!strcmp(line, "sleep")) {
      pump(atof(arg), NULL, NULL);
    } else if (!strcmp(line, "exit")) {
      if (!pump(wait_s, ended, NULL)) fail(lineno, arg, "the command did not end");
      int want = atoi(arg);
      int got = WIFEXITED(child_status) ? WEXITSTATUS(child_status) : 128 + WTERMSIG(child_status);
      if (got != want) {
        char why[64];
        snprintf(why, sizeof why, "exit code %d", got);
        fail(lineno, arg, why);
      }
    } else {
      fail(lineno, line, "unknown command");
    }
  }
  fclose(script);
  if (!child_done) kill(-child, SIGKILL), waitpid(child, NULL, 0);
  return 0;
}
