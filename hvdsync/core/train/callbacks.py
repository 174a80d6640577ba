"""What the shared loop shares with its callbacks: the :class:`Callback` hooks that
:func:`hvdsync.core.train.loop.fit_loop` calls on every rank around training, epochs, steps and evaluation, the
:class:`TrainContext` every hook gets, and the :class:`FitResult` the loop fills and returns. Tracking, profiling,
monitoring (the observer), adaptive shares, elastic commits and the sync modes plug in through it, as a user's own
callback does.

A module of its own, below the loop and below telemetry: the features that are callbacks (the observer, the monitor,
adaptive shares, the elastic ledger) import it without importing the loop, and the loop imports them. It imports
nothing of hvdsync but the data plan's value types (:mod:`hvdsync.core.train.sharding`), which import nothing back;
the loop's and telemetry's objects in the context (settings, backend, tracker) are typed by what they are, in words,
so that no import (not even one for annotations) runs back up (tests/repo/test_layering.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from hvdsync.core.train.sharding import PlanState, ShardPlan, Step


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


@dataclass
class FitResult:
    """What one rank returns from ``fit``; the launcher returns rank 0's."""

    framework: str
    world_size: int
    rank: int
    epochs: int
    test_accuracy: float
    history: list[dict] = field(default_factory=list)
    total_seconds: float = 0.0
    samples_per_second: float = 0.0
    wire: dict = field(default_factory=dict)
    allreduce_rounds: float = 0.0
    optimizer_steps: int = 0
    backward_passes: int = 0
    param_spread: float = 0.0
    phase_seconds: dict = field(default_factory=dict)
    run_id: str | None = None
    # Where training stopped in the plan (``PlanState.to_dict()``): what a resumed job continues from.
    plan_state: dict = field(default_factory=dict)
    # Monitor alarms and a tracking store that did not answer, one line each (the launcher shows them).
    warnings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        accuracy = "n/a" if math.isnan(self.test_accuracy) else f"{self.test_accuracy:.4f}"
        return (f"{self.framework} x{self.world_size}: test accuracy {accuracy} after {self.epochs} "
                f"epochs in {self.total_seconds:.1f}s ({self.samples_per_second:.0f} samples/s), "
                f"{self.wire.get('bytes', 0) / 1e6:.2f} MB handed to allreduce per rank "
                f"({', '.join(self.wire.get('dtypes', [])) or 'none'}), params equal across ranks: "
                f"{self.param_spread == 0.0}" + (f", MLflow run {self.run_id}" if self.run_id else ""))


@dataclass
class TrainContext:
    """What a :class:`Callback` sees; the loop updates it in place.

    Attributes:
        settings: the run's :class:`~hvdsync.core.train.loop.LoopSettings` (``settings.epochs``, ...).
        backend: the adapter's :class:`~hvdsync.core.train.loop.Backend` (``rank``, ``size``, ``framework``,
            ``timer``, ``wire``, ``allgather``, ``parameters``, ...).
        tracker: the run's :class:`~hvdsync.core.telemetry.tracking.Tracker` (rank 0's records).
        plan: the :class:`~hvdsync.core.train.sharding.ShardPlan` in force (adaptive shares replace it per epoch).
        result: the :class:`FitResult` the loop fills.
        epoch: the current epoch; step: optimizer steps done in this epoch (counting those before a resume).
        global_step: optimizer steps done by this run (not counting those before a resume).
        steps_before: optimizer steps the job took before this run (an elastic run's committed steps); 0 otherwise.
            ``job_step`` is ``steps_before + global_step``: the job's own count, across resets.
        position: samples of this epoch's global order consumed by all ranks together (the plan position).
        last_step: the step just taken (``Step``: its micro index arrays, ``global_count``); None before the first.
        metrics: after a step ``{"loss": mean loss of the step on this rank}``; after an epoch the epoch's metrics
            (gathered over ranks, identical on every rank).
        stop_training: set it to True to end training after the current step (on every rank alike: collectives
            must stay matched).
        status: ``RUNNING``, then ``FINISHED``, ``FAILED`` or ``KILLED`` (interrupted) in ``on_train_end``.
        state: an elastic run's committed state (:class:`~hvdsync.core.elastic.state.CommittedState`): what a
            callback puts into ``state.user`` is committed and rolled back with the model; None outside one.
    """

    settings: Any
    backend: Any
    tracker: Any
    plan: ShardPlan
    result: FitResult
    rank: int
    size: int
    epoch: int = 0
    step: int = 0
    global_step: int = 0
    position: int = 0
    last_step: Step | None = None
    metrics: dict = field(default_factory=dict)
    stop_training: bool = False
    status: str = "RUNNING"
    steps: Any = None  # the step source (adaptive shares re-divide its plan between epochs)
    steps_before: int = 0
    state: Any = None

    @property
    def job_step(self) -> int:
        """Optimizer steps of the whole job so far (see ``steps_before``)."""
        return self.steps_before + self.global_step

    @property
    def plan_state(self) -> PlanState:
        """The resumable position: (epoch, samples consumed), rolled over at the end of an epoch."""
        return PlanState(self.epoch, 0).advanced(self.plan, self.position)
