"""torch.distributed all_reduce (float32, SUM, gloo backend, CPU tensors) timed
per size the way ringwire-bench and mpi_allreduce.c do it:

- one checked op first (rank r holds (r+1) + (i % 7) at element i; the exact
  sum is p(p+1)/2 + p*(i % 7)); wrong elements are summed over ranks;
- W warm-up ops; the slowest rank's warm-up time per op caps the timed
  iterations near MAX_SECONDS (between 1 and N), the same count on every rank;
- a barrier, then N timed ops (in place, like ringwire), each timed on every
  rank; an iteration's time is the slowest rank's;
- time = mean of those (p50_us: their median); algbw = bytes / time;
  busbw = algbw * 2(p-1)/p.

Sizes: MIN, MIN*F, ... while below MAX, then MAX (as ringwire-bench).
Launch with torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    torchrun --standalone --nproc-per-node 2 torch_gloo_allreduce.py -b 8 -e 256M -f 4 -o out.json

Rank 0 prints a table and, with -o, writes JSON rows with the same field
names as ringwire-bench's --json.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def parse_size(s: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mult:
        return int(float(s[:-1]) * mult[s[-1].lower()])
    return int(s)


def sizes(lo: int, hi: int, factor: int):
    out, s = [], lo
    while s < hi:
        out.append(s)
        s *= factor
    out.append(hi)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="32M")
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-w", type=int, default=5)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-m", type=float, default=1.0, help="max seconds of timed ops per size")
    ap.add_argument("-o", default=None, help="JSON output (rank 0)")
    a = ap.parse_args()

    # One intra-op thread per rank: the ranks share the host's cores.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    lead = rank == 0

    maxcount = parse_size(a.e) // 4
    idx = torch.arange(maxcount, dtype=torch.int64) % 7
    pattern = idx.to(torch.float32) + float(rank + 1)
    want_full = idx.to(torch.float32) * float(p) + float(p * (p + 1) // 2)
    del idx
    work = torch.empty(maxcount, dtype=torch.float32)

    if lead:
        print(f"# torch_gloo_allreduce: {p} ranks, float32 sum, torch {torch.__version__}, gloo")
        print(f"# iterations: up to {a.n} timed after {a.w} warm-up (capped near {a.m:g} s per size)")
        print(f"#{'size (B)':>11} {'count':>11} {'iters':>6} {'time (us)':>11} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
              flush=True)
    rows, total_wrong = [], 0
    for size in sizes(parse_size(a.b), parse_size(a.e), a.f):
        count = size // 4
        nbytes = count * 4
        t = work[:count]

        # Checked op.
        t.copy_(pattern[:count])
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        wrong = torch.tensor([int((t != want_full[:count]).sum())], dtype=torch.int64)
        dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
        wrong = int(wrong[0])

        # Warm-up and the agreed iteration count. In-place sums multiply the
        # values by p each op, so time on zeros (no inf/NaN after many ops).
        t.zero_()
        t0 = time.perf_counter()
        for _ in range(a.w):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        per = torch.tensor([(time.perf_counter() - t0) / max(a.w, 1)], dtype=torch.float64)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)
        per = float(per[0])
        n = a.n
        if a.m > 0 and a.w > 0 and per > 0:
            n = max(1, min(a.n, int(a.m / per)))

        dist.barrier()
        times = torch.zeros(n, dtype=torch.float64)
        for i in range(n):
            t1 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            times[i] = time.perf_counter() - t1
        dist.reduce(times, dst=0, op=dist.ReduceOp.MAX)

        if lead:
            mean = float(times.mean())
            srt = sorted(times.tolist())
            p50 = srt[n // 2] if n % 2 else 0.5 * (srt[n // 2 - 1] + srt[n // 2])
            algbw = nbytes / mean / 1e9 if mean > 0 else 0.0
            busbw = algbw * 2 * (p - 1) / p
            total_wrong += wrong
            print(f" {nbytes:>11} {count:>11} {n:>6} {mean * 1e6:>11.1f} {algbw:>8.3f} {busbw:>8.3f} {wrong:>7}",
                  flush=True)
            rows.append(dict(size_bytes=nbytes, count=count, iters=n, time_us=mean * 1e6,
                             algbw_gbps=algbw, busbw_gbps=busbw, p50_us=p50 * 1e6, wrong=wrong))
    if lead:
        print(f"# wrong elements: {total_wrong} ({'FAILED' if total_wrong else 'OK'})")
        if a.o:
            with open(a.o, "w") as f:
                json.dump(dict(library=f"torch {torch.__version__} gloo", ranks=p, rows=rows), f, indent=1)
    dist.destroy_process_group()
    raise SystemExit(1 if total_wrong else 0)


if __name__ == "__main__":
    main()
