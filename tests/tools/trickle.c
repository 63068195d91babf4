/* trickle: a client of `tycho run --listen ADDR` that never finishes its hello, to test that such
 * clients cannot hold the job's training. It connects to ADDR (a Unix socket path or HOST:PORT,
 * as host/repl/link.h parses it) and, in the default mode, sends the first 5 bytes of a hello
 * frame (its type and a length of 64) and then one byte of the payload every STEP seconds; with
 * `silent` it sends nothing. Whenever the job drops the connection it connects again, half a
 * second later. It stops after SECONDS and exits 0, whatever the job did meanwhile.
 *
 * usage: trickle ADDR SECONDS [silent] [STEP]   (STEP defaults to 3) */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "repl/link.h"

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A connection with the hello's head sent (unless silent): the fd, or −1. */
static int start(const struct link_addr *a, int silent, char *why, size_t n)
{
  int fd = link_connect_addr(a, why, n);
  if (fd < 0 || silent)
    return fd;
  static const unsigned char head[5] = { LINK_HELLO, 64, 0, 0, 0 };
  if (send(fd, head, sizeof head, MSG_NOSIGNAL) != (ssize_t)sizeof head) {
    close(fd);
    return -1;
  }
  return fd;
}

int main(int argc, char **argv)
{
  if (argc < 3) {
    fprintf(stderr, "usage: trickle ADDR SECONDS [silent] [STEP]\n");
    return 2;
  }
  struct link_addr a;
  char why[512];
  if (link_parse_addr(argv[1], &a, why, sizeof why)) {
    fprintf(stderr, "trickle: %s\n", why);
    return 2;
  }
  const double end = now() + atof(argv[2]);
  const int silent = argc > 3 && strcmp(argv[3], "silent") == 0;
  const double step = argc > 4 ? atof(argv[4]) : 3.0;
  int fd = start(&a, silent, why, sizeof why);
  while (now() < end) {
    /* sleep a step, or until the job closes the connection */
    struct pollfd p = { fd, POLLIN, 0 };
    int r = poll(&p, 1, (int)(step * 1000));
    char buf[512];
    int dropped = fd < 0 || (r > 0 && recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0);
    if (!dropped && !silent && r == 0)
      dropped = send(fd, "x", 1, MSG_NOSIGNAL) != 1;
    if (dropped) {
      if (fd >= 0)
        close(fd);
      usleep(500 * 1000);
      fd = start(&a, silent, why, sizeof why); /* −1 (the job is gone or busy): again next time */
    }
  }
  if (fd >= 0)
    close(fd);
  return 0;
}
