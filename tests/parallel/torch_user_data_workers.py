"""Runs inside each of 2 Horovod workers (sent by value): the user's own model, loss and Dataset through
hvdsync.torch (PlanSampler + DataLoader, fit), and the bad inputs that must fail before training.

Returns numbers; tests/parallel/test_torch_user_data.py asserts on them.
"""
import numpy as np


def _example():
    """The user code of examples/train_torch_cnn.py (its Dataset and CNN), loaded from the file: the checks train
    what the example trains."""
    import pathlib
    import runpy

    import hvdsync

    path = pathlib.Path(hvdsync.__file__).resolve().parents[1] / "examples" / "train_torch_cnn.py"
    return runpy.run_path(str(path), run_name="example")


def _datasets():
    DigitImages = _example()["DigitImages"]

    class Indexed(DigitImages):
        """The example's Dataset, also returning each sample's index, so the test can count reads."""

        def __getitem__(self, i):
            return (*super().__getitem__(i), i)

    return Indexed, DigitImages


def _user_cnn(n_classes=10, width=16):
    return _example()["SmallCNN"](n_classes, width)


def run_checks(seed=5, batch=16, accumulate=2, epochs=4):
    import horovod.torch as hvd
    import torch
    from torch.utils.data import DataLoader

    import hvdsync.torch as ht
    from hvdlab.torch import reference
    from hvdsync.config import Config
    from hvdsync.core.train.data import digits

    cfg = Config.from_dict({"data": {"batch_size": batch}, "sync": {"accumulate": accumulate},
                            "train": {"seed": seed, "epochs": epochs, "lr": 0.05, "momentum": 0.9},
                            "tracking": {"enabled": False}})
    info = ht.init(cfg)
    rank, size = info.rank, info.size
    data = digits(seed=seed, images=True)
    Images, Pairs = _datasets()
    out = {"size": size}

    # 1. Every sample exactly once per epoch on 2 ranks, read by DataLoader worker processes; micro-batches in order.
    n = 301                                           # 301 = 9 global steps of 32 + a short one of 13
    ds = Images(data.x_train[:n], data.y_train[:n])
    sampler = ht.PlanSampler(ds, batch_size=batch, accumulate=accumulate, seed=seed)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2)
    reads, out_of_order, steps, scales = [], 0, 0, []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        planned = sampler.plan.epoch(epoch, rank)
        for (micro, step), plan_step in zip(sampler.steps(loader), planned, strict=True):
            got = [m[2].tolist() for m in micro]
            out_of_order += got != [m.tolist() for m in plan_step.micro if len(m)]   # steps not in plan order
            reads.append([epoch * 1000 + i for m in got for i in m])
            steps += 1
            scales.append(sampler.scale(step))
    flat = [i for r in reads for i in r]
    every = hvd.allgather(torch.tensor(flat, dtype=torch.int64)).tolist()
    out["reads_per_epoch"] = [np.bincount([i - 1000 * e for i in every if i // 1000 == e], minlength=n).tolist()
                              for e in (0, 1)]
    out["steps_out_of_plan_order_each_rank"] = hvd.allgather(torch.tensor([out_of_order])).tolist()
    out["steps_per_epoch_each_rank"] = hvd.allgather(torch.tensor([steps // 2])).tolist()
    out["last_step_scale"] = scales[-1]

    # 2. 2 workers x 16 (accumulate 2 micro-batches of 8) through the DataLoader == 1 process x 32, plain SGD.
    pairs = Pairs(data.x_train[:n], data.y_train[:n])
    torch.manual_seed(seed)
    model = _user_cnn()
    start = [p.detach().clone() for p in model.parameters()]
    backend = ht.TorchBackend(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg.sync)
    s2 = ht.PlanSampler.from_config(cfg, pairs)
    for micro, step in s2.steps(DataLoader(pairs, batch_sampler=s2, num_workers=2)):
        backend.train_step(micro, s2.scale(step))
    dist = backend.parameters()
    ref_model = _user_cnn()
    with torch.no_grad():
        for p, v in zip(ref_model.parameters(), start):
            p.copy_(v)
    x_chw = np.ascontiguousarray(data.x_train[:n].transpose(0, 3, 1, 2))
    ref = reference.sequential_sgd(ref_model, x_chw, data.y_train[:n], reference.global_batches(s2.plan), lr=0.1)
    out["big_batch_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(dist, ref))
    out["big_batch_moved"] = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(ref, start))
    out["rounds_for_steps"] = (backend.wire.snapshot()["tensors"] / backend.grad_tensors, s2.plan.steps_per_epoch())

    # 3. state_dict mid-epoch -> a fresh sampler continues with exactly the unread samples (same world, and resized).
    s3 = ht.PlanSampler(ds, batch_size=batch, accumulate=accumulate, seed=seed)
    s3.set_epoch(3)
    before = []
    for i, (micro, _) in enumerate(s3.steps(DataLoader(ds, batch_sampler=s3, num_workers=2))):
        before += [j for m in micro for j in m[2].tolist()]
        if i == 3:
            break
    state = s3.state_dict()
    fresh = ht.PlanSampler(ds, batch_size=batch, accumulate=accumulate, seed=seed)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)
    after = [j for micro, _ in fresh.steps(DataLoader(ds, batch_sampler=fresh, num_workers=2))
             for m in micro for j in m[2].tolist()]
    read_before = hvd.allgather(torch.tensor(before, dtype=torch.int64)).tolist()
    read_after = hvd.allgather(torch.tensor(after, dtype=torch.int64)).tolist()
    out["state"] = state
    out["same_world_reads"] = np.bincount(read_before + read_after, minlength=n).tolist()
    # The same state in a world of 3 (ranks 0..2 played by this process, batch 10): the rest of the epoch once.
    resized = []
    for r in range(3):
        s = ht.PlanSampler(ds, batch_size=10, seed=seed, rank=r, world_size=3)
        s.load_state_dict(state)
        resized += [j for micro, _ in s.steps(DataLoader(ds, batch_sampler=s)) for m in micro for j in m[2].tolist()]
    out["resized_reads"] = np.bincount(read_before + resized, minlength=n).tolist()
    out["read_after_resize"], out["unread_at_state"] = sorted(resized), sorted(set(range(n)) - set(read_before))

    # 4. fit with a user CNN, label-smoothed cross-entropy and the user's Datasets (DataLoader worker processes).
    train, test = Pairs(data.x_train, data.y_train), Pairs(data.x_test, data.y_test)
    torch.manual_seed(seed)
    result = ht.fit(cfg, model=_user_cnn(), loss=torch.nn.CrossEntropyLoss(label_smoothing=0.1), train=train,
                    test=test, num_workers=2)
    out["fit"] = {k: getattr(result, k) for k in ("test_accuracy", "param_spread", "optimizer_steps",
                                                   "backward_passes", "allreduce_rounds", "plan_state")}
    out["fit_history"] = [h["test_accuracy"] for h in result.history]
    out["fit_steps_expected"] = epochs * ht.PlanSampler.from_config(cfg, train).plan.steps_per_epoch()

    # 5. Bad input: each fails with one message naming the problem, before any training step.
    errors = {}
    try:
        wide = _user_cnn(width=16 if rank == 0 else 24)
        ht.TorchBackend(wide, torch.optim.SGD(wide.parameters(), lr=0.1), cfg.sync)
    except ValueError as exc:
        errors["model_differs"] = str(exc)
    try:
        ht.PlanSampler(ds, batch_size=8, rank=2)
    except ValueError as exc:
        errors["rank_outside"] = str(exc)
    try:
        ht.fit(cfg, model=_user_cnn(), train=train)
    except ValueError as exc:
        errors["no_loss"] = str(exc)
    out["errors"] = errors
    return out


if __name__ == "__main__":
    # The figures the README states: `python -m tests.parallel.torch_user_data_workers` (2 local workers).
    import json

    from hvdsync import launch

    r = launch.run(run_checks, np=2, progress=False)[0]
    print(json.dumps({"big_batch_max_diff": r["big_batch_max_diff"], "big_batch_moved": r["big_batch_moved"],
                      "reads_once": all(c == [1] * 301 for c in r["reads_per_epoch"]),
                      "resume_reads_once": r["same_world_reads"] == [1] * 301 and r["resized_reads"] == [1] * 301,
                      "fit_test_accuracy": r["fit"]["test_accuracy"], "fit_history": r["fit_history"],
                      "errors": r["errors"]}, indent=1))
