"""Runs one codec over all parameters in lock-step rounds of collectives.

Each parameter's :meth:`~hvdsync.core.comm.codecs.base.Codec.reduce` is a generator that yields the collectives it
needs. Round by round, the driver collects every parameter's requests and hands them to the adapter's
``execute`` at once (one grouped all-reduce, a batch of allgathers), then sends each parameter its results. Every
rank builds the same generators in the same order, so every rank makes the same requests in the same order: no
rank waits in a collective that another never joins.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from hvdsync.core.comm.codecs.base import Codec, Ops, ReduceContext, Request

# execute(requests) -> results: the adapter runs the collectives (and records their bytes).
Execute = Callable[[list[Request]], list[Any]]


def reduce_all(codec: Codec, ops: Ops, grads: Sequence[Any], state, ctx: ReduceContext,
               execute: Execute) -> list[Any]:
    """The combined dense gradients (identical on every rank), in the order of ``grads``.

    Args:
        codec: a reducing codec (not a cast codec).
        ops: the framework's kernels.
        grads: this rank's gradients, one per parameter of ``state``.
        state: the :class:`~hvdsync.core.comm.codecs.state.CodecState` of these parameters.
        ctx: world size, op, error feedback, seed, rank.
        execute: runs a list of requests, returns their results in order.
    """
    out: list[Any] = [None] * len(grads)
    running = {}
    pending: dict[int, list[Request]] = {}
    for i, g in enumerate(grads):
        gen = codec.reduce(ops, g, state.slots[i], ctx, i)
        _advance(gen, None, i, running, pending, out)
    while pending:
        order = sorted(pending)
        flat = [req for i in order for req in pending[i]]
        results = execute(flat)
        at, replies = 0, {}
        for i in order:
            n = len(pending[i])
            replies[i], at = results[at:at + n], at + n
        pending = {}
        for i in order:
            _advance(running[i], replies[i], i, running, pending, out)
    return out


def _advance(gen, reply, i, running, pending, out) -> None:
    try:
        pending[i] = gen.send(reply)
        running[i] = gen
    except StopIteration as stop:
        out[i] = stop.value
        running.pop(i, None)
