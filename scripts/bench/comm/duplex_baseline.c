/* The same-shape baseline for a 2-rank all-reduce over loopback TCP: two processes joined by
 * one TCP connection, each sending `size` bytes and receiving `size` bytes at once, from one
 * thread that polls the socket and moves up to 4 MiB per write and read (TCP_NODELAY, kernel
 * default buffers: what Cortado's ranks do). A 2-rank ring all-reduce of `size` bytes sends
 * and receives exactly `size` bytes per rank, so `size / time` here is the bus bandwidth an
 * all-reduce could reach if reducing cost nothing: the figure Cortado's busbw is compared with.
 *
 *   duplex_baseline LO HI      sizes LO, 2 LO, ... HI bytes; one JSON line per size (rank 0)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PIECE (4u << 20)

static void die(const char* what) {
  fprintf(stderr, "duplex_baseline: %s: %s\n", what, strerror(errno));
  exit(1);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Sends and receives n bytes at once on fd. */
static void duplex(int fd, const char* out, char* in, size_t n) {
  size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    struct pollfd p = {fd, (short)((got < n ? POLLIN : 0) | (sent < n ? POLLOUT : 0)), 0};
    if (poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if ((p.revents & POLLOUT) && sent < n) {
      size_t want = n - sent < PIECE ? n - sent : PIECE;
      ssize_t k = send(fd, out + sent, want, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) sent += (size_t)k;
      else if (k < 0 && errno != EAGAIN && errno != EINTR) die("send");
    }
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) && got < n) {
      size_t want = n - got < PIECE ? n - got : PIECE;
      ssize_t k = recv(fd, in + got, want, MSG_DONTWAIT);
      if (k > 0) got += (size_t)k;
      else if (k == 0) { fprintf(stderr, "duplex_baseline: peer closed\n"); exit(1); }
      else if (errno != EAGAIN && errno != EINTR) die("recv");
    }
  }
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: duplex_baseline LO HI (bytes)\n");
    return 2;
  }
  const size_t lo = strtoull(argv[1], NULL, 10), hi = strtoull(argv[2], NULL, 10);
  if (lo == 0 || hi < lo) {
    fprintf(stderr, "duplex_baseline: need 0 < LO <= HI\n");
    return 2;
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (listener < 0 || bind(listener, (struct sockaddr*)&a, sizeof a) < 0 || listen(listener, 1) < 0 ||
      getsockname(listener, (struct sockaddr*)&a, &len) < 0) {
    die("listen");
  }
  const pid_t child = fork();
  if (child < 0) die("fork");
  int fd;
  if (child == 0) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a) < 0) die("connect");
  } else {
    fd = accept(listener, NULL, NULL);
    if (fd < 0) die("accept");
  }
  close(listener);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char* out = malloc(hi);
  char* in = malloc(hi);
  if (!out || !in) die("malloc");
  memset(out, 1, hi);
  memset(in, 0, hi);
  for (size_t size = lo; size <= hi; size *= 2) {
    /* About 0.25 s of traffic per size at a few GB/s, at least 3 and at most 1000 rounds. */
    size_t iters = (size_t)(256u << 20) / size;
    if (iters < 3) iters = 3;
    if (iters > 1000) iters = 1000;
    duplex(fd, out, in, size); /* warm-up, and both sides start together */
    const double t0 = now_us();
    for (size_t i = 0; i < iters; ++i) duplex(fd, out, in, size);
    const double us = (now_us() - t0) / (double)iters;
    if (child != 0) {
      printf("{\"bytes\":%zu,\"time_us\":%.2f,\"busbw\":%.4f}\n", size, us, (double)size / us / 1e3);
      fflush(stdout);
    }
  }
  close(fd);
  if (child != 0) waitpid(child, NULL, 0);
  return 0;
}
