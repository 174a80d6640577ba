"""The training loop both frameworks share: it consumes *steps*, whatever the model, loss and data.

An adapter hands the loop its :class:`LoopSettings` (plain values the layer above takes from a config:
:func:`hvdsync.fitting.loop_settings`), a :class:`Backend` (the user's model, loss and optimizer behind a few methods) and a
:class:`StepSource` (``epoch_steps(epoch, start)`` yields this rank's ``(micro_batches, step)`` per optimizer step:
numpy arrays from :class:`hvdsync.core.train.loader.PlanLoader`, or the batches of a user's ``DataLoader`` read through
``hvdsync.torch.PlanSampler``). Evaluation is a function the user may pass. The loop owns what is the same in
PyTorch and TensorFlow: epochs and the plan position (resumable), the loss scale, metrics gathered across ranks, the
MLflow run record, progress on rank 0, the cross-rank parameter check, and the callbacks that other features plug
into (:class:`~hvdsync.core.train.callbacks.Callback`: the observer, profiling, monitoring, elastic commits,
communication schemes; the observer is handed in, not built here).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from hvdsync.core.telemetry import monitor
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.train import callbacks as _hooks
from hvdsync.core.train import _context
from hvdsync.core.train.adaptive import AdaptiveShares, GrowthLearningRate
from hvdsync.core.train.data import Dataset
from hvdsync.core.train.loader import PlanLoader
from hvdsync.core.telemetry.profiling import PhaseTimer
from hvdsync.core.telemetry.progress import Progress
from hvdsync.core.train._scaling import loss_scale
from hvdsync.core.train._plan import PlanState, ShardPlan, Step
from hvdsync.core.train.shares import share_slice
from hvdsync.core.telemetry.tracking import EPOCH_PREFIX, Tracker

# What an evaluation returns: per metric, this rank's (sum, count); the loop sums both over ranks and divides, so the
# result is the metric over all ranks' samples. A plain float counts as (value, 1): the mean over ranks.
Evaluation = Mapping[str, "float | tuple[float, float]"]


class Backend(Protocol):
    """What an adapter implements for the loop (see ``hvdsync/torch/train.py`` and ``hvdsync/tensorflow/train.py``)."""

    rank: int
    size: int
    framework: str
    wire: WireCounter
    timer: PhaseTimer

    def train_step(self, micro: list, scale: float) -> float:
        """One optimizer step over ``micro`` batches (``(x, y)`` pairs); each micro-batch's summed loss is
        multiplied by ``scale`` before backward. Returns the unscaled sum of per-sample losses on this rank."""

    def allgather(self, values: np.ndarray) -> np.ndarray:
        """All ranks' ``values`` stacked: shape ``(size, *values.shape)``."""

    def parameters(self) -> list[np.ndarray]:
        """The model's parameters as numpy arrays."""

    @property
    def grad_tensors(self) -> int:
        """Gradient tensors per all-reduce round (to turn counted tensors into rounds)."""


class StepSource(Protocol):
    """This rank's steps: ``plan`` (a :class:`ShardPlan` for this world) and ``epoch_steps``."""

    plan: ShardPlan

    def epoch_steps(self, epoch: int, start: int = 0) -> Iterable[tuple[list, Step]]:
        """``(micro_batches, step)`` per optimizer step of ``epoch``, from global sample offset ``start``."""


@dataclass(frozen=True)
class LoopSettings:
    """What the shared loop needs to know, as plain values; the layer above builds it from a config
    (:func:`hvdsync.fitting.loop_settings`), so the loop reads no config.

    Attributes:
        epochs: epochs to train (a resumed run goes on to this count).
        op: how the ranks' gradients combine (``average`` or ``sum``): the loss scale of each step
            (:func:`~hvdsync.core.train._scaling.loss_scale`).
        batch_size, accumulate, seed, shuffle, batch_growth: the :class:`~hvdsync.core.train._plan.ShardPlan`
            that reads a :class:`~hvdsync.core.train.data.Dataset` (:meth:`plan`).
        adaptive_shares: re-divide each epoch's steps by the ranks' measured speed
            (:class:`~hvdsync.core.train.adaptive.AdaptiveShares`).
        growth_lr: how the learning rate follows a growing batch (:func:`~hvdsync.core.train._scaling.grown_lr`).
        params: the run parameters the tracker records (``world_size`` is added).

    Example:
        >>> LoopSettings(epochs=2, batch_size=32).plan(dataset_size=1000, world_size=2).global_batch
        64
    """

    epochs: int = 1
    op: str = "average"
    batch_size: int = 32
    accumulate: int = 1
    seed: int = 0
    shuffle: bool = True
    batch_growth: tuple = ()
    adaptive_shares: bool = False
    growth_lr: str = "sqrt"
    params: Mapping[str, Any] = field(default_factory=dict)

    def plan(self, dataset_size: int, world_size: int) -> ShardPlan:
        """The shard plan for ``dataset_size`` samples on ``world_size`` ranks."""
        return ShardPlan(dataset_size, world_size, self.batch_size, self.accumulate, self.seed, self.shuffle,
                         growth=self.batch_growth)


