/*
 * One MPI collective (float; MPI_SUM where it reduces; root 0 where it has
 * one) timed per size the way ringwire-bench and nccl-tests do it:
 *   - one checked op first (rank r's element i is (r+1) + (i % 7), so every
 *     expected value is exact); wrong elements are summed over ranks;
 *   - W warm-up ops; the slowest rank's warm-up time per op caps the timed
 *     iterations near MAX_SECONDS (between 1 and N), the same count on every rank;
 *   - a barrier, then N timed ops, each timed on every rank (out of place,
 *     like nccl-tests' default); an iteration's time is the slowest rank's;
 *   - time = mean of those (p50_us, p99_us, max_us: their median, 99th percentile
 *     and maximum); algbw = bytes / time; busbw = algbw * nccl-tests' factor
 *     (all_reduce 2(p-1)/p; all_gather, reduce_scatter, all_to_all, gather,
 *     scatter (p-1)/p; broadcast, reduce 1).
 * Ops (-c): all_reduce (default), broadcast, reduce, all_gather, reduce_scatter,
 * all_to_all, gather, scatter. Buffers as ringwire-bench's: the size row is the
 * largest buffer, rounded down to whole blocks where the op splits it.
 * Sizes: MIN, MIN*F, MIN*F^2, ... while below MAX, then MAX (as ringwire-bench).
 * Rank 0 prints a table and, with -o FILE, writes JSON rows with the same
 * field names as ringwire-bench's --json.
 *
 * Build: mpicc -O2 -o mpi_coll mpi_coll.c
 * Run:   mpirun -np 2 --mca btl tcp,self --mca pml ob1 ./mpi_coll -c all_reduce -b 8 -e 256M -f 4
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1024.0 * 1024.0; break;
    case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; break;
    default: break;
    }
    return (size_t)v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum op { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER };
static const char *const OP_NAMES[] = {"all_reduce",     "broadcast",  "reduce", "all_gather",
                                       "reduce_scatter", "all_to_all", "gather", "scatter"};

static void usage(void) {
    fprintf(stderr, "usage: mpi_coll [-c OP] [-b MIN] [-e MAX] [-f FACTOR] [-w WARMUP] [-n ITERS] "
                    "[-m MAX_SECONDS] [-o OUT.json]\n"
                    "  OP: all_reduce broadcast reduce all_gather reduce_scatter all_to_all gather scatter\n");
}

/* Rank r's input element i. */
static float value(int r, size_t i) { return (float)(r + 1) + (float)(i % 7); }

/* Element counts for a nominal size, as ringwire-bench's `shape`. */
static void shape(enum op op, size_t size, int p, size_t *in, size_t *out, size_t *bytes) {
    size_t count = size / sizeof(float), per = count / (size_t)p, whole = per * (size_t)p;
    switch (op) {
    case ALL_REDUCE: case BROADCAST: case REDUCE: *in = count; *out = count; *bytes = count * 4; break;
    case ALL_GATHER: case GATHER: *in = per; *out = whole; *bytes = whole * 4; break;
    case REDUCE_SCATTER: case SCATTER: *in = whole; *out = per; *bytes = whole * 4; break;
    case ALL_TO_ALL: *in = whole; *out = whole; *bytes = whole * 4; break;
    }
}

static double bus_factor(enum op op, int p) {
    switch (op) {
    case ALL_REDUCE: return 2.0 * (p - 1) / p;
    case BROADCAST: case REDUCE: return 1.0;
    default: return (double)(p - 1) / p;
    }
}

/* One op: `send` holds this rank's input, `recv` gets the result (broadcast
   works in place on `recv`, which the caller fills). */
