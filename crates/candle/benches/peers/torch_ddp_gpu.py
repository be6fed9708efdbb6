"""Peer measurement for issue 36: the large MLP of `benches/gpu.rs` (1024 -> 4096 -> 4096 -> 10,
ReLU, mean softmax cross-entropy, SGD at lr 0.01, batch 2048 per process) trained with PyTorch on
GPU 0, in one process or as `--processes 2` DistributedDataParallel processes over NCCL sharing
that GPU, as the bench's two worker processes share it.

Not part of the build or CI: the `bench-candle-gpu` suite (`cargo xtask test-gpu`) runs it in
its rounds where python3 imports torch with CUDA, and prints the ratios measured in that run.
Usage:

    python3 crates/candle/benches/peers/torch_ddp_gpu.py [--processes 1|2] [--steps 100]
        [--warmup 5] [--features 1024] [--hidden 4096] [--batch 2048]

Two processes on one GPU: NCCL before 2.30 refuses two ranks of one node on one GPU, so each
process sets a host id of its own (`NCCL_HOSTID`) before the process group starts, as the
bench's workers do; they rendezvous over TCP on 127.0.0.1. Each process slices its batches from
data already on the GPU (as the bench's `plain_resident` way). Times `--steps` steps after
`--warmup` unmeasured ones, from a synchronized GPU to a synchronized one, and prints one JSON
line from rank 0: `{"torch": version, "processes": n, "steps_per_s": ...}`.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

BATCHES = 8
CLASSES = 10


def data(features, batch):
    """`BATCHES * batch` rows and labels, the bench's formula (the values do not matter)."""
    rows = BATCHES * batch
    i = torch.arange(rows * features, dtype=torch.int64)
    x = ((i * 7919 % 1009).to(torch.float32) / 1009.0 - 0.5).reshape(rows, features)
    labels = torch.arange(rows, dtype=torch.int64) * 31 % CLASSES
    return x, labels


def train(rank, world, port, args, out):
    os.environ["NCCL_HOSTID"] = f"torch-ddp-peer-{rank}"
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    model = nn.Sequential(
        nn.Linear(args.features, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, CLASSES),
    ).to(device)
    if world > 1:
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = data(args.features, args.batch)
    x, labels = x.to(device), labels.to(device)
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        b = step % BATCHES
        xs = x[b * args.batch:(b + 1) * args.batch]
        ys = labels[b * args.batch:(b + 1) * args.batch]
        sgd.zero_grad(set_to_none=True)
        F.cross_entropy(model(xs), ys).backward()
        sgd.step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if world > 1:
        dist.destroy_process_group()
    if rank == 0:
        out.put(args.steps / wall)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=1, choices=[1, 2])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2048)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=train, args=(rank, args.processes, port, args, out))
        for rank in range(args.processes)
    ]
    for p in procs:
        p.start()
    steps_per_s = out.get(timeout=600)
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            raise SystemExit(f"a training process exited with {p.exitcode}")
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "processes": args.processes,
                "steps_per_s": steps_per_s,
            }
        )
    )


if __name__ == "__main__":
    main()
