"""Jobs the multi-host tests run, and the driver that launches them on a test host.

The driver runs *on* a test host (node1), as a user's launch script would on a cluster's login node: the job's
driver must be reachable from every host. ``python -m tests.hosts.jobs_workers '<spec JSON>'`` launches the workers
with :func:`hvdsync.launch.run` (or :func:`hvdsync.launch.train`) and prints one line ``RESULT <JSON>``.
"""
import json
import os
import sys


def user_fit(n=301, batch=16, epochs=3, seed=5):
    """The user's own MLP and Dataset through hvdsync.torch (PlanSampler + DataLoader, fit); returns this rank's
    host, the reads of each sample, its final parameters and the result."""
    import horovod.torch as hvd
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    import hvdsync.torch as hs
    from hvdsync.config import Config
    from hvdsync.core.train.data import digits

    class Recorded(Dataset):
        """Digits, counting every read (num_workers=0: the reads happen in this process)."""

        def __init__(self, x, y):
            self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
            self.reads = [0] * len(y)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            self.reads[i] += 1
            return self.x[i], self.y[i]

    cfg = Config.from_dict({"data": {"batch_size": batch}, "train": {"seed": seed, "epochs": epochs, "lr": 0.05,
                                                                     "momentum": 0.9}, "tracking": {"enabled": False}})
    hs.init(cfg)
    split = digits(seed=seed)
    train = Recorded(split.x_train[:n], split.y_train[:n])
    loader = DataLoader(train, batch_sampler=hs.PlanSampler.from_config(cfg, train), num_workers=0)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    result = hs.fit(cfg, model=model, loss=nn.CrossEntropyLoss(), train=loader,
                    test=torch.utils.data.TensorDataset(torch.from_numpy(split.x_test), torch.from_numpy(split.y_test)),
                    optimizer=torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum))
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).double().tolist()
    return {"host": os.environ.get("HOROVOD_HOSTNAME"), "rank": hvd.rank(), "local_rank": hvd.local_rank(),
            "size": hvd.size(), "reads": train.reads, "params": params, "test_accuracy": result.test_accuracy,
            "param_spread": result.param_spread}


def ring_traffic(megabytes=8, rounds=4, interface="hv0"):
    """All-reduce a float32 buffer of ``megabytes`` ``rounds`` times; the first local rank of each host reads its
    host's link counters around them (after a warm-up that opens Gloo's connections, between barriers)."""
    import horovod.torch as hvd
    import torch

    from hvdlab.testhosts import own_link_bytes

    hvd.init()
    x = torch.ones(megabytes * 1_000_000 // 4)

    hvd.allreduce(x, name="warm-up")
    hvd.barrier()
    before = own_link_bytes(interface)
    for i in range(rounds):
        out = hvd.allreduce(x, name=f"round{i}", op=hvd.Sum)
    hvd.barrier()
    after = own_link_bytes(interface)
    return {"host": os.environ.get("HOROVOD_HOSTNAME"), "rank": hvd.rank(), "local_rank": hvd.local_rank(),
            "size": hvd.size(), "sum_ok": bool((out == hvd.size()).all()), "buffer_bytes": x.numel() * 4,
            "rounds": rounds, **{k: after[k] - before[k] for k in before}}


def main(spec: dict) -> dict:
    import time

    from hvdsync import launch
    from hvdsync.config import Config

    where = {k: spec[k] for k in ("hosts", "ssh_identity_file", "network_interfaces", "ssh_port") if k in spec}
    start = time.monotonic()
    if spec["job"] == "train":
        result = launch.train(Config.from_dict(spec["config"]), progress=False, **where).to_dict()
    else:
        from hvdlab.bench import hierarchical

        fn = {"user_fit": user_fit, "ring_traffic": ring_traffic, "hierarchical": hierarchical.traffic}[spec["job"]]
        result = launch.run(fn, kwargs=spec.get("kwargs", {}), np=spec["np"], progress=False, **where)
    return {"result": result, "seconds": time.monotonic() - start}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
