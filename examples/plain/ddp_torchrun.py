"""Plain PyTorch DDP, no Horovod and no hvdsync in the training: ``torchrun`` starts the processes, the Gloo process
group joins them, ``DistributedDataParallel`` averages the gradients and ``DistributedSampler`` shards the data.

    torchrun --standalone --nproc-per-node 2 examples/plain/ddp_torchrun.py --epochs 2 --out ddp.npz

(``--backend nccl`` on GPUs.) Only the arrays come from hvdsync, as in ``horovod_torch.py`` beside it: with
``--no-shuffle`` and ``data.shuffle=false`` it computes what ``hvdsync train`` computes, to float32 rounding.
"""
import argparse

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hvdsync.datasets import digits


def main(argv=None) -> list[np.ndarray]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--out", help="rank 0 writes the final parameters here (.npz)")
    args = p.parse_args(argv)

    # 1. torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: the default env:// rendezvous reads them.
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    try:
        data = digits(seed=args.seed)
        train = TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))
        sampler = DistributedSampler(train, num_replicas=size, rank=rank, shuffle=args.shuffle, seed=args.seed)
        loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
        torch.manual_seed(args.seed)
        net = nn.Sequential(nn.Linear(data.n_features, 64), nn.ReLU(), nn.Linear(64, data.n_classes))
        model = DistributedDataParallel(net)       # 2. broadcasts rank 0's parameters; averages the gradients
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        params = [p.detach().numpy().copy() for p in net.parameters()]
        if args.out and rank == 0:
            np.savez(args.out, *params)
        del model                                  # DDP's reducer before its process group
        return params
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
