"""Plain Horovod with PyTorch, no hvdsync in the training: the recipe of Horovod's PyTorch guide, with PyTorch's own
``DistributedSampler`` sharding the data. Launch it as any Horovod script:

    horovodrun -np 2 -H localhost:2 --gloo python examples/plain/horovod_torch.py --epochs 2 --out horovod.npz

Only the arrays come from hvdsync (``hvdsync.datasets.digits``: scikit-learn's digits, split as hvdsync splits
them), so that the result can be compared with ``hvdsync train`` on the same samples: with ``--no-shuffle`` on both
sides (``data.shuffle=false``) every global step reads the same samples, and the parameters agree to float32
rounding (``tests/parallel/test_plain_scripts.py``, notebook 12a).
"""
import argparse

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn
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
    p.add_argument("--out", help="rank 0 writes the final parameters here (.npz)")
    args = p.parse_args(argv)

    hvd.init()                                    # 1. one process per worker; rank and size from the launcher
    torch.set_num_threads(1)
    data = digits(seed=args.seed)
    train = TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))
    # 2. each rank its own share of every epoch: rank r reads samples r, r + size, r + 2 size, ...
    sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=args.shuffle,
                                 seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(data.n_features, 64), nn.ReLU(), nn.Linear(64, data.n_classes))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    # 3. the optimizer averages the gradients over the ranks; 4. every rank starts from rank 0's state.
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    params = [p.detach().numpy().copy() for p in model.parameters()]
    if args.out and hvd.rank() == 0:
        np.savez(args.out, *params)
    return params


if __name__ == "__main__":
    main()
