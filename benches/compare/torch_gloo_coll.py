"""One torch.distributed collective (float32; SUM where it reduces; root 0
where it has one; gloo backend, CPU tensors) timed per size the way
ringwire-bench and mpi_coll.c do it:

- one checked op first (rank r's element i is (r+1) + (i % 7), so every
  expected value is exact); wrong elements are summed over ranks;
- W warm-up ops; the slowest rank's warm-up time per op caps the timed
  iterations near MAX_SECONDS (between 1 and N), the same count on every rank;
- a barrier, then N timed ops, each timed on every rank; an iteration's time
  is the slowest rank's;
- time = mean of those (p50_us: their median); algbw = bytes / time;
  busbw = algbw * nccl-tests' factor.

Ops (-c): all_reduce (default), broadcast, reduce, all_gather, reduce_scatter,
all_to_all, gather, scatter; buffers as ringwire-bench's. An op this torch's
gloo backend does not have (reduce_scatter, in some versions) prints one line
saying so and exits 3, writing no rows.
Sizes: MIN, MIN*F, ... while below MAX, then MAX (as ringwire-bench).
Launch with torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    torchrun --standalone --nproc-per-node 2 torch_gloo_coll.py -c all_reduce -b 8 -e 256M -f 4 -o out.json

Rank 0 prints a table and, with -o, writes JSON rows with the same field
names as ringwire-bench's --json.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"]


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


def shape(op: str, size: int, p: int):
    """(input, output) element counts and the bytes a row reports."""
    count = size // 4
    per = count // p
    if op in ("all_reduce", "broadcast", "reduce"):
        return count, count, count * 4
    if op in ("all_gather", "gather"):
        return per, per * p, per * p * 4
    return per * p, (per if op in ("reduce_scatter", "scatter") else per * p), per * p * 4


def bus_factor(op: str, p: int) -> float:
    if op == "all_reduce":
        return 2 * (p - 1) / p
    if op in ("broadcast", "reduce"):
        return 1.0
    return (p - 1) / p


def value(r: int, idx: torch.Tensor) -> torch.Tensor:
    return (idx % 7).to(torch.float32) + float(r + 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", default="all_reduce", choices=OPS)
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="32M")
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-w", type=int, default=5)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-m", type=float, default=1.0, help="max seconds of timed ops per size")
    ap.add_argument("-o", default=None, help="JSON output (rank 0)")
    a = ap.parse_args()
    op = a.c

    # One intra-op thread per rank: the ranks share the host's cores.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    lead = rank == 0

    maxcount = parse_size(a.e) // 4
    idx = torch.arange(maxcount, dtype=torch.int64)
    send_full = value(rank, idx)
    recv_full = torch.zeros(maxcount, dtype=torch.float32)
    sum_r = float(p * (p + 1) // 2)

    def run(send, recv, per):
        """One op; its result is in `recv` (a reduce or broadcast works in place on it)."""
        if op == "all_reduce":
            dist.all_reduce(recv, op=dist.ReduceOp.SUM)
        elif op == "broadcast":
            dist.broadcast(recv, src=0)
        elif op == "reduce":
            dist.reduce(recv, dst=0, op=dist.ReduceOp.SUM)
        elif op == "all_gather":
            dist.all_gather(list(recv.split(per)) if per else [recv[:0]] * p, send)
        elif op == "reduce_scatter":
            dist.reduce_scatter(recv, list(send.split(per)) if per else [send[:0]] * p, op=dist.ReduceOp.SUM)
        elif op == "all_to_all":
            dist.all_to_all_single(recv, send)
        elif op == "gather":
            gl = (list(recv.split(per)) if per else [recv[:0]] * p) if lead else None
            dist.gather(send, gl, dst=0)
        elif op == "scatter":
            sl = (list(send.split(per)) if per else [send[:0]] * p) if lead else None
            dist.scatter(recv, sl, src=0)

    def expected(n_in, n_out, per):
        i = torch.arange(n_out, dtype=torch.int64)
        if op in ("all_reduce", "reduce"):
            return (i % 7).to(torch.float32) * p + sum_r
        if op == "broadcast":
            return value(0, i)
        if op in ("all_gather", "gather"):
            return (i % max(n_in, 1) % 7).to(torch.float32) + (i // max(n_in, 1)).to(torch.float32) + 1
        if op == "reduce_scatter":
            return ((rank * n_out + i) % 7).to(torch.float32) * p + sum_r
        if op == "all_to_all":
            return ((rank * per + i % max(per, 1)) % 7).to(torch.float32) + (i // max(per, 1)).to(torch.float32) + 1
        return value(0, rank * n_out + i)  # scatter

    # In-place ops that sum would multiply the values by p each op: they
    # are timed on zeros (no inf/NaN after many ops).
    reduces_in_place = op in ("all_reduce", "reduce")
    checked_here = lead or op not in ("reduce", "gather")

    if lead:
        what = " sum" if op in ("all_reduce", "reduce", "reduce_scatter") else ""
        print(f"# torch_gloo_coll {op}: {p} ranks, float32{what}, torch {torch.__version__}, gloo")
        print(f"# iterations: up to {a.n} timed after {a.w} warm-up (capped near {a.m:g} s per size)")
        print(f"#{'size (B)':>11} {'count':>11} {'iters':>6} {'time (us)':>11} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
              flush=True)
    rows, total_wrong = [], 0
    for size in sizes(parse_size(a.b), parse_size(a.e), a.f):
        n_in, n_out, nbytes = shape(op, size, p)
        per = n_out // p if op in ("all_gather", "gather", "all_to_all") else n_in // p
        send, recv = send_full[:n_in], recv_full[:n_out]

        # Checked op.
        if op in ("all_reduce", "reduce", "broadcast"):
            recv.copy_(send)
        try:
            run(send, recv, per)
        except (RuntimeError, NotImplementedError) as e:
            if lead:
                print(f"# {op}: not supported by this torch's gloo backend ({str(e).splitlines()[0]})", flush=True)
            dist.destroy_process_group()
            raise SystemExit(3)
        wrong = int((recv != expected(n_in, n_out, per)).sum()) if checked_here else 0
        wrong = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
        wrong = int(wrong[0])

        # Warm-up and the agreed iteration count.
        if reduces_in_place:
            recv.zero_()
        t0 = time.perf_counter()
        for _ in range(a.w):
            run(send, recv, per)
        per_op = torch.tensor([(time.perf_counter() - t0) / max(a.w, 1)], dtype=torch.float64)
        dist.all_reduce(per_op, op=dist.ReduceOp.MAX)
        per_op = float(per_op[0])
        n = a.n
        if a.m > 0 and a.w > 0 and per_op > 0:
            n = max(1, min(a.n, int(a.m / per_op)))

        dist.barrier()
        times = torch.zeros(n, dtype=torch.float64)
        for i in range(n):
            t1 = time.perf_counter()
            run(send, recv, per)
            times[i] = time.perf_counter() - t1
        dist.reduce(times, dst=0, op=dist.ReduceOp.MAX)

        if lead:
            mean = float(times.mean())
            srt = sorted(times.tolist())
            p50 = srt[n // 2] if n % 2 else 0.5 * (srt[n // 2 - 1] + srt[n // 2])
            algbw = nbytes / mean / 1e9 if mean > 0 else 0.0
            busbw = algbw * bus_factor(op, p)
            total_wrong += wrong
            count = nbytes // 4
            print(f" {nbytes:>11} {count:>11} {n:>6} {mean * 1e6:>11.1f} {algbw:>8.3f} {busbw:>8.3f} {wrong:>7}",
                  flush=True)
            rows.append(dict(size_bytes=nbytes, count=count, iters=n, time_us=mean * 1e6,
                             algbw_gbps=algbw, busbw_gbps=busbw, p50_us=p50 * 1e6, wrong=wrong))
    if lead:
        print(f"# wrong elements: {total_wrong} ({'FAILED' if total_wrong else 'OK'})")
        if a.o:
            with open(a.o, "w") as f:
                json.dump(dict(library=f"torch {torch.__version__} gloo", op=op, ranks=p, rows=rows), f, indent=1)
    dist.destroy_process_group()
    raise SystemExit(1 if total_wrong else 0)


if __name__ == "__main__":
    main()
