"""The shared loop's extension point: :class:`Callback` hooks that :func:`hvdsync.core.train.loop.fit_loop` calls on
every rank around training, epochs, steps and evaluation. Tracking, profiling, monitoring, adaptive shares, elastic
commits and the sync modes plug in through it, as a user's own callback does.

A module of its own, below the loop: the features that are callbacks import it without importing the loop, which
imports them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # annotations only: at run time the loop imports this module, not the other way
    from hvdsync.core.train.loop import TrainContext


class Callback:
    """Hooks into :func:`~hvdsync.core.train.loop.fit_loop`. Subclass and override what you need; every hook gets the
    :class:`~hvdsync.core.train.loop.TrainContext`.

    Hooks run on every rank, in the order the callbacks were given. A hook that makes a collective call (all-reduce,
    broadcast) must do so on every rank at the same point, or the ranks wait on each other forever.
    ``on_evaluate_begin`` / ``on_evaluate_end`` run around each epoch's evaluation (when there is one), inside its
    timed ``eval_seconds``.

    Example:
        >>> class PrintLoss(Callback):
        ...     def on_epoch_end(self, ctx):
        ...         if ctx.rank == 0: print(ctx.epoch, ctx.metrics["train_loss"])
    """

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
