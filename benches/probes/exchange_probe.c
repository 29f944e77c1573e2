// The floor under a 2-rank small all-reduce over TCP loopback: two
// processes that do nothing but what such an op must, each round sending
// SIZE bytes to the other and polling a non-blocking recv until the
// other's SIZE bytes are in (docs/perf.md, seventeenth session: 2.7-2.8 us
// per round on this VM, of which the send call is 1.9-2.2 us; ringwire's
// 8-byte op took 5.3 us and Open MPI's 4.7 in the same hour).
//
//   cc -O2 -o /tmp/exchange_probe benches/probes/exchange_probe.c
//   /tmp/exchange_probe [SIZE (64)] [YIELD between polls: 0|1 (0)] [IOV: 0|1 (0)]
//
// IOV=1 sends with sendmsg and three iovecs (header, payload, padding), as
// ringwire's engine does; it costs about 0.1 us more per send.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int rounds = 200000, warmup = 1000;
    int size = argc > 1 ? atoi(argv[1]) : 64;
    int yield = argc > 2 ? atoi(argv[2]) : 0;
    int iov = argc > 3 ? atoi(argv[3]) : 0;
    if (size < 57 || size > 65536) {
        fprintf(stderr, "SIZE must be 57..65536\n");
        return 2;
    }
    int listener = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(listener, (void *)&addr, sizeof addr) || listen(listener, 1) ||
        getsockname(listener, (void *)&addr, &len)) {
        perror("listen");
        return 1;
    }
    int child = fork(), s;
    if (child == 0) {
        s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&addr, sizeof addr)) {
            perror("connect");
            return 1;
        }
    } else {
        s = accept(listener, 0, 0);
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    static char buf[65536 + 512];
    memset(buf, 1, sizeof buf);
    double start = 0, in_send = 0;
    for (int i = 0; i < rounds + warmup; i++) {
        if (i == warmup)
            start = now();
        double t = now();
        if (iov) {
            struct iovec v[3] = {{buf, 48}, {buf + 128, 8}, {buf + 256, size - 56}};
            struct msghdr m = {.msg_iov = v, .msg_iovlen = 3};
            sendmsg(s, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else {
            send(s, buf, size, 0);
        }
        if (i >= warmup)
            in_send += now() - t;
        for (int got = 0; got < size;) {
            int r = recv(s, buf + got, size - got, MSG_DONTWAIT);
            if (r > 0)
                got += r;
            else if (yield)
                sched_yield();
        }
    }
    if (child) {
        double total = now() - start;
        printf("size %d, yield %d, iov %d: %.2f us per round, %.2f us of it in the send call\n",
               size, yield, iov, total / rounds * 1e6, in_send / rounds * 1e6);
        wait(0);
    }
    return 0;
}
