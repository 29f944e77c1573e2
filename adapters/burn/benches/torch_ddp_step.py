"""The peer of examples/step_time.rs: the same MLPs, batch and SGD step in
torch's DistributedDataParallel over gloo, one thread per rank (torchrun's
default OMP_NUM_THREADS=1). Prints the slowest rank's median step time in
the same line format.

    torchrun --nproc-per-node 2 torch_ddp_step.py --model digits --steps 200
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

DIMS = {"digits": [64, 128, 10], "wide": [1024, 4096, 4096, 1024]}
GLOBAL_BATCH = 64
WARMUP = 3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="digits", choices=DIMS)
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = DIMS[a.model]
    layers = []
    for i, (n_in, n_out) in enumerate(zip(dims, dims[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers))
    params = sum(p.numel() for p in model.parameters())
    per_rank = GLOBAL_BATCH // world
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(per_rank, dims[0], generator=g)
    y = torch.arange(per_rank) % dims[-1]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for step in range(WARMUP + a.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    times.sort()
    worst = torch.tensor([times[len(times) // 2] * 1e6])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(
            f"torch step_time: model {a.model} ({params} parameters), {world} ranks, "
            f"batch {per_rank} per rank, {a.steps} steps: step p50 {worst.item() / 1e3:.3f} ms"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
