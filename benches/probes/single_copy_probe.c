// Issue 47's measurement before a design: a 2-process f32 sum all-reduce
// done four ways, timed on the same machine in the same run, the order of
// the ways rotated through the sizes and rounds (decision 0043):
//
//  staged  what ringwire's arena does today (decision 0032): 64 KiB chunks;
//          per chunk each rank stages the peer's half in shared memory,
//          adds the peer's staged half into its own, stages its reduced
//          half, and copies the peer's reduced half out. 2N bytes copied,
//          two handshakes per chunk.
//  cma     single copy through process_vm_readv (Open MPI's vader/smsc
//          CMA): each rank publishes its buffer's address; each reads the
//          peer's copy of its own half in 256 KiB pieces into an L2-sized
//          scratch and adds it into its own half; then reads the peer's
//          reduced half straight into its buffer. N bytes through the
//          kernel, three handshakes per op.
//  pool    the buffers live in memory both processes map (a memfd pool
//          `comm.alloc` could hand out): each rank adds the peer's half
//          straight from the mapping, then copies the peer's reduced half
//          out. One pass over N/2 reading both, one copy of N/2; three
//          handshakes per op.
//  staged-big  staged, in 1 MiB chunks (CHUNK_KIB=N to change).
//
// Every op's result is checked. Prints, per size, the median time of each.
//
//   cc -O2 -march=native -o /tmp/single_copy_probe benches/probes/single_copy_probe.c
//   /tmp/single_copy_probe [ROUNDS]        # PIECE_KIB=N: cma's read size (256)
//
// The two ranks are pinned to cores 0 and 1. The VM drifts between a fast
// and a slow phase (everything 3x): only a run's own columns compare.
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static size_t BIG_CHUNK = 1 << 20;
#define SMALL_CHUNK (64 << 10)
static size_t PIECE = 256 << 10;
#define MAXN (64 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}

// Shared between the two processes (mapped before fork).
struct ctl {
    _Alignas(64) _Atomic long step[2];      // each rank's published step
    _Alignas(64) uint64_t addr[2];          // each rank's buffer (cma)
    _Alignas(64) pid_t pid[2];
    _Alignas(64) _Atomic long go;           // the parent's command number
    _Alignas(64) long cmd_kind, cmd_bytes, cmd_iters;
    _Alignas(64) double took[2];
    _Alignas(64) long bad[2];
    _Alignas(64) _Atomic long done[2];
};
static struct ctl *ctl;
static char *stage[2];   // staging areas, one per writer (shared)
static char *pool[2];    // pool buffers, one per rank (shared)

static void publish(int me, long k) { atomic_store_explicit(&ctl->step[me], k, memory_order_release); }
static void await(int peer, long k) {
    while (atomic_load_explicit(&ctl->step[peer], memory_order_acquire) < k) __builtin_ia32_pause();
}

static void add(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

static void fill(float *b, size_t n, int me, long it) {
    for (size_t i = 0; i < n; i++) b[i] = (float)((i + it) % 97) + me * 1000.0f;
}
static long check(const float *b, size_t n, long it) {
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 2.0f * (float)((i + it) % 97) + 1000.0f;
        bad += b[i] != want;
    }
    return bad;
}

static long k; // this process's step counter (both ranks advance in lockstep)

static void staged(int me, float *buf, size_t n, size_t CHUNK) {
    int peer = 1 - me;
    size_t per = CHUNK / 4;
    // Two staging buffers per writer (the arena keeps four): A for the
    // peer's half, B for the reduced half; two handshakes per chunk.
    float *mine_a = (float *)stage[me], *mine_b = (float *)(stage[me] + (16 << 20));
    float *peer_a = (float *)stage[peer], *peer_b = (float *)(stage[peer] + (16 << 20));
    for (size_t at = 0; at < n; at += per) {
        size_t len = n - at < per ? n - at : per;
        size_t h0 = len / 2, mine_off = me ? h0 : 0, mine_len = me ? len - h0 : h0;
        size_t peer_off = me ? 0 : h0, peer_len = me ? h0 : len - h0;
        float *c = buf + at;
        memcpy(mine_a, c + peer_off, peer_len * 4);
        publish(me, ++k);
        await(peer, k);
        add(c + mine_off, peer_a, mine_len);
        memcpy(mine_b, c + mine_off, mine_len * 4);
        publish(me, ++k);
        await(peer, k);
        memcpy(c + peer_off, peer_b, peer_len * 4);
    }
    // The peer has read everything of mine before its next publish.
    publish(me, ++k);
    await(peer, k);
}

static int pull(pid_t pid, uint64_t remote, void *dst, size_t bytes) {
    while (bytes) {
        struct iovec l = {dst, bytes}, r = {(void *)remote, bytes};
        ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got <= 0) return -1;
        dst = (char *)dst + got;
        remote += got;
        bytes -= got;
    }
    return 0;
}

static float scratch[(4 << 20) / 4];

static void cma(int me, float *buf, size_t n) {
    int peer = 1 - me;
    size_t h0 = n / 2, mine_off = me ? h0 : 0, mine_len = me ? n - h0 : h0;
    size_t peer_off = me ? 0 : h0, peer_len = me ? h0 : n - h0;
    ctl->addr[me] = (uint64_t)buf;
    publish(me, ++k);
    await(peer, k);
    uint64_t theirs = ctl->addr[peer];
    for (size_t at = 0; at < mine_len; at += PIECE / 4) {
        size_t len = mine_len - at < PIECE / 4 ? mine_len - at : PIECE / 4;
        if (pull(ctl->pid[peer], theirs + (mine_off + at) * 4, scratch, len * 4)) { perror("process_vm_readv"); exit(1); }
        add(buf + mine_off + at, scratch, len);
    }
    publish(me, ++k); // done reading you; my half is reduced
    await(peer, k);
    if (pull(ctl->pid[peer], theirs + peer_off * 4, buf + peer_off, peer_len * 4)) { perror("process_vm_readv"); exit(1); }
    publish(me, ++k); // done
    await(peer, k);
}

