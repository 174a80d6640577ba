"""Where :class:`TrainContext` and :class:`FitResult` are defined: what every hook of the shared loop gets and what
the loop returns. Their public names are the adapters' (``hvdsync.torch.TrainContext``, ``hvdsync.tensorflow.FitResult``);
hvdsync imports them from here, and :mod:`hvdsync.core.train.callbacks` forwards them, warning, until 0.4.0.

A private module of its own rather than a renamed ``callbacks`` because ``Callback`` stays in ``callbacks`` (the base
class every callback in the core subclasses): only the names whose core path is deprecated move, so a plain import
of the product's never warns. It imports only the data plan's value types, nothing that imports the loop or telemetry.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from hvdsync.core.train._plan import PlanState, ShardPlan, Step


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
        plan: the :class:`~hvdsync.core.train._plan.ShardPlan` in force (adaptive shares replace it per epoch).
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