class BeforeStep(_hooks.Callback):
    """``fn(epoch, step)`` before every step on every rank (teaching hooks, e.g. a slow rank in notebook 01)."""

    def __init__(self, fn: Callable[[int, int], None]) -> None:
        self.fn = fn

    def on_step_begin(self, ctx: _context.TrainContext) -> None:
        self.fn(ctx.epoch, ctx.step)


# Test samples per ``count_correct`` call: a model's activations for the whole test slice at once can exceed a
# GPU's memory (and, on a CPU, the caches: an MLP 64-16384-10 scored 8,192 samples in 420 ms at once, 353 ms in
# chunks of 512).
EVAL_BATCH = 512


def array_evaluator(backend: Any, data: Dataset, batch: int = EVAL_BATCH,
                    shares: Callable[[], Sequence[float] | None] = lambda: None) -> Callable[[], Evaluation]:
    """Accuracy on ``data``'s test arrays: each rank scores its contiguous part, cut by ``shares()`` (the shares of
    the training steps in force, ``None`` for equal; :func:`~hvdsync.core.train.shares.share_slice`), ``batch`` samples
    at a time (``backend.count_correct``).

    With unequal shares a slow rank scores fewer samples too: the evaluation is part of every epoch, and split
    equally it would make every rank wait for the slow one there as well.
    """

    def evaluate() -> Evaluation:
        part = share_slice(len(data.x_test), backend.rank, backend.size, shares())
        x, y = data.x_test[part], data.y_test[part]
        correct = sum(backend.count_correct(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch))
        return {"test_accuracy": (correct, len(x))}

    return evaluate


def _gather_metrics(backend: Backend, local: dict[str, float], evaluation: Evaluation) -> dict[str, float]:
    """One all-gather for the epoch's numbers. Every rank must return the same evaluation keys."""
    names = sorted(evaluation)
    pairs = [v if isinstance(v, (tuple, list)) else (float(v), 1.0) for v in (evaluation[n] for n in names)]
    row = [local["loss_sum"], local["seen"], local["step_seconds"], local["epoch_seconds"], local["eval_seconds"]]
    row += [float(x) for pair in pairs for x in pair]
    g = backend.allgather(np.array(row, dtype=np.float64))
    metrics = {
        "train_loss": g[:, 0].sum() / max(1.0, g[:, 1].sum()),
        "epoch_seconds": g[:, 3].max(),
        "samples_per_second": g[:, 1].sum() / max(1e-9, g[:, 3].max()),
        "step_seconds_max_rank": g[:, 2].max(),
        "step_seconds_min_rank": g[:, 2].min(),
        # The evaluation's part of the epoch (its test set is cut by the same shares as the steps).
        "eval_seconds": g[:, 4].max(),
    }
    for i, name in enumerate(names):
        total, count = g[:, 5 + 2 * i].sum(), g[:, 6 + 2 * i].sum()
        metrics[name] = total / count if count else float("nan")
    return {k: float(v) for k, v in metrics.items()}


def _train_epoch(ctx: _context.TrainContext, steps: StepSource, callbacks: _hooks.Callback, bar: Progress, start: int) -> dict:
    backend, result = ctx.backend, ctx.result
    loss_sum, seen, step_times = 0.0, 0, []
    ctx.position = start
    ctx.step = ctx.plan.steps_per_epoch(0, ctx.epoch) - ctx.plan.steps_per_epoch(start, ctx.epoch)
    batches: Iterator = iter(steps.epoch_steps(ctx.epoch, start))
    while not ctx.stop_training:
        t = time.perf_counter()
        with backend.timer.phase("data"):
            item = next(batches, None)
        if item is None:
            break
        micro, step = item
        fetched = time.perf_counter() - t
        callbacks.on_step_begin(ctx)
        t = time.perf_counter()
        step_loss = backend.train_step(micro, loss_scale(step.global_count, ctx.size, ctx.settings.op))
        step_times.append(fetched + time.perf_counter() - t)  # a hook's own time (a slowed rank) is not the step's
        loss_sum += step_loss
        seen += step.local_count
        result.optimizer_steps += 1
        result.backward_passes += len(micro)  # micro-batches handed to the backend (array path: empty ones too)
        ctx.step, ctx.global_step, ctx.position = ctx.step + 1, ctx.global_step + 1, ctx.position + step.global_count
        ctx.last_step, ctx.metrics = step, {"loss": step_loss / max(1, step.local_count)}
        bar.update(1, loss=ctx.metrics["loss"])
        callbacks.on_step_end(ctx)
    return {"loss_sum": loss_sum, "seen": seen, "step_seconds": float(np.mean(step_times)) if step_times else 0.0}