static void pooled(int me, float *buf, size_t n) {
    int peer = 1 - me;
    float *theirs = (float *)pool[peer];
    size_t h0 = n / 2, mine_off = me ? h0 : 0, mine_len = me ? n - h0 : h0;
    size_t peer_off = me ? 0 : h0, peer_len = me ? h0 : n - h0;
    publish(me, ++k);
    await(peer, k);
    add(buf + mine_off, theirs + mine_off, mine_len);
    publish(me, ++k);
    await(peer, k);
    memcpy(buf + peer_off, theirs + peer_off, peer_len * 4);
    publish(me, ++k);
    await(peer, k);
}

static void rank(int me) {
    pin(me);
    ctl->pid[me] = getpid();
    float *own = mmap(0, MAXN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(own, 0, MAXN);
    long seen = 0;
    for (;;) {
        while (atomic_load(&ctl->go) == seen) __builtin_ia32_pause();
        seen = atomic_load(&ctl->go);
        long kind = ctl->cmd_kind, bytes = ctl->cmd_bytes, iters = ctl->cmd_iters;
        if (kind < 0) exit(0);
        size_t n = bytes / 4;
        float *buf = kind == 2 ? (float *)pool[me] : own;
        double times[64];
        long bad = 0;
        for (long it = 0; it < iters; it++) {
            fill(buf, n, me, it);
            publish(me, ++k);
            await(1 - me, k);
            double t = now();
            if (kind == 0) staged(me, buf, n, SMALL_CHUNK);
            else if (kind == 1) cma(me, buf, n);
            else if (kind == 2) pooled(me, buf, n);
            else staged(me, buf, n, BIG_CHUNK);
            times[it] = now() - t;
            bad += check(buf, n, it);
        }
        // median
        for (long i = 1; i < iters; i++)
            for (long j = i; j > 0 && times[j] < times[j - 1]; j--) {
                double x = times[j]; times[j] = times[j - 1]; times[j - 1] = x;
            }
        ctl->took[me] = times[iters / 2];
        ctl->bad[me] = bad;
        atomic_store(&ctl->done[me], seen);
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    if (getenv("PIECE_KIB")) PIECE = (size_t)atoi(getenv("PIECE_KIB")) << 10;
    if (getenv("CHUNK_KIB")) BIG_CHUNK = (size_t)atoi(getenv("CHUNK_KIB")) << 10;
    if (PIECE > (4 << 20)) PIECE = 4 << 20;
    ctl = mmap(0, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    for (int r = 0; r < 2; r++) {
        stage[r] = mmap(0, 2 * (16 << 20), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        pool[r] = mmap(0, MAXN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        memset(pool[r], 0, MAXN);
    }
    pid_t kids[2];
    for (int r = 0; r < 2; r++)
        if ((kids[r] = fork()) == 0) rank(r);
    const char *names[4] = {"staged", "cma", "pool", "staged-big"};
    long sizes[] = {256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20};
    int ns = sizeof sizes / sizeof *sizes;
    double res[7][4][16];
    long cmd = 0, bad = 0;
    for (int round = 0; round < rounds; round++)
        for (int s = 0; s < ns; s++)
            for (int j = 0; j < 4; j++) {
                int kind = (j + round + s) % 4; // rotated
                ctl->cmd_kind = kind;
                ctl->cmd_bytes = sizes[s];
                ctl->cmd_iters = sizes[s] >= (16 << 20) ? 9 : 31;
                atomic_store(&ctl->go, ++cmd);
                while (atomic_load(&ctl->done[0]) != cmd || atomic_load(&ctl->done[1]) != cmd) usleep(200);
                double t = ctl->took[0] > ctl->took[1] ? ctl->took[0] : ctl->took[1];
                res[s][kind][round] = t;
                bad += ctl->bad[0] + ctl->bad[1];
            }
    ctl->cmd_kind = -1;
    atomic_store(&ctl->go, ++cmd);
    for (int r = 0; r < 2; r++) waitpid(kids[r], 0, 0);
    printf("2-process f32 sum all-reduce, slower rank's median per round; median over %d rounds (µs)\n", rounds);
    printf("%10s %10s %10s %10s %10s %11s %12s %11s\n", "size", names[0], names[1], names[2], names[3], "staged/cma", "staged/pool", "staged/big");
    for (int s = 0; s < ns; s++) {
        double m[4];
        for (int kind = 0; kind < 4; kind++) {
            double v[16];
            memcpy(v, res[s][kind], sizeof(double) * rounds);
            for (int i = 1; i < rounds; i++)
                for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double x = v[j]; v[j] = v[j - 1]; v[j - 1] = x; }
            m[kind] = v[rounds / 2] * 1e6;
        }
        printf("%9ldK %10.1f %10.1f %10.1f %10.1f %10.2fx %11.2fx %10.2fx\n", sizes[s] >> 10, m[0], m[1], m[2], m[3], m[0] / m[1], m[0] / m[2], m[0] / m[3]);
    }
    printf("wrong elements: %ld\n", bad);
    return bad != 0;
}
