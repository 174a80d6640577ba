"""What the shared loop shares with its callbacks: the :class:`Callback` hooks that
:func:`hvdsync.core.train.loop.fit_loop` calls on every rank around training, epochs, steps and evaluation, the
:class:`TrainContext` every hook gets, and the :class:`FitResult` the loop fills and returns. Tracking, profiling,
monitoring (the observer), adaptive shares, elastic commits and the sync modes plug in through it, as a user's own
callback does.

A module of its own, below the loop and below telemetry: the features that are callbacks (the observer, the monitor,
adaptive shares, the elastic ledger) import it without importing the loop, and the loop imports them. It imports
nothing of hvdsync but the data plan's value types (:mod:`hvdsync.core.train._plan`), which import nothing back;
the loop's and telemetry's objects in the context (settings, backend, tracker) are typed by what they are, in words,
so that no import (not even one for annotations) runs back up (tests/repo/test_layering.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from hvdsync.core._moved import to_adapters

if TYPE_CHECKING:  # annotations only: the context imports the data plan, the hooks nothing
    from hvdsync.core.train._context import TrainContext


class Callback:
    """Hooks into :func:`~hvdsync.core.train.loop.fit_loop`. Subclass and override what you need; every hook gets the
    :class:`TrainContext`.

    Hooks run on every rank, in the order the callbacks were given. A hook that makes a collective call (all-reduce,
    broadcast) must do so on every rank at the same point, or the ranks wait on each other forever.
    ``on_evaluate_begin`` / ``on_evaluate_end`` run around each epoch's evaluation (when there is one), inside its
    timed ``eval_seconds``.

    Attributes:
        messages: warning lines for the run's result (``FitResult.warnings``, which the launcher shows), read after
            training; none by default (the observer's monitor alarms are its).

    Example:
        >>> class PrintLoss(Callback):
        ...     def on_epoch_end(self, ctx):
        ...         if ctx.rank == 0: print(ctx.epoch, ctx.metrics["train_loss"])
    """

    messages: Sequence[str] = ()

    def on_train_begin(self, ctx: TrainContext) -> None: ...

    def on_epoch_begin(self, ctx: TrainContext) -> None: ...

    def on_step_begin(self, ctx: TrainContext) -> None: ...

    def on_step_end(self, ctx: TrainContext) -> None: ...

    def on_evaluate_begin(self, ctx: TrainContext) -> None: ...

    def on_evaluate_end(self, ctx: TrainContext) -> None: ...

    def on_epoch_end(self, ctx: TrainContext) -> None: ...

    def on_train_end(self, ctx: TrainContext) -> None: ...

    def report(self) -> dict:
        """Plain values this callback adds to each result of :func:`hvdsync.launch.train_many` (and
        ``hvdsync sweep``), after its training; nothing by default."""
        return {}


class _Callbacks(Callback):
    """Calls each hook of every callback in order."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)

    @property
    def messages(self) -> list[str]:
        return [m for cb in self.callbacks for m in getattr(cb, "messages", ())]

    def _each(self, hook: str, ctx: TrainContext) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(ctx)

    def on_train_begin(self, ctx): self._each("on_train_begin", ctx)  # noqa: E704

    def on_epoch_begin(self, ctx): self._each("on_epoch_begin", ctx)  # noqa: E704

    def on_step_begin(self, ctx): self._each("on_step_begin", ctx)  # noqa: E704

    def on_step_end(self, ctx): self._each("on_step_end", ctx)  # noqa: E704

    def on_evaluate_begin(self, ctx): self._each("on_evaluate_begin", ctx)  # noqa: E704

    def on_evaluate_end(self, ctx): self._each("on_evaluate_end", ctx)  # noqa: E704

    def on_epoch_end(self, ctx): self._each("on_epoch_end", ctx)  # noqa: E704

    def on_train_end(self, ctx): self._each("on_train_end", ctx)  # noqa: E704


# TrainContext and FitResult are the adapters' public names; their definitions live in the private _context (which
# hvdsync imports), so this path warns for them, naming the adapter, until 0.4.0. Callback stays defined here.
__getattr__ = to_adapters(__name__, {"TrainContext": "hvdsync.core.train._context",
                                     "FitResult": "hvdsync.core.train._context"}, until="0.4.0")
