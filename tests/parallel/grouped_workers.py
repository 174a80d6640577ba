"""Runs inside each of 2 Horovod workers (sent by value): the grouped all-reduce after backward
(:mod:`hvdsync.torch.grouped`) against Horovod's per-tensor hooks on the same model, samples and steps.

One pair of workers trains the ResNet-style CNN a few steps along each path (adapter API, ``fit``, fp16 on the wire,
accumulation, a model passed without names) and returns parameters and counts; tests/parallel/test_grouped.py
asserts on them.
"""
import numpy as np


def _mlp():
    import torch.nn as nn

    # 192 -> 1,400 -> 10: the first weight (1.07 MB) is over the 1 MiB first bucket, so the grouped path cuts two
    # buckets: the output layer's gradients and the hidden bias, then that weight alone.
    return nn.Sequential(nn.Flatten(), nn.Linear(192, 1400), nn.ReLU(), nn.Linear(1400, 10))


def _train(sync_fields, x, y, steps, lr, named=True, accumulate=1, mlp=False):
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    from hvdsync.config import SyncConfig
    from hvdsync.core.comm.codecs import WireCounter
    from hvdsync.torch import CNN, broadcast_state, distributed_optimizer

    torch.manual_seed(0)
    model = _mlp() if mlp else CNN(3, 10, width=8, channels_last=True)
    counter = WireCounter()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=lr), model if named else None,
                                SyncConfig(**sync_fields), counter=counter)
    broadcast_state(model, opt)
    start = [p.detach().numpy().copy() for p in model.parameters()]
    counter.reset()
    rank, per = hvd.rank(), len(x) // (2 * steps)
    for s in range(steps):
        opt.zero_grad()
        lo = (2 * s + rank) * per
        for part in np.array_split(np.arange(lo, lo + per), accumulate):
            loss = F.cross_entropy(model(torch.from_numpy(x[part])), torch.from_numpy(y[part]))
            (loss * (len(part) / per)).backward()
        opt.step()
    # hvd.DistributedOptimizer's class takes the local optimizer's name; its pending handles tell it apart.
    return {"kind": "hooks" if hasattr(opt, "_handles") else type(opt).__name__,
            "buckets": [len(b) for b in getattr(opt, "buckets", [])],
            "params": [p.detach().numpy().copy() for p in model.parameters()], "start": start,
            "wire": counter.snapshot(), "numel": sum(p.numel() for p in model.parameters())}


def _fit(grouped_mb, x, y, steps, lr):
    import torch
    import torch.nn.functional as F

    import hvdsync.torch as hs
    from hvdsync.config import Config
    from hvdsync.core.train.data import Dataset

    cfg = Config.from_dict({"sync": {"grouped_mb": grouped_mb}, "tracking": {"enabled": False},
                            "data": {"batch_size": len(x) // (2 * steps), "shuffle": False},
                            "train": {"epochs": 1, "lr": lr, "lr_scaling": "none", "optimizer": "sgd",
                                      "momentum": 0.0}})
    torch.manual_seed(0)
    model = hs.CNN(3, 10, width=8, channels_last=True)
    hs.fit(cfg, data=Dataset(x, y, x[:8], y[:8], 10), model=model, loss=F.cross_entropy)
    return {"params": [p.detach().numpy().copy() for p in model.parameters()]}


def run_checks(steps=4, batch=16, lr=0.1):
    import horovod.torch as hvd

    from hvdsync.config import Config
    from hvdsync.torch import init

    init(Config.from_dict({"tracking": {"enabled": False}}))
    rng = np.random.default_rng(1)
    n = 2 * batch * steps
    x = rng.standard_normal((n, 8, 8, 3), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    hooks = {"grouped_mb": 0.0}
    out = {
        "grouped": _train({}, x, y, steps, lr),
        "hooks": _train(hooks, x, y, steps, lr),
        "grouped_fp16": _train({"compression": "fp16"}, x, y, steps, lr),
        "hooks_fp16": _train({**hooks, "compression": "fp16"}, x, y, steps, lr),
        "grouped_sum": _train({"op": "sum"}, x, y, steps, lr / 2),
        "grouped_acc": _train({"accumulate": 2}, x, y, steps, lr, accumulate=2),
        "hooks_acc": _train({**hooks, "accumulate": 2}, x, y, steps, lr, accumulate=2),
        "grouped_unnamed": _train({}, x, y, steps, lr, named=False),
        "buckets": _train({}, x, y, steps, lr, mlp=True),
        "hooks_mlp": _train(hooks, x, y, steps, lr, mlp=True),
        "buckets_acc": _train({"accumulate": 2}, x, y, steps, lr, accumulate=2, mlp=True),
        "hooks_mlp_acc": _train({**hooks, "accumulate": 2}, x, y, steps, lr, accumulate=2, mlp=True),
        "buckets_fp16": _train({"compression": "fp16"}, x, y, steps, lr, mlp=True),
        "hooks_mlp_fp16": _train({**hooks, "compression": "fp16"}, x, y, steps, lr, mlp=True),
        # 1 kB threshold: the CNN's ~12 kB of gradients are over it, so the hooks are chosen.
        "over_threshold": _train({"grouped_mb": 0.001}, x, y, steps, lr),
        "fit_grouped": _fit(25.0, x, y, steps, lr),
        "fit_hooks": _fit(0.0, x, y, steps, lr),
    }
    out["rank"], out["size"] = hvd.rank(), hvd.size()
    return out
