"""PyTorch DDP with its own communication hooks, on the same model, data and link as the hvdsync runs of
``benchmarks/link.py``: the peer an hvdsync codec is held to (step time ratio <= 1.0).

One process per test host joins a ``torch.distributed`` Gloo group over the limited link (``GLOO_SOCKET_IFNAME``)
and trains the wide MLP with :class:`torch.nn.parallel.DistributedDataParallel` under one of :data:`HOOKS`:
``ddp`` (DDP's own fp32 all-reduce), ``ddp-fp16`` (``default_hooks.fp16_compress_hook``) or ``ddp-powersgd:<rank>``
(``powerSGD_hook``, error feedback on, compressing from the second step, as hvdsync's PowerSGD does). Each rank
reads every ``size``-th training sample, ``batch`` at a time, as hvdsync's sampler does; the step time is the
slowest rank's mean over the epochs after the first.
"""
from __future__ import annotations

import statistics
import time

HOOKS = ("ddp", "ddp-fp16", "ddp-powersgd:2", "ddp-powersgd:4")


def _sent(interface: str) -> int:
    # `ip netns exec` mounts the namespace's own sysfs: these are this test host's counters.
    try:
        with open(f"/sys/class/net/{interface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return 0


def _hook(model, name: str):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "ddp":
        return
    if name == "ddp-fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return
    if name.startswith("ddp-powersgd:"):
        rank = int(name.split(":", 1)[1])
        # start_powerSGD_iter=2: compress from the second step (DDP's default waits 1,000 steps, longer than this
        # run); min_compression_rate=1 compresses every matrix, as hvdsync's PowerSGD does.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=2, min_compression_rate=1, use_error_feedback=True,
                                            warm_start=True)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return
    raise ValueError(f"hook: {name!r} is not allowed; choose one of: {', '.join(HOOKS)} (any PowerSGD rank)")


def fit(rank: int, size: int, master: str, port: int, hooks: list[str], data: dict, train: dict,
        threads: int, interface: str = "hv0") -> list[dict]:
    """Train once per hook in ``hooks`` from the same start; returns per hook its step time (s, slowest rank),
    steps, test accuracy (rank 0's; identical on every rank) and the bytes this host sent on ``interface``."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from hvdsync.core.train.data import synthetic

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=size)
    ds = synthetic(data["synthetic_samples"], data["synthetic_features"], seed=0,
                   spread=data.get("synthetic_spread", 1.5))
    x, y = torch.from_numpy(ds.x_train[rank::size]), torch.from_numpy(ds.y_train[rank::size])
    batch, out = data["batch_size"], []
    try:
        for name in hooks:
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(ds.n_features, train["hidden"]), nn.ReLU(),
                                nn.Linear(train["hidden"], ds.n_classes))
            model = nn.parallel.DistributedDataParallel(net)   # broadcasts rank 0's parameters
            _hook(model, name)
            opt = torch.optim.SGD(model.parameters(), lr=train["lr"])
            epochs, steps, sent = [], 0, _sent(interface)
            for _ in range(train["epochs"]):
                times = []
                for at in range(0, len(y) - batch + 1, batch):
                    t0 = time.perf_counter()
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x[at:at + batch]), y[at:at + batch]).backward()
                    opt.step()
                    times.append(time.perf_counter() - t0)
                    steps += 1
                epochs.append(statistics.fmean(times))
            step = torch.tensor([statistics.fmean(epochs[1:] or epochs)])
            dist.all_reduce(step, op=dist.ReduceOp.MAX)
            with torch.no_grad():
                correct = (net(torch.from_numpy(ds.x_test)).argmax(1) == torch.from_numpy(ds.y_test)).float().mean()
            out.append({"compression": name, "step_s": float(step), "steps": steps, "accuracy": float(correct),
                        "link_bytes": _sent(interface) - sent,
                        "numel": sum(p.numel() for p in net.parameters())})
    finally:
        dist.destroy_process_group()
    return out
