"""Runs inside each of 2 Horovod workers (sent by value): every sync mode trained on one pair of workers, one
round of each mode against the numpy simulation at W = 2, and every measured pattern checked.

tests/parallel/test_schemes.py asserts on the numbers; sharing the workers keeps the suite fast.
"""
import numpy as np


def _one_round(mode, servers, rank, size, lr=0.5, numel_rows=(5, 3)):
    """One step of ``mode`` on fixed rank-specific parameters and gradients; returns what the collective made."""
    import torch

    from hvdsync.config import SyncConfig
    from hvdsync.torch.schemes import scheme_optimizer

    model = torch.nn.Linear(*numel_rows)                       # 5*3 + 3 = 18 parameters: not a multiple of 4 ranks
    rng = np.random.default_rng(11)
    base = [rng.normal(size=p.shape) for p in model.parameters()]
    grads = [rng.normal(size=p.shape) * (rank + 1) for p in model.parameters()]
    with torch.no_grad():
        for p, b in zip(model.parameters(), base):
            # gossip mixes *different* parameters; the parameter server starts from equal ones
            p.copy_(torch.from_numpy(b + (rank if mode == "gossip" else 0)).float())
    sync = SyncConfig(mode=mode, ps_servers=servers)
    opt = scheme_optimizer(torch.optim.SGD(model.parameters(), lr=lr), model, sync)
    for p, g in zip(model.parameters(), grads):
        p.grad = torch.from_numpy(g).float()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    flat = lambda xs: np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in xs])  # noqa: E731
    return {"after": flat([p.detach().numpy() for p in model.parameters()]), "traffic": opt.traffic,
            "start": flat([b + (rank if mode == "gossip" else 0) for b in base]), "grad": flat(grads)}


def run_checks(epochs=3, batch=32, hidden=32, lr=0.1, seed=5):
    import horovod.torch as hvd

    from hvdsync.config import Config
    from hvdlab.torch.measure import collective_times
    from hvdlab.torch.modes import train_modes

    base = Config.from_dict({"train": {"seed": seed, "epochs": epochs, "hidden": hidden, "lr": lr},
                             "data": {"batch_size": batch}, "tracking": {"enabled": False}})
    modes = {"allreduce": {}, "ps_sharded": {"mode": "ps"}, "ps_single": {"mode": "ps", "ps_servers": 1},
             "ps_fp16": {"mode": "ps", "compression": "fp16"}, "gossip": {"mode": "gossip"},
             "gossip_h4": {"mode": "gossip", "period": 4}}
    runs = train_modes(base.to_dict(), modes)
    rank, size = hvd.rank(), hvd.size()
    out = {"rank": rank, "size": size, "runs": runs, "rounds": {}}
    for mode, servers in (("ps", 0), ("ps", 1), ("gossip", 0)):
        out["rounds"][f"{mode}{servers}"] = _one_round(mode, servers, rank, size)
    out["measured_wrong"] = collective_times([2**18 + 4], repeats=2)["wrong"]   # per pattern, results not the sum
    out["big_pushes_wrong"] = _big_pushes(rank, size)
    return out


def _big_pushes(rank, size, nbytes=64 * 2**20, rounds=8):
    """The sharded push of a 64 MiB buffer, ``rounds`` times: how many results were not the exact sum.

    Horovod 0.28.1's hvd.reducescatter in its place (gloo's halving-doubling, which overwrites a buffer it is
    still sending from) gave rank 0 a wrong sum in 4 of 20 such rounds on this machine, so 8 rounds catch it
    with probability ~0.8 (a correct push gives 0 always); 8 rounds cost ~2-7 s, depending on the machine's load.
    """
    import torch

    from hvdsync.core.comm.schemes.ps import push_splits
    from hvdsync.torch.schemes.ps import push

    x = torch.full((nbytes // 4,), float(rank + 1))
    splits = push_splits(x.numel(), size, 0)
    expected = torch.full((splits[rank],), size * (size + 1) / 2)
    return sum(not torch.equal(push(x, splits, rank, "big_push"), expected) for _ in range(rounds))
