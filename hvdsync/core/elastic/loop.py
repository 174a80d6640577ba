"""Elastic training on the shared loop: :func:`elastic_fit` is :func:`hvdsync.core.train.loop.fit_loop` resumed from the
committed position, with the elastic parts as one callback (:class:`ElasticCallback`).

``elastic_fit`` is the function Horovod's elastic wrapper re-enters after every reset
(:func:`hvdsync.elastic.run`), so everything it needs about "where are we" comes from the state: ``epoch`` and
``consumed`` pick up the epoch's global order where the last commit left it, with the plan cut for the *current*
world size (the loop's plan from ``PlanState(epoch, consumed)``). No sample of the epoch is read twice, none is
skipped, whatever the sizes before and after.

The callbacks see the state (``TrainContext.state``): what they keep in ``state.user`` is committed with the model
and rolled back with it. :class:`~hvdsync.core.elastic._ledger.SampleLedger` counts that way which samples each rank
trained on, and the result carries its counts (``ElasticResult.reads``, ``.timeline``).
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from hvdsync.core.elastic._ledger import SampleLedger
from hvdsync.core.elastic.state import CommittedState
from hvdsync.core.telemetry.tracking import Tracker
from hvdsync.core.train.data import Dataset
from hvdsync.core.train._context import TrainContext
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.train.loop import LoopSettings, array_evaluator, fit_loop
from hvdsync.core.train._plan import PlanState

RUN_DIR_ENV = "HVDSYNC_RUN_DIR"


@dataclass
class ElasticResult:
    """What an elastic run returns (rank 0's): accuracy, the position reached, the resets and what was read."""

    framework: str
    world_size: int
    rank: int
    epochs: int
    steps: int
    test_accuracy: float
    history: list[dict] = field(default_factory=list)
    resets: list[dict] = field(default_factory=list)
    param_spread: float = 0.0
    params_sha256: str = ""
    reads: list[list[int]] | None = None
    timeline: list[list[float]] | None = None
    run_id: str | None = None
    total_seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        resets = "; ".join(f"{e['reason']} {e['size_before']}->{e['size_after']} workers, recovered in "
                           f"{e['recovery_seconds']:.1f}s" for e in self.resets) or "none"
        return (f"{self.framework} elastic, {self.world_size} workers at the end: test accuracy "
                f"{self.test_accuracy:.4f} after {self.epochs} epochs ({self.steps} steps) in {self.total_seconds:.1f}s; "
                f"resets: {resets}; params equal across ranks: {self.param_spread == 0.0}"
                + (f", MLflow run {self.run_id}" if self.run_id else ""))


def describe(event: dict) -> str:
    """One line for a reset record."""
    when = time.strftime("%H:%M:%S", time.localtime(event["time"]))
    return (f"elastic reset at {when} (step {event['step']}): {event['reason']}; world size {event['size_before']} "
            f"-> {event['size_after']}; recovered in {event['recovery_seconds']:.2f}s")


class _Reporter:
    """Rank 0 prints each reset and records it in MLflow; the tracker follows rank 0 (which may change).

    ``make_tracker(rank)`` makes the run's tracker (the layer above builds it from its config); ``params`` are the
    run parameters it records."""

    def __init__(self, make_tracker: Callable[[int], Tracker], params, state: CommittedState, framework: str) -> None:
        self.make_tracker, self.params, self.state, self.framework = make_tracker, dict(params), state, framework
        self.tracker = None

    def tracker_for_rank(self, rank: int, size: int):
        if rank != 0:  # a process that was rank 0 before a reset may not be now: only rank 0 writes
            return Tracker()
        if self.tracker is None:
            self.tracker = self.make_tracker(rank)
            # The run id is part of the committed state: a new rank 0 (or a resumed job) keeps writing to the run.
            self.tracker.start(params={**self.params, "world_size": size},
                               tags={"framework": self.framework, "elastic": "true"}, run_id=self.state.run_id)
        return self.tracker

    def note_run_id(self) -> None:
        """Put the MLflow run id into the state once the store has created the run (it answers asynchronously)."""
        if self.state.run_id is None and self.tracker is not None and self.state._rank() == 0:
            self.state.run_id = self.tracker.run_id

    def __call__(self, event: dict) -> None:
        if self.state._rank() != 0:
            return
        import sys

        print(f"hvdsync: {describe(event)}", file=sys.stderr, flush=True)
        if self.tracker is not None and self.tracker.active:
            self.tracker.log_metrics({"elastic_world_size": event["size_after"],
                                      "elastic_recovery_seconds": event["recovery_seconds"]}, step=event["step"])


class _ContinuingRun:
    """The reporter's tracker as the shared loop sees it: the run was started once per process, with the committed
    run id (:class:`_Reporter`), so the loop's ``start`` is a no-op; and the loop ends only after a reset when it
    raised, which is not the end of the run, so only a ``FINISHED`` is passed on."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker

    def __getattr__(self, name: str):
        return getattr(self._tracker, name)

    def start(self, *args, **kwargs) -> None:
        pass

    def finish(self, status: str = "FINISHED") -> None:
        if status == "FINISHED":
            self._tracker.finish(status)


class ElasticCallback(Callback):
    """The elastic parts of a run, as hooks of the shared loop (:func:`hvdsync.core.train.loop.fit_loop`): after each
    step the run id and the state's step (which commits when due and may raise ``HostsUpdatedInterrupt`` there, on
    every rank at the same step); after each epoch its record in the committed history and a commit. It is the
    loop's last callback: a commit then holds what every other callback did in the step (a ledger's counts).

    Args:
        state: the :class:`~hvdsync.core.elastic.state.CommittedState`.
        reporter: rank 0's reset reporter (it also puts the MLflow run id into the state).
    """

    def __init__(self, state: CommittedState, reporter: _Reporter) -> None:
        self.state, self.reporter = state, reporter

    def on_step_end(self, ctx: TrainContext) -> None:
        self.reporter.note_run_id()
        self.state.step_done(ctx.last_step.global_count)

    def on_epoch_end(self, ctx: TrainContext) -> None:
        # The history is a user object of the state: a restore rolls it back with the model.
        self.state.user["history"].append(
            {"epoch": ctx.epoch, **{k: ctx.metrics[k] for k in ("train_loss", "test_accuracy", "world_size")}})
        self.state.epoch_done()


def _no_tracking(rank: int) -> Tracker:
    return Tracker()


def elastic_fit(state: CommittedState, settings: LoopSettings, backend, data: Dataset,
                callbacks: Sequence[Callback] = (),
                make_tracker: Callable[[int], Tracker] = _no_tracking) -> ElasticResult:
    """Train from the state's position to ``settings.epochs`` on the shared loop; called (again after each reset)
    by the elastic run.

    Args:
        state: the :class:`~hvdsync.core.elastic.state.CommittedState` (position, user objects, reset log).
        settings: the loop's :class:`~hvdsync.core.train.loop.LoopSettings` (built by the layer above:
            :func:`hvdsync.fitting.loop_settings`); ``settings.params`` are the parameters the run records.
        backend: the adapter's loop backend; ``backend.refresh()`` re-reads rank and size after a reset.
        data: the dataset (same arrays on every rank).
        callbacks: more :class:`~hvdsync.core.train.callbacks.Callback` objects for the loop (the user's, made once per
            process: they live on across resets); ``TrainContext.job_step`` counts the job's committed steps too,
            and ``TrainContext.state`` is ``state``. A :class:`~hvdsync.core.elastic._ledger.SampleLedger` among them
            fills the result's ``reads`` and ``timeline``.
        make_tracker: ``make_tracker(rank)``: the run's tracker, made once per process when it is rank 0 (default:
            no tracking).
    """
    backend.refresh()
    rank, size = backend.rank, backend.size
    reporter = state.on_event if isinstance(state.on_event, _Reporter) else \
        _Reporter(make_tracker, settings.params, state, backend.framework)
    state.on_event = reporter
    tracker = reporter.tracker_for_rank(rank, size)
    state.user.setdefault("history", [])
    accuracy = array_evaluator(backend, data)

    def evaluate():
        return {**accuracy(), "world_size": float(size)}  # a plain number: the mean over ranks, i.e. the size

    # The plan for the *current* world from the committed position: the epoch's global order goes on where the
    # last commit left it, so no sample is read twice or skipped whatever the sizes before and after.
    result = fit_loop(settings, backend, data, evaluate, tracker=_ContinuingRun(tracker),
                      callbacks=[*callbacks, ElasticCallback(state, reporter)],
                      resume=PlanState(state.position.epoch, state.position.consumed),
                      progress_desc=f"{backend.framework} elastic x{size}",
                      steps_before=state.position.step, state=state)
    reporter.note_run_id()
    history = state.user["history"]
    ledger = next((c for c in callbacks if isinstance(c, SampleLedger)), None)
    return ElasticResult(
        framework=backend.framework, world_size=size, rank=rank, epochs=settings.epochs, steps=state.position.step,
        test_accuracy=history[-1]["test_accuracy"] if history else 0.0, history=history, resets=state.events,
        param_spread=result.param_spread, params_sha256=_digest(backend.parameters()),
        reads=ledger.reads if ledger is not None else None,
        timeline=ledger.timeline if ledger is not None else None, run_id=state.run_id,
        total_seconds=result.total_seconds)


def _digest(params) -> str:
    """SHA-256 of the parameters' bytes: equal digests are bitwise-equal models."""
    h = hashlib.sha256()
    for p in params:
        h.update(np.ascontiguousarray(p).tobytes())
    return h.hexdigest()
