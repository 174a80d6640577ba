"""A training step's forward and backward passes, measured apart rather than claimed: the bytes the step holds
between them (:func:`saved_bytes`, notebooks 06 and 09) and the time each takes (:func:`pass_seconds`, notebook 11).

Autograd keeps, for each operation of the forward pass, the tensors its backward needs: the *saved tensors*.
:func:`saved_bytes` counts them through ``torch.autograd.graph.saved_tensors_hooks`` at the moment they are saved,
and splits them into the model's own parameters (held anyway, whatever the batch) and everything else, the
activations and the copies made for the backward (autocast's 16-bit casts of the weights among them). Those bytes
are what grows with the batch and what mixed precision shrinks; on a GPU they are most of a step's peak memory
above the weights and optimizer state. Counted per tensor (its own elements, also where it is a view of a larger
batch), so a tensor saved twice counts once.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn


def saved_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                loss_fn: Callable = nn.functional.cross_entropy, dtype: torch.dtype | None = None) -> dict:
    """One forward pass of ``model`` on ``(x, y)`` (under CPU/GPU ``autocast`` to ``dtype`` when given), then its
    backward; returns the bytes autograd saved for that backward:
    ``{"activations": ..., "parameters": ..., "dtypes": {dtype name: bytes}}``."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[tuple] = set()
    out = {"activations": 0, "parameters": 0, "dtypes": {}}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # The tensor's own bytes, not its storage's: a micro-batch sliced from a batch is a view of the whole.
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key not in seen:
            seen.add(key)
            kind = "parameters" if t.untyped_storage().data_ptr() in params else "activations"
            nbytes = t.numel() * t.element_size()
            out[kind] += nbytes
            if kind == "activations":
                name = str(t.dtype).removeprefix("torch.")
                out["dtypes"][name] = out["dtypes"].get(name, 0) + nbytes
        return t

    cast = (torch.autocast(x.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
        loss = loss_fn(model(x), y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return out


def pass_seconds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 20, warmup: int = 3,
                 loss_fn: Callable = nn.functional.cross_entropy) -> dict:
    """The forward pass (model and loss) and the backward pass of ``model`` on ``(x, y)`` timed apart, in this
    process: ``{"forward": s, "backward": s}``, each the median of ``steps`` passes after ``warmup`` untimed ones.
    A worker's ``compute`` phase (:class:`hvdsync.core.telemetry.profiling.PhaseTimer`) is their sum; a distributed
    step adds the all-reduce (Horovod's hooks start it inside the backward) and the update."""
    fwd, bwd = [], []
    for i in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    model.zero_grad(set_to_none=True)
    return {"forward": statistics.median(fwd), "backward": statistics.median(bwd)}
