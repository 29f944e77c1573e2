"""torch.distributed's NCCL all-reduce timed like ringwire-bench times
--device cuda (each op from submission until the host sees it finished),
for a same-machine baseline:

    python gpu/scripts/torch_allreduce.py [min_bytes] [max_bytes] [iters]

One rank per process under torchrun (or one process alone); f32 sum;
prints size, time_us (median), algbw GB/s.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    lo = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    hi = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 28
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    if rank == 0:
        print(f"# torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {world} rank(s), {torch.cuda.get_device_name()}")
        print(f"{'bytes':>12} {'time_us':>10} {'algbw':>8}")
    size = lo
    while size <= hi:
        x = torch.ones(max(size // 4, 1), device="cuda")
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        times.sort()
        t = times[len(times) // 2]
        if rank == 0:
            print(f"{size:>12} {t * 1e6:>10.1f} {size / t / 1e9:>8.2f}")
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
