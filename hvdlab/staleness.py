"""Asynchronous SGD with bounded staleness, simulated: gradients applied tau steps late, with staleness-aware
learning-rate damping. Framework-free: the model enters as three callables (gradient, update, copy).

In an asynchronous parameter server (Hogwild!-style, Dean et al.'s Downpour SGD) a worker reads the parameters,
computes a gradient and pushes it; meanwhile the others have pushed theirs, so when it is applied the parameters
have moved on by ``s`` updates: the gradient is *stale* by ``s``. With W workers of equal speed taking turns,
``s = W - 1`` for every gradient; a bounded-staleness protocol (stale synchronous parallel, Ho et al., NIPS 2013)
only guarantees ``s <= tau``. The update the server makes is

    x_{t+1} = x_t - lr * d(s_t) * g(x_{t - s_t}; batch_t)

:func:`run_async` replays exactly this in one process: it keeps the last ``tau + 1`` parameter versions
(:class:`VersionHistory`), computes batch t's gradient at version ``t - s_t`` and applies it to the newest one.
With ``tau = 0`` it *is* synchronous SGD over the same batches in the same order (the gradient is fresh), which is
the comparison at the same samples. Damping ``d`` (:data:`DAMPING`): ``none``; ``bound``, ``1 / (1 + tau)`` for
every gradient (the learning rate a stale-safe step needs, taken whether or not a gradient was late); ``staleness``,
``1 / (1 + s)`` per gradient (Zhang et al., "Staleness-aware async-SGD", IJCAI 2016: a late gradient counts less).

Example:
    >>> delays(6, tau=2)                        # fixed: every gradient as late as the bound allows
    [0, 1, 2, 2, 2, 2]
    >>> max(delays(1000, tau=3, kind="uniform", seed=1)) <= 3
    True
    >>> DAMPING["staleness"](3, 4), DAMPING["bound"](3, 4)
    (0.25, 0.2)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

import numpy as np

P = TypeVar("P")

DAMPING: dict[str, Callable[[int, int], float]] = {
    "none": lambda s, tau: 1.0,
    "bound": lambda s, tau: 1.0 / (1 + tau),
    "staleness": lambda s, tau: 1.0 / (1 + s),
}
KINDS = ("fixed", "uniform")


def delays(steps: int, tau: int, kind: str = "fixed", seed: int = 0) -> list[int]:
    """Staleness of the gradient applied at each of ``steps`` updates, never more than ``tau`` nor than the
    versions that exist yet (update t can be at most t late).

    Args:
        kind: ``fixed`` (every gradient ``tau`` late: W = tau + 1 equal workers taking turns) or ``uniform``
            (uniform in 0..tau: workers of uneven speed under a staleness bound).
    """
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not allowed; choose one of: {', '.join(KINDS)}")
    if tau < 0:
        raise ValueError(f"tau: {tau!r} is not allowed; expected an integer >= 0")
    drawn = np.random.default_rng(seed).integers(0, tau + 1, steps) if kind == "uniform" else np.full(steps, tau)
    return [int(min(d, t)) for t, d in enumerate(drawn)]


class VersionHistory(Generic[P]):
    """The last ``tau + 1`` parameter versions: ``read(s)`` is the version ``s`` updates old (0: the newest)."""

    def __init__(self, first: P, tau: int) -> None:
        self._versions: deque[P] = deque([first], maxlen=tau + 1)

    def push(self, version: P) -> None:
        self._versions.append(version)

    def read(self, staleness: int) -> P:
        if not 0 <= staleness < len(self._versions):
            raise ValueError(f"staleness: {staleness!r} is not allowed; {len(self._versions)} versions are kept")
        return self._versions[-1 - staleness]


@dataclass
class AsyncRun:
    """What :func:`run_async` returns: the final parameters, each update's staleness and learning-rate factor,
    and what ``on_step`` returned along the way (e.g. evaluations)."""

    params: Any
    staleness: list[int] = field(default_factory=list)
    factors: list[float] = field(default_factory=list)
    trace: list = field(default_factory=list)


def run_async(x0: P, steps: int, grad: Callable[[P, int], Any], update: Callable[[P, Any, float], P],
              lr: float, tau: int, damping: str = "none", kind: str = "fixed", seed: int = 0,
              copy: Callable[[P], P] = lambda x: x, on_step: Callable[[int, P], Any] | None = None) -> AsyncRun:
    """``steps`` updates of asynchronous SGD whose gradients are up to ``tau`` updates stale.

    Args:
        x0: the starting parameters.
        grad: ``grad(params, t)``: the gradient of batch ``t`` at ``params`` (a stale version).
        update: ``update(params, gradient, lr) -> new params`` (may update in place and return ``params``).
        lr: the learning rate before damping. tau: the staleness bound. damping: a key of :data:`DAMPING`.
        kind: how late each gradient is (:func:`delays`). copy: a copy of the parameters (kept as a version).
        on_step: ``on_step(t, params)`` after update t (1-based); what it returns (not None) goes into ``trace``.

    Example:
        >>> run = run_async(0.0, 3, grad=lambda x, t: x - 1.0, update=lambda x, g, lr: x - lr * g, lr=0.5, tau=1)
        >>> run.params, run.staleness    # x: 0 -> 0.5 -> 1.0 (gradient read at 0) -> 1.25 (at 0.5): past the optimum
        (1.25, [0, 1, 1])
    """
    if damping not in DAMPING:
        raise ValueError(f"damping: {damping!r} is not allowed; choose one of: {', '.join(DAMPING)}")
    late = delays(steps, tau, kind, seed)
    history = VersionHistory(copy(x0), tau)
    x, factors, trace = x0, [], []
    for t, s in enumerate(late):
        g = grad(history.read(s), t)           # computed on the version the worker read s updates ago
        factors.append(DAMPING[damping](s, tau))
        x = update(x, g, lr * factors[-1])     # applied to the newest version
        history.push(copy(x))
        if on_step is not None and (out := on_step(t + 1, x)) is not None:
            trace.append(out)
    return AsyncRun(x, late, factors, trace)
