"""Data parallel combined with a model split (notebook 17): two pipeline stages per rank pair, data parallel across
pairs, against plain data parallelism, on the same global batches.

When a model does not fit on one worker, its layers are split over two workers: rank ``2p`` holds stage 0 (the
first layers) and rank ``2p + 1`` stage 1 (the rest) of pair ``p``. Each step, stage 0 sends its activations to
stage 1, stage 1 sends the gradient of those activations back, and with more than one pair the ranks holding the
same stage all-reduce that stage's gradients in their own Horovod process set. Horovod has no point-to-point send:
within a pair, a tensor travels by ``hvd.broadcast`` in the pair's process set, rooted at the sender.

The trade-off: data parallelism moves every parameter's gradient each step (bytes grow with the model), the split
moves activations (bytes grow with the batch and the width at the cut) and halves each worker's parameters; the
two stages of a pair also wait for each other (without micro-batches, one stage idles while the other computes).

This is a measurement, not a ``sync.mode``: the split changes the model's code (which layers live where, what is
sent between them), so it does not fit the adapters' shape of "any model, one optimizer wrapper".
"""
from __future__ import annotations

import os
import time

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn

from hvdsync.core.comm.codecs import WireCounter


def stages(features: int, hidden: int, classes: int, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """The model, cut in two: stage 0 = two wide layers, stage 1 = one wide layer and the classifier."""
    torch.manual_seed(seed)
    first = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
    second = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return first, second


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _average_gradients(params: list, process_set, name: str, counter: WireCounter) -> None:
    grads = [p.grad for p in params]
    for g in grads:
        counter.record(g.numel(), g.element_size(), "float32")
    # In place: no new output tensors to allocate and copy back (docs/measurements/allreduce.md, "Where the time goes").
    hvd.grouped_allreduce_(grads, op=hvd.Average, process_set=process_set, name=name)


def _slowest(seconds: float, name: str) -> float:
    return float(hvd.allreduce(torch.tensor([seconds]), op=hvd.Max, name=name).item())


def data_parallel(x: np.ndarray, y: np.ndarray, hidden: int, batches: list[np.ndarray], lr: float, seed: int) -> dict:
    """Every rank holds the whole model and takes ``1/size`` of each global batch; gradients are all-reduced."""
    rank, size = hvd.rank(), hvd.size()
    first, second = stages(x.shape[1], hidden, int(y.max()) + 1, seed)
    model = nn.Sequential(first, second)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    counter, times = WireCounter(), []
    for i, batch in enumerate(batches):
        mine = np.array_split(batch, size)[rank]
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.from_numpy(x[mine])), torch.from_numpy(y[mine])).backward()
        _average_gradients(list(model.parameters()), hvd.global_process_set, f"split.dp.{i}", counter)
        opt.step()
        times.append(time.perf_counter() - start)
    return {"bytes_per_step": counter.bytes / len(batches), "params_per_rank": _numel(model),
            "seconds_per_step": _slowest(float(np.median(times[1:] or times)), "split.dp.time"),
            "params": [p.detach().numpy().copy() for p in model.parameters()]}


