"""Local SGD (periodic parameter averaging) and post-local SGD: when a rank communicates, planned in plain Python.

Every rank takes optimizer steps on its own gradients and, every H steps, all ranks replace their parameters (and
their optimizer state, see below) by the average over ranks: one all-reduce of the parameters per H steps instead
of one all-reduce of the gradients per step (Stich, "Local SGD converges fast and communicates little", ICLR 2019).
Post-local SGD (Lin et al., "Don't use large mini-batches, use local SGD", ICLR 2020) runs the first
``warmup`` steps fully synchronously (gradients all-reduced every step, as ``sync.mode: allreduce``) and only then
goes local: the early steps, where the loss falls fastest and ranks would drift most, stay in lock-step.

With steps numbered t = 1, 2, ... (the number of optimizer updates so far, *not* backward passes: gradient
accumulation happens inside one step, so it never straddles an averaging):

* t <= warmup: step t all-reduces the gradients before its update (:func:`synchronous`);
* t > warmup: step t updates locally, then averages when (t - warmup) is a multiple of H (:func:`averages_after`).

What happens to the optimizer state: hvdsync averages every floating-point state tensor that has a parameter's
shape (SGD's momentum buffer, Adam's two moments) in the *same* all-reduce as the parameters. Right after an
averaging every rank then holds the same parameters *and* the same state: the job has one state again, so rank 0's
checkpoint is the job's, and a momentum buffer does not keep pushing a rank along its own past direction. The
price is bytes per round (2x for SGD with momentum, 3x for Adam), not rounds. Keeping the buffers local (what Lin et
al. do) saves those bytes; it is not offered here.

Example:
    >>> [t for t in range(1, 13) if averages_after(t, period=4, warmup=0)]
    [4, 8, 12]
    >>> [t for t in range(1, 13) if synchronous(t, warmup=2) or averages_after(t, period=4, warmup=2)]
    [1, 2, 6, 10]
    >>> rounds(12, period=4, warmup=2)       # all-reduces a run of 12 steps makes (2 of gradients, 2 averagings)
    4
"""
from __future__ import annotations

from hvdsync.core.telemetry import monitor
from hvdsync.core.train.callbacks import Callback


def synchronous(step: int, warmup: int) -> bool:
    """Whether optimizer step ``step`` (1-based) all-reduces its gradients (post-local SGD's synchronous start)."""
    return step <= warmup


def averages_after(step: int, period: int, warmup: int = 0) -> bool:
    """Whether the parameters are averaged right after optimizer step ``step`` (1-based; an int or a tensor)."""
    # `&`, not `and`: the TensorFlow adapter calls this with tensors inside a graph (a tf.cond's predicate).
    return (step > warmup) & ((step - warmup) % period == 0)


def rounds(steps: int, period: int, warmup: int = 0) -> int:
    """All-reduce rounds in ``steps`` optimizer steps: ``min(steps, warmup)`` of gradients, then one per ``period``
    local steps. With ``period = 1`` and no warm-up it is ``steps``, as for synchronous SGD."""
    return min(steps, warmup) + max(0, steps - warmup) // period


class ParameterTrace(Callback):
    """A :class:`hvdsync.core.train.callbacks.Callback` that keeps this rank's parameter fingerprint
    (:func:`hvdsync.core.telemetry.monitor.fingerprint`) after every optimizer step, to see when ranks agree: compare two
    ranks' ``fingerprints`` step by step (equal right after an averaging, apart in between).

    Example::

        trace = ParameterTrace()
        fit_loop(cfg, backend, data, callbacks=[trace])   # then trace.fingerprints[t - 1] is after step t
    """

    def __init__(self) -> None:
        self.fingerprints: list[list[float]] = []

    def on_step_end(self, ctx) -> None:
        self.fingerprints.append(monitor.fingerprint(ctx.backend.parameters()).tolist())