static void run(enum op op, float *send, float *recv, size_t in, size_t out, int p) {
    int n = (int)in, per = (int)(out / (size_t)(p > 0 ? p : 1));
    switch (op) {
    case ALL_REDUCE: MPI_Allreduce(send, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case BROADCAST: MPI_Bcast(recv, n, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    case REDUCE: MPI_Reduce(send, recv, n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
    case ALL_GATHER: MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, MPI_COMM_WORLD); break;
    case REDUCE_SCATTER:
        MPI_Reduce_scatter_block(send, recv, (int)out, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_TO_ALL: MPI_Alltoall(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD); break;
    case GATHER: MPI_Gather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    case SCATTER: MPI_Scatter(send, (int)out, MPI_FLOAT, recv, (int)out, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    }
}

/* Wrong elements of this rank's result of the checked op. */
static long long check(enum op op, const float *recv, size_t in, size_t out, int rank, int p) {
    long long wrong = 0;
    float sum_r = (float)(p * (p + 1) / 2);
    size_t per = out / (size_t)(p > 0 ? p : 1);
    switch (op) {
    case ALL_REDUCE:
        for (size_t i = 0; i < in; i++) wrong += recv[i] != sum_r + (float)p * (float)(i % 7);
        break;
    case REDUCE:
        if (rank == 0)
            for (size_t i = 0; i < in; i++) wrong += recv[i] != sum_r + (float)p * (float)(i % 7);
        break;
    case BROADCAST:
        for (size_t i = 0; i < in; i++) wrong += recv[i] != value(0, i);
        break;
    case GATHER:
        if (rank != 0) break;
        /* fall through */
    case ALL_GATHER:
        for (size_t i = 0; i < out; i++) wrong += recv[i] != value((int)(i / in), i % in);
        break;
    case REDUCE_SCATTER:
        for (size_t i = 0; i < out; i++) {
            size_t g = (size_t)rank * out + i;
            wrong += recv[i] != sum_r + (float)p * (float)(g % 7);
        }
        break;
    case ALL_TO_ALL: /* block j came from rank j's block `rank` */
        for (size_t i = 0; i < out; i++)
            wrong += recv[i] != value((int)(i / per), (size_t)rank * per + i % per);
        break;
    case SCATTER:
        for (size_t i = 0; i < out; i++) wrong += recv[i] != value(0, (size_t)rank * out + i);
        break;
    }
    return wrong;
}

int main(int argc, char **argv) {
    size_t minb = 8, maxb = 32u << 20, factor = 2;
    int warmup = 5, iters = 20;
    double max_seconds = 1.0;
    const char *out = NULL;
    enum op op = ALL_REDUCE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "-b")) minb = parse_size(v);
        else if (!strcmp(a, "-e")) maxb = parse_size(v);
        else if (!strcmp(a, "-f")) factor = (size_t)atol(v);
        else if (!strcmp(a, "-w")) warmup = atoi(v);
        else if (!strcmp(a, "-n")) iters = atoi(v);
        else if (!strcmp(a, "-m")) max_seconds = atof(v);
        else if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "-c")) {
            int found = 0;
            for (int k = 0; k < (int)(sizeof OP_NAMES / sizeof *OP_NAMES); k++)
                if (!strcmp(v, OP_NAMES[k])) { op = (enum op)k; found = 1; }
            if (!found) { usage(); return 2; }
        } else { usage(); return 2; }
        i++;
    }
    if (factor < 2 || minb < 4 || maxb < minb || iters < 1 || warmup < 0) { usage(); return 2; }

    MPI_Init(&argc, &argv);
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);

    size_t maxcount = maxb / sizeof(float);
    float *send = malloc(maxcount * sizeof(float) + 1);
    float *recv = malloc(maxcount * sizeof(float) + 1);
    double *times = malloc((size_t)iters * sizeof(double));
    double *slowest = malloc((size_t)iters * sizeof(double));
    if (!send || !recv || !times || !slowest) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < maxcount; i++) {
        send[i] = value(rank, i);
        recv[i] = 0.0f;
    }

    FILE *json = NULL;
    if (rank == 0) {
        int vlen;
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        MPI_Get_library_version(lib, &vlen);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = '\0';
        char *comma = strchr(lib, ',');
        if (comma) *comma = '\0';
        printf("# mpi_coll %s: %d ranks, float%s, %s\n", OP_NAMES[op], p,
               op == ALL_REDUCE || op == REDUCE || op == REDUCE_SCATTER ? " sum" : "", lib);
        printf("# iterations: up to %d timed after %d warm-up (capped near %g s per size)\n",
               iters, warmup, max_seconds);
        printf("#%11s %11s %6s %11s %8s %8s %7s\n", "size (B)", "count", "iters", "time (us)",
               "algbw", "busbw", "#wrong");
        if (out) {
            json = fopen(out, "w");
            if (!json) { perror(out); MPI_Abort(MPI_COMM_WORLD, 1); }
            fprintf(json, "{\"library\": \"%s\", \"op\": \"%s\", \"ranks\": %d, \"rows\": [", lib,
                    OP_NAMES[op], p);
        }
    }

    long long total_wrong = 0;
    int first = 1;
    size_t s = minb;
    for (;;) {
        size_t size = s < maxb ? s : maxb;
        size_t in = 0, outn = 0, bytes = 0;
        shape(op, size, p, &in, &outn, &bytes);

        /* Checked op (a broadcast's buffer starts as this rank's input). */
        if (op == BROADCAST)
            for (size_t i = 0; i < in; i++) recv[i] = value(rank, i);
        run(op, send, recv, in, outn, p);
        long long wrong = check(op, recv, in, outn, rank, p);
        long long wrong_all = 0;
        MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

        /* Warm-up, and the iteration count every rank agrees on. */
        double t0 = MPI_Wtime();
        for (int i = 0; i < warmup; i++) run(op, send, recv, in, outn, p);
        double per = (MPI_Wtime() - t0) / (warmup > 0 ? warmup : 1), per_max = 0.0;
        MPI_Allreduce(&per, &per_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        int n = iters;
        if (max_seconds > 0 && warmup > 0 && per_max > 0) {
            double c = max_seconds / per_max;
            n = c < 1 ? 1 : (c > iters ? iters : (int)c);
        }

        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < n; i++) {
            double t = MPI_Wtime();
            run(op, send, recv, in, outn, p);
            times[i] = MPI_Wtime() - t;
        }
        MPI_Reduce(times, slowest, n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

        if (rank == 0) {
            double mean = 0;
            for (int i = 0; i < n; i++) mean += slowest[i];
            mean /= n;
            qsort(slowest, (size_t)n, sizeof(double), cmp_double);
            double p50 = n % 2 ? slowest[n / 2] : 0.5 * (slowest[n / 2 - 1] + slowest[n / 2]);
            int at99 = (int)((n * 99 + 99) / 100) - 1; /* nearest rank */
            double p99 = slowest[at99 < 0 ? 0 : at99 >= n ? n - 1 : at99];
            double max = slowest[n - 1];
            double algbw = mean > 0 ? (double)bytes / mean / 1e9 : 0;
            double busbw = algbw * bus_factor(op, p);
            size_t count = bytes / sizeof(float);
            total_wrong += wrong_all;
            printf(" %11zu %11zu %6d %11.1f %8.3f %8.3f %7lld\n", bytes, count, n, mean * 1e6, algbw,
                   busbw, wrong_all);
            fflush(stdout);
            if (json) {
                fprintf(json,
                        "%s\n  {\"size_bytes\": %zu, \"count\": %zu, \"iters\": %d, \"time_us\": %.3f, "
                        "\"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f, \"p50_us\": %.3f, \"p99_us\": %.3f, "
                        "\"max_us\": %.3f, \"wrong\": %lld}",
                        first ? "" : ",", bytes, count, n, mean * 1e6, algbw, busbw, p50 * 1e6, p99 * 1e6,
                        max * 1e6, wrong_all);
            }
        }
        first = 0;
        if (size >= maxb) break;
        s = s * factor;
    }

    if (rank == 0) {
        printf("# wrong elements: %lld (%s)\n", total_wrong, total_wrong ? "FAILED" : "OK");
        if (json) {
            fprintf(json, "\n]}\n");
            fclose(json);
        }
    }
    free(send);
    free(recv);
    free(times);
    free(slowest);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