def pipeline_pairs(x: np.ndarray, y: np.ndarray, hidden: int, batches: list[np.ndarray], lr: float, seed: int,
                   pair_sets: list, stage_sets: list) -> dict:
    """Rank ``2p + s`` holds stage ``s`` of pair ``p``; pair ``p`` takes ``1/pairs`` of each global batch."""
    rank, size = hvd.rank(), hvd.size()
    pair, stage = divmod(rank, 2)
    pairs = size // 2
    pair_set, stage_set = pair_sets[pair], stage_sets[stage]
    sender, receiver = 2 * pair, 2 * pair + 1
    mine_stage = stages(x.shape[1], hidden, int(y.max()) + 1, seed)[stage]
    opt = torch.optim.SGD(mine_stage.parameters(), lr=lr)
    counter, activation_bytes, times = WireCounter(), 0, []
    for i, batch in enumerate(batches):
        mine = np.array_split(batch, pairs)[pair]
        start = time.perf_counter()
        opt.zero_grad()
        if stage == 0:
            h = mine_stage(torch.from_numpy(x[mine]))
            counter.record(h.numel(), h.element_size(), "float32")
            activation_bytes += h.numel() * h.element_size()
            hvd.broadcast(h.detach(), root_rank=sender, process_set=pair_set, name=f"split.act.{i}")
            # Stage 1 sends d loss / d h back; the backward pass of stage 0 starts from it.
            grad_h = hvd.broadcast(torch.zeros_like(h), root_rank=receiver, process_set=pair_set,
                                   name=f"split.grad.{i}")
            h.backward(grad_h)
        else:
            h = hvd.broadcast(torch.zeros(len(mine), hidden), root_rank=sender, process_set=pair_set,
                              name=f"split.act.{i}").requires_grad_()
            nn.functional.cross_entropy(mine_stage(h), torch.from_numpy(y[mine])).backward()
            counter.record(h.grad.numel(), h.grad.element_size(), "float32")
            activation_bytes += h.grad.numel() * h.grad.element_size()
            hvd.broadcast(h.grad, root_rank=receiver, process_set=pair_set, name=f"split.grad.{i}")
        if pairs > 1:  # data parallel across pairs: the ranks holding this stage average its gradients
            _average_gradients(list(mine_stage.parameters()), stage_set, f"split.stage{stage}.{i}", counter)
        opt.step()
        times.append(time.perf_counter() - start)
    return {"bytes_per_step": counter.bytes / len(batches), "activation_bytes_per_step": activation_bytes / len(batches),
            "params_per_rank": _numel(mine_stage),
            "seconds_per_step": _slowest(float(np.median(times[1:] or times)), "split.pp.time"),
            "params": [p.detach().numpy().copy() for p in mine_stage.parameters()]}


def model_split_comparison(hidden: int = 512, global_batches: tuple[int, ...] = (32, 256), steps: int = 8,
                           lr: float = 0.05, seed: int = 0) -> dict:
    """Run in a job of 2 or 4 workers (Gloo): plain data parallelism and the split (one pair with 2 workers;
    2 pairs, data parallel across them, with 4) on the same global batches of digits, per global batch size.

    Returns for rank 0 ... every rank: per global batch, each layout's bytes handed to Horovod per step (gradients;
    activations and their gradients), parameters held, the slowest rank's median step time, and the largest
    difference between the split's parameters and data parallelism's after ``steps`` SGD steps (the same maths,
    so float rounding only).
    """
    from hvdsync import datasets

    size_hint = int(os.environ.get("HOROVOD_SIZE", "2"))  # set by Horovod's launcher; hvd.size() needs init
    # Process sets must be declared at init: the pairs {0,1}, {2,3} and the stages {0,2}, {1,3}. With 2 workers the
    # pair is the whole world and each stage is one rank, so no set is needed.
    pair_sets = [hvd.ProcessSet([2 * p, 2 * p + 1]) for p in range(size_hint // 2)] if size_hint > 2 else []
    stage_sets = [hvd.ProcessSet(list(range(s, size_hint, 2))) for s in (0, 1)] if size_hint > 2 else []
    hvd.init(process_sets=pair_sets + stage_sets)
    if hvd.size() % 2:
        raise ValueError(f"np: {hvd.size()} is not allowed for the split; expected an even number of workers")
    if hvd.size() == 2:
        pair_sets, stage_sets = [hvd.global_process_set], [None, None]
    torch.set_num_threads(1)
    data = datasets.digits(0.25, seed)
    x, y = data.x_train, data.y_train
    out = {"rank": hvd.rank(), "size": hvd.size(), "hidden": hidden, "rows": []}
    for g in global_batches:
        rng = np.random.default_rng([seed, g])
        batches = [rng.choice(len(x), g, replace=False) for _ in range(steps)]
        dp = data_parallel(x, y, hidden, batches, lr, seed)
        pp = pipeline_pairs(x, y, hidden, batches, lr, seed, pair_sets, stage_sets)
        stage = hvd.rank() % 2
        split_at = len(list(stages(x.shape[1], hidden, 10, seed)[0].parameters()))
        reference = dp["params"][:split_at] if stage == 0 else dp["params"][split_at:]
        difference = max(float(np.abs(a - b).max()) for a, b in zip(pp.pop("params"), reference))
        dp.pop("params")
        out["rows"].append({"global_batch": g, "data_parallel": dp, "split": pp, "param_difference": difference})
    return out
