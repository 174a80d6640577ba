"""A non-finite gradient that reaches one rank only, after the exchange (tests/parallel/test_codecs.py, notebook 09):
what mixed precision's rank-consistent skip (:class:`hvdsync.torch.precision.MixedPrecision`) is there for.

Injected from outside, through the public optimizer: :func:`after_reduce` wraps the backend's optimizer's
``synchronize()`` (the call that waits for, or runs, the all-reduce) on that one object, so that once armed this
rank's reduced gradients hold an inf when ``MixedPrecision.step`` checks them. hvdsync itself has no switch for it.
Mirrors :mod:`hvdlab.tensorflow.overflow`.

    overflow = after_reduce(backend)           # on every rank, before the steps
    if step == 3 and hvd.rank() == 0:
        overflow.arm()                         # the next step's reduced gradients on this rank: inf
    backend.train_step(micro, scale)
"""
from __future__ import annotations


class ReducedOverflow:
    """The handle :func:`after_reduce` returns: :meth:`arm` makes the next step's reduced gradients non-finite here."""

    def __init__(self) -> None:
        self.armed = False
        self.fired = 0  # how many steps it made non-finite

    def arm(self) -> None:
        """Make this rank's reduced gradients non-finite at the next ``synchronize()`` (once)."""
        self.armed = True


def after_reduce(backend) -> ReducedOverflow:
    """Wrap ``backend.optimizer.synchronize`` (a :class:`hvdsync.torch.TorchBackend`'s, or any Horovod-style
    optimizer's, as ``backend``) so that, when armed, the first reduced gradient's first entry becomes inf on this
    rank, after the all-reduce, as a value that went bad on one rank only would."""
    optimizer = getattr(backend, "optimizer", backend)
    handle, synchronize = ReducedOverflow(), optimizer.synchronize

    def synchronize_then_overflow(*args, **kwargs):
        out = synchronize(*args, **kwargs)
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if handle.armed and grads:
            grads[0].view(-1)[0] = float("inf")
            handle.armed, handle.fired = False, handle.fired + 1
        return out

    optimizer.synchronize = synchronize_then_overflow  # this object only: the class, and hvdsync, stay as they are
    return handle
