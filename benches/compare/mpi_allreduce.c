/*
 * MPI_Allreduce (float, MPI_SUM) timed per size the way ringwire-bench and
 * nccl-tests do it:
 *   - one checked op first (rank r sends (r+1) + (i % 7) at element i, so the
 *     exact sum is p(p+1)/2 + p*(i % 7)); wrong elements are summed over ranks;
 *   - W warm-up ops; the slowest rank's warm-up time per op caps the timed
 *     iterations near MAX_SECONDS (between 1 and N), the same count on every rank;
 *   - a barrier, then N timed ops, each timed on every rank (out of place,
 *     like nccl-tests' default); an iteration's time is the slowest rank's;
 *   - time = mean of those (p50_us, p99_us, max_us: their median, 99th percentile
 *     and maximum); algbw = bytes / time;
 *     busbw = algbw * 2(p-1)/p.
 * Sizes: MIN, MIN*F, MIN*F^2, ... while below MAX, then MAX (as ringwire-bench).
 * Rank 0 prints a table and, with -o FILE, writes JSON rows with the same
 * field names as ringwire-bench's --json.
 *
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 * Run:   mpirun -np 2 --mca btl tcp,self --mca pml ob1 ./mpi_allreduce -b 8 -e 256M -f 4
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

static void usage(void) {
    fprintf(stderr, "usage: mpi_allreduce [-b MIN] [-e MAX] [-f FACTOR] [-w WARMUP] [-n ITERS] "
                    "[-m MAX_SECONDS] [-o OUT.json]\n");
}

int main(int argc, char **argv) {
    size_t minb = 8, maxb = 32u << 20, factor = 2;
    int warmup = 5, iters = 20;
    double max_seconds = 1.0;
    const char *out = NULL;
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
        else { usage(); return 2; }
        i++;
    }
    if (factor < 2 || minb < 4 || maxb < minb || iters < 1 || warmup < 0) { usage(); return 2; }

    MPI_Init(&argc, &argv);
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);

    size_t maxcount = maxb / sizeof(float);
    float *send = malloc(maxcount * sizeof(float));
    float *recv = malloc(maxcount * sizeof(float));
    double *times = malloc((size_t)iters * sizeof(double));
    double *slowest = malloc((size_t)iters * sizeof(double));
    if (!send || !recv || !times || !slowest) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < maxcount; i++) {
        send[i] = (float)(rank + 1) + (float)(i % 7);
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
        printf("# mpi_allreduce: %d ranks, float sum, %s\n", p, lib);
        printf("# iterations: up to %d timed after %d warm-up (capped near %g s per size)\n",
               iters, warmup, max_seconds);
        printf("#%11s %11s %6s %11s %8s %8s %7s\n", "size (B)", "count", "iters", "time (us)",
               "algbw", "busbw", "#wrong");
        if (out) {
            json = fopen(out, "w");
            if (!json) { perror(out); MPI_Abort(MPI_COMM_WORLD, 1); }
            fprintf(json, "{\"library\": \"%s\", \"ranks\": %d, \"rows\": [", lib, p);
        }
    }

    long long total_wrong = 0;
    int first = 1;
    size_t s = minb;
    for (;;) {
        size_t size = s < maxb ? s : maxb;
        int count = (int)(size / sizeof(float));
        size_t bytes = (size_t)count * sizeof(float);

        /* Checked op. */
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long long wrong = 0;
        for (int i = 0; i < count; i++) {
            float want = (float)(p * (p + 1) / 2) + (float)p * (float)(i % 7);
            if (recv[i] != want) wrong++;
        }
        long long wrong_all = 0;
        MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

        /* Warm-up, and the iteration count every rank agrees on. */
        double t0 = MPI_Wtime();
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
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
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
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
            double busbw = algbw * 2.0 * (p - 1) / p;
            total_wrong += wrong_all;
            printf(" %11zu %11d %6d %11.1f %8.3f %8.3f %7lld\n", bytes, count, n, mean * 1e6, algbw,
                   busbw, wrong_all);
            fflush(stdout);
            if (json) {
                fprintf(json,
                        "%s\n  {\"size_bytes\": %zu, \"count\": %d, \"iters\": %d, \"time_us\": %.3f, "
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