def fit_loop(settings: LoopSettings, backend: Backend, steps: StepSource | Dataset,
             evaluate: Callable[[], Evaluation] | None = None, tracker: Tracker | None = None,
             callbacks: Sequence[_hooks.Callback] = (), resume: PlanState | None = None,
             before_step: Callable[[int, int], None] | None = None, progress_desc: str | None = None,
             params: Mapping[str, Any] | None = None, steps_before: int = 0, state: Any = None,
             observer: _hooks.Callback | None = None) -> _context.FitResult:
    """Train ``backend`` on ``steps`` as ``settings`` say; returns this rank's
    :class:`~hvdsync.core.train._context.FitResult`.

    A script with a config calls :func:`hvdsync.fitting.fit_loop` (the same arguments, with the config first): it
    builds the settings, the tracker and the recorded parameters from the config and calls this function.

    Args:
        settings: the :class:`LoopSettings` (epochs, loss-scale op, the plan of a ``Dataset``, ...).
        backend: the adapter's backend (the user's model, loss and optimizer; Horovod calls).
        steps: a :class:`StepSource`; a :class:`~hvdsync.core.train.data.Dataset` is read through a
            :class:`~hvdsync.core.train.loader.PlanLoader` with ``settings.plan(...)`` (then ``evaluate`` defaults to
            the test accuracy by ``backend.count_correct``).
        evaluate: called on every rank after each epoch; returns ``{metric: (sum, count)}`` over this rank's share
            (or plain floats, averaged over ranks). None: no evaluation.
        tracker: the run's :class:`~hvdsync.core.telemetry.tracking.Tracker` (rank 0's records); None: no tracking.
        callbacks: :class:`~hvdsync.core.train.callbacks.Callback` objects (tracking, profiling, elastic commits,
            ... plug in here), called in this order.
        resume: start from this plan position (e.g. ``PlanSampler.state_dict()`` or an elastic commit).
        before_step: ``before_step(epoch, step)`` on every rank before each step (shorthand for a callback).
        params: run parameters to record instead of ``settings.params``.
        steps_before: the job's optimizer steps before this run (``TrainContext.job_step``).
        state: an elastic run's committed state, for the callbacks (``TrainContext.state``).
        observer: the callback that records per-step and per-rank figures, monitor checks and the run's artifacts
            (:class:`~hvdsync.core.telemetry.observe.Observer`), called before all others; None: none. The loop
            builds none itself: :func:`hvdsync.fitting.fit_loop` hands it the one the config describes, and the
            elastic loop none (it re-enters this loop after every reset).

    Example:
        >>> result = fit_loop(LoopSettings(epochs=2), backend, PlanLoader(x, y, plan, rank), evaluate=my_eval)  # doctest: +SKIP
    """
    rank, size = backend.rank, backend.size
    if isinstance(steps, Dataset):
        data = steps
        steps = PlanLoader(data.x_train, data.y_train, settings.plan(len(data.x_train), size), rank)
        # The test set is cut by the shares in force (the plan's, which adaptive shares replace each epoch).
        evaluate = evaluate if evaluate is not None else array_evaluator(backend, data, shares=lambda: ctx.plan.shares)
    plan = steps.plan
    if plan.world_size != size:
        raise ValueError(f"steps: a plan for {plan.world_size} ranks is not allowed in a world of {size}; "
                         f"build the plan (or PlanSampler) with world_size={size}")
    resume = resume or PlanState()
    tracker = tracker if tracker is not None else Tracker()
    tracker.start(params={**(params if params is not None else settings.params), "world_size": size},
                  tags={"framework": backend.framework})
    total = sum(plan.steps_per_epoch(resume.consumed if e == resume.epoch else 0, e)
                for e in range(resume.epoch, settings.epochs))
    bar = Progress(total if resume.epoch < settings.epochs else 0, rank,
                   desc=progress_desc or f"{backend.framework} x{size}")
    result = _context.FitResult(backend.framework, size, rank, settings.epochs, float("nan"))
    ctx = _context.TrainContext(settings, backend, tracker, plan, result, rank, size, epoch=resume.epoch,
                              position=resume.consumed, steps=steps, steps_before=steps_before, state=state)
    # The observer first (per-step and per-rank figures, monitor checks, the run's artifacts), then the loop's own.
    own = [observer] if observer is not None else []
    if settings.adaptive_shares:
        own.append(AdaptiveShares())
    if plan.growth:
        own.append(GrowthLearningRate(settings.growth_lr))
    hooks = _hooks._Callbacks([*own, *callbacks] + ([BeforeStep(before_step)] if before_step is not None else []))
    start = time.perf_counter()
    try:
        hooks.on_train_begin(ctx)
        for epoch in range(resume.epoch, settings.epochs):
            ctx.epoch = epoch
            hooks.on_epoch_begin(ctx)
            epoch_start, tensors = time.perf_counter(), backend.wire.snapshot()["tensors"]
            local = _train_epoch(ctx, steps, hooks, bar, resume.consumed if epoch == resume.epoch else 0)
            eval_start, evaluation = time.perf_counter(), {}
            if evaluate is not None:
                # The hooks run inside the evaluation's time, whichever evaluator runs (a test's simulated slow
                # rank scores slower there, as a slower processor would).
                hooks.on_evaluate_begin(ctx)
                evaluation = evaluate()
                hooks.on_evaluate_end(ctx)
            local["epoch_seconds"] = time.perf_counter() - epoch_start
            local["eval_seconds"] = time.perf_counter() - eval_start
            ctx.metrics = _gather_metrics(backend, local, evaluation)
            # Counted (gradient tensors handed to Horovod), not computed from the plan: what a growing batch saves.
            tensors = backend.wire.snapshot()["tensors"] - tensors
            ctx.metrics["sync_rounds"] = tensors / max(1, backend.grad_tensors)
            ctx.metrics["global_batch"] = float(plan.global_batch_at(epoch))
            # The bar's loss was rank 0's last step; the run logs the epoch's mean over every rank. The line a user
            # reads last says the logged figure, by its logged name.
            bar.update(0, train_loss=ctx.metrics["train_loss"])
            result.history.append({"epoch": epoch, **ctx.metrics})
            # Under epoch/ (step = the epoch): their own section in MLflow's UI, apart from the step/* curves on the
            # optimizer step. Also unprefixed, as before, until 0.4.0: runs compare/list/reproduce, the sweep's table
            # and users' queries read those names.
            tracker.log_metrics({**ctx.metrics, **{EPOCH_PREFIX + k: v for k, v in ctx.metrics.items()}}, step=epoch)
            hooks.on_epoch_end(ctx)
            if ctx.stop_training:
                break
        _finish(ctx, start)
        ctx.status = "FINISHED"
        return result
    except BaseException as exc:
        # Ctrl-C reaches every process of the terminal's group, this rank too: stopped by the user, not failed (the
        # launcher ends the job's run KILLED; this rank's own end must not say FAILED after it).
        ctx.status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        raise
    finally:
        bar.close()
        try:
            hooks.on_train_end(ctx)
        finally:
            tracker.finish(ctx.status)
            # After finish: the tracker writes to a local spool first, and the run id is the store's answer.
            result.run_id = tracker.run_id
            result.warnings = [*hooks.messages, *tracker.messages]


