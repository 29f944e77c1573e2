// Two properties of this project's VM (AMD EPYC, FSRM) that set how fast the
// kernel's socket copies run, measured in user space with the same `rep
// movsb` the kernel's copy_from_iter / copy_to_iter use (docs/perf.md, tenth
// session):
//
//  1. `rep movsb` runs about 15x slower when (dst - src) mod 4096 is 1..15.
//     A TCP send copies a frame's payload to the socket's page fragment
//     right after the 56-byte header, so a payload at page offset 41..55
//     (with the fragment at offset 0) was copied that slowly, until wire
//     version 2 padded the header to keep the payload's alignment (0016).
//  2. Writing lines another core has just read costs a cross-core snoop per
//     line: 2-9 GB/s against about 45 on one core, and the cross-core part
//     moves with the host's vCPU placement.
//
//   cc -O2 -pthread -o /tmp/copy_probe benches/probes/copy_probe.c && /tmp/copy_probe
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline void movsb(void *d, const void *s, size_t n) {
    asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n)::"memory");
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

#define FRAG 32768 /* the kernel's page fragment: 32 KiB */
static char *page, *src, *sink;
static _Atomic long turn;
enum { HANDOFFS = 20000 };

static void *reader(void *arg) {
    (void)arg;
    pin(1);
    for (long i = 0; i < HANDOFFS; i++) {
        while (atomic_load(&turn) != 2 * i + 1) {}
        movsb(sink, page, FRAG);
        atomic_store(&turn, 2 * i + 2);
    }
    return NULL;
}

int main(void) {
    size_t total = 1 << 20;
    src = aligned_alloc(4096, total + 8192);
    char *dst = aligned_alloc(4096, FRAG + 8192);
    memset(src, 1, total + 8192);
    memset(dst, 2, FRAG + 8192);
    printf("1. rep movsb, 32 KiB copies from a 1 MiB source, by (dst - src) mod 4096:\n");
    int deltas[] = {0, 1, 8, 15, 16, 40, 56, 64, 4096 + 8};
    for (unsigned k = 0; k < sizeof deltas / sizeof *deltas; k++) {
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now();
            for (int it = 0; it < 32; it++)
                for (size_t o = 0; o < total; o += FRAG) movsb(dst + deltas[k], src + o, FRAG);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("   delta %5d: %5.1f GB/s\n", deltas[k], 32.0 * total / best / 1e9);
    }

    page = aligned_alloc(4096, FRAG);
    sink = aligned_alloc(4096, FRAG);
    memset(page, 0, FRAG);
    memset(sink, 0, FRAG);
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);
    pin(0);
    double cross = 0;
    for (long i = 0; i < HANDOFFS; i++) {
        double t0 = now();
        movsb(page, src + 64, FRAG);
        cross += now() - t0;
        atomic_store(&turn, 2 * i + 1);
        while (atomic_load(&turn) != 2 * i + 2) {}
    }
    pthread_join(t, NULL);
    double local = 0;
    for (long i = 0; i < HANDOFFS; i++) {
        double t0 = now();
        movsb(page, src + 64, FRAG);
        local += now() - t0;
        movsb(sink, page, FRAG);
    }
    printf("2. writing a 32 KiB page that core 1 has just read, from core 0: %.1f GB/s;"
           " one core writing and reading: %.1f GB/s\n",
           (double)FRAG * HANDOFFS / cross / 1e9, (double)FRAG * HANDOFFS / local / 1e9);
    return 0;
}
