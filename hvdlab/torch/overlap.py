"""How much all-reduce Horovod hides behind the backward pass: a probe that runs in the workers.

Horovod's ``DistributedOptimizer`` registers a hook on every parameter; the moment backward has produced that
parameter's gradient, the hook hands it to Horovod (``allreduce_async_``), whose background thread fuses what is
ready (up to ``HOROVOD_FUSION_THRESHOLD`` bytes, every ``HOROVOD_CYCLE_TIME``) and reduces it *while backward goes on
computing the earlier layers' gradients*. :func:`probe` times the same model two ways, in one Horovod job:

* ``hooks``: Horovod's ``DistributedOptimizer`` (communication overlaps the rest of backward);
* ``after_backward``: a plain backward, then every gradient handed to Horovod (nothing can overlap).

and records, with wall-clock (``time.time()``) stamps comparable to Horovod's timeline, each step's backward
window and each gradient's ready time. The caller reads the job's timeline (``HOROVOD_TIMELINE``) with
:mod:`hvdsync.core.telemetry.timeline` and computes the hidden share (:func:`hvdsync.core.telemetry.timeline.overlap`).

Layer order matters: backward produces the *last* layer's gradient first. Big layers near the output are ready
early and their all-reduce hides behind the rest of backward; big layers near the input are ready last, with
nothing left to hide behind. :func:`layer_widths` builds both orders from the same layers.
"""
from __future__ import annotations

import time

import horovod.torch as hvd
import torch
from torch import nn

VARIANTS = ("hooks", "after_backward")


def layer_widths(order: str, small: int = 128, big: int = 1024, n_small: int = 3, n_big: int = 4) -> list[int]:
    """Widths of an MLP whose big layers sit at the output end (``big_last``) or the input end (``big_first``)."""
    widths = [small] * n_small + [big] * n_big
    if order == "big_last":
        return widths
    if order == "big_first":
        return widths[::-1]
    raise ValueError(f"order: {order!r} is not allowed; choose one of: big_last, big_first")


def _mlp(widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _run(model: nn.Sequential, variant: str, x: torch.Tensor, steps: int, warmup: int) -> dict:
    named = list(model.named_parameters())
    local = torch.optim.SGD(model.parameters(), lr=1e-3)
    if variant == "hooks":
        opt = hvd.DistributedOptimizer(local, named_parameters=named)
    elif variant == "after_backward":
        opt = local
    else:
        raise ValueError(f"variant: {variant!r} is not allowed; choose one of: {', '.join(VARIANTS)}")
    ready: dict[str, list[float]] = {name: [] for name, _ in named}
    handles = [p.register_post_accumulate_grad_hook(lambda _p, n=name: ready[n].append(time.time()))
               for name, p in named]
    windows, steps_s = [], []
    hvd.allreduce(torch.zeros(1), name=f"probe.barrier.{variant}.start")
    start = time.time()
    for i in range(warmup + steps):
        t0 = time.time()
        if i == warmup:
            start = t0      # the segment holds the timed steps only
        opt.zero_grad()
        loss = model(x).square().mean()
        b0 = time.time()
        loss.backward()
        b1 = time.time()
        if variant == "after_backward":
            # The same tensors and names the hooks would hand over, in the order backward produced them.
            work = [hvd.allreduce_async_(p.grad, name=name) for name, p in reversed(named)]
            for h in work:
                hvd.synchronize(h)
        else:
            opt.synchronize()
        with opt.skip_synchronize() if variant == "hooks" else _nothing():
            opt.step()
        if i >= warmup:
            windows.append((b0, b1))
            steps_s.append(time.time() - t0)
        else:
            for v in ready.values():
                v.clear()
    end = time.time()
    for h in handles:
        h.remove()
    # Horovod's timeline writer can lose its last records when the job shuts down right after them (seen: the last
    # step's spans missing from the file, once in ~10 jobs). One more collective and a moment for the writer keep the
    # timed steps' records away from that tail.
    hvd.allreduce(torch.zeros(1), name=f"probe.barrier.{variant}.end")
    time.sleep(0.1)
    return {"variant": variant, "segment": (start, end), "backward": windows, "step_seconds": steps_s,
            "ready": ready, "bytes": {name: p.numel() * p.element_size() for name, p in named}}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def probe(orders: tuple[str, ...] = ("big_last", "big_first"), variants: tuple[str, ...] = VARIANTS,
          batch: int = 256, steps: int = 5, warmup: int = 2, seed: int = 0, **widths) -> list[dict]:
    """Run in every worker of one Horovod job (started with ``HOROVOD_TIMELINE`` set); returns, per (order,
    variant), the time segment, each step's backward window, each gradient's ready times and step times.

    Example::

        rows = launch.run(probe, np=2, sync=SyncConfig(fusion_threshold_mb=0),
                          env={"HOROVOD_TIMELINE": "timeline.json"})[0]
    """
    hvd.init()
    torch.set_num_threads(1)
    rows = []
    for order in orders:
        w = layer_widths(order, **widths)
        for variant in variants:
            # A fresh model per variant: Horovod's hooks stay registered on the parameters they were given.
            torch.manual_seed(seed)
            model, x = _mlp(w), torch.randn(batch, w[0])
            rows.append({"order": order, **_run(model, variant, x, steps, warmup)})
    return rows