def _finish(ctx: _context.TrainContext, start: float) -> None:
    result, backend = ctx.result, ctx.backend
    result.total_seconds = time.perf_counter() - start
    result.test_accuracy = result.history[-1].get("test_accuracy", float("nan")) if result.history else float("nan")
    # Samples over wall time of the whole run (not a mean of per-epoch rates, which a slow first epoch, e.g.
    # TensorFlow tracing its graphs, would skew either way).
    samples = sum(h["samples_per_second"] * h["epoch_seconds"] for h in result.history)
    result.samples_per_second = samples / max(1e-9, result.total_seconds)
    result.wire = backend.wire.snapshot()
    result.allreduce_rounds = result.wire["tensors"] / max(1, backend.grad_tensors)
    result.param_spread = monitor.rank_spread(backend)
    result.phase_seconds = backend.timer.summary()
    result.plan_state = ctx.plan_state.to_dict()
    final = {"wire_bytes": result.wire["bytes"], "allreduce_rounds": result.allreduce_rounds,
             "total_seconds": result.total_seconds}
    if not math.isnan(result.test_accuracy):
        final["final_test_accuracy"] = result.test_accuracy
    ctx.tracker.log_metrics(final, step=ctx.settings.epochs)


# Moved out of the loop in 0.3.0 (the loop's hooks and what they see, in modules below the loop, so that the callbacks
# import no loop and the loop no callback back). All three are the adapters' public names (hvdsync.torch.FitResult):
# the old names keep importing, warning, until 0.4.0.
def __getattr__(name: str):
    if name in ("Callback", "TrainContext", "FitResult"):
        warnings.warn(f"hvdsync.core.train.loop.{name} is public as hvdsync.torch.{name} and hvdsync.tensorflow.{name}: "
                      f"import {name} from your adapter (the old path goes in 0.4.0)", DeprecationWarning, stacklevel=2)
        return getattr(_hooks if name == "Callback" else _context, name)
    raise AttributeError(f"module 'hvdsync.core.train.loop' has no attribute {name!r}")
