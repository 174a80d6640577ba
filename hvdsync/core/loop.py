"""The training loop both frameworks share.

An adapter hands the loop a :class:`Backend` (its model, optimizer and Horovod calls behind five methods); the
loop owns everything that is the same in PyTorch and TensorFlow: the shard plan, the loss scale, epochs, metrics
gathered across ranks, the MLflow run record, progress on rank 0 and the cross-rank parameter check.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

import numpy as np

from hvdsync.core import monitor
from hvdsync.core.codecs import WireCounter
from hvdsync.core.data import Dataset
from hvdsync.core.profiling import PhaseTimer
from hvdsync.core.progress import Progress
from hvdsync.core.scaling import loss_scale
from hvdsync.core.sharding import ShardPlan
from hvdsync.core.tracking import Tracker, make_tracker


class Backend(Protocol):
    """What an adapter implements for the loop (see ``hvdsync/torch/train.py`` and ``hvdsync/tensorflow/train.py``)."""

    rank: int
    size: int
    framework: str
    wire: WireCounter
    timer: PhaseTimer

    def train_step(self, micro: list[tuple[np.ndarray, np.ndarray]], scale: float) -> float:
        """One optimizer step over ``micro`` batches; each summed loss is multiplied by ``scale`` before backward.
        Returns the unscaled sum of per-sample losses over this rank's samples."""

    def count_correct(self, x: np.ndarray, y: np.ndarray) -> int:
        """Correct predictions on ``x``."""

    def allgather(self, values: np.ndarray) -> np.ndarray:
        """All ranks' ``values`` stacked: shape ``(size, *values.shape)``."""

    def parameters(self) -> list[np.ndarray]:
        """The model's parameters as numpy arrays."""

    @property
    def grad_tensors(self) -> int:
        """Gradient tensors per all-reduce round (to turn counted tensors into rounds)."""


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

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (f"{self.framework} x{self.world_size}: test accuracy {self.test_accuracy:.4f} after {self.epochs} "
                f"epochs in {self.total_seconds:.1f}s ({self.samples_per_second:.0f} samples/s), "
                f"{self.wire.get('bytes', 0) / 1e6:.2f} MB handed to allreduce per rank "
                f"({', '.join(self.wire.get('dtypes', [])) or 'none'}), params equal across ranks: "
                f"{self.param_spread == 0.0}" + (f", MLflow run {self.run_id}" if self.run_id else ""))


def _evaluate(backend: Backend, data: Dataset) -> tuple[int, int]:
    # Each rank scores its own slice of the test set; the counts are summed across ranks by the caller.
    x, y = data.x_test[backend.rank::backend.size], data.y_test[backend.rank::backend.size]
    return (backend.count_correct(x, y) if len(x) else 0), len(x)


def fit_loop(cfg, backend: Backend, data: Dataset, tracker: Tracker | None = None,
             before_step: Callable[[int, int], None] | None = None, progress_desc: str | None = None) -> FitResult:
    """Train ``backend`` on ``data`` as ``cfg`` says; returns this rank's :class:`FitResult`.

    Args:
        cfg: a :class:`hvdsync.config.Config`.
        backend: the adapter's backend (model, optimizer, Horovod calls).
        data: the dataset (the same arrays on every rank; the plan decides what each rank reads).
        tracker: defaults to MLflow on rank 0 when ``cfg.tracking.enabled``.
        before_step: called as ``before_step(epoch, step)`` on every rank before each step (teaching hooks,
            e.g. an artificially slow rank in notebook 01).
    """
    rank, size = backend.rank, backend.size
    plan = ShardPlan(len(data.x_train), size, cfg.data.batch_size, cfg.sync.accumulate, cfg.train.seed,
                     cfg.data.shuffle)
    tracker = tracker if tracker is not None else make_tracker(cfg.tracking, rank)
    tracker.start(params={**cfg.flat(), "world_size": size}, tags={"framework": backend.framework})
    bar = Progress(cfg.train.epochs * plan.steps_per_epoch(), rank,
                   desc=progress_desc or f"{backend.framework} x{size}")
    result = FitResult(backend.framework, size, rank, cfg.train.epochs, 0.0)
    start = time.perf_counter()
    try:
        for epoch in range(cfg.train.epochs):
            epoch_start = time.perf_counter()
            loss_sum, seen, step_times = 0.0, 0, []
            for i, step in enumerate(plan.epoch(epoch, rank)):
                if before_step is not None:
                    before_step(epoch, i)
                t = time.perf_counter()
                with backend.timer.phase("data"):
                    micro = [(data.x_train[idx], data.y_train[idx]) for idx in step.micro]
                scale = loss_scale(step.global_count, size, cfg.sync.op)
                step_loss = backend.train_step(micro, scale)
                loss_sum += step_loss
                seen += step.local_count
                result.optimizer_steps += 1
                result.backward_passes += len(step.micro)
                step_times.append(time.perf_counter() - t)
                bar.update(1, loss=step_loss / max(1, step.local_count))
            correct, n_test = _evaluate(backend, data)
            epoch_seconds = time.perf_counter() - epoch_start
            g = backend.allgather(np.array([loss_sum, seen, correct, n_test, float(np.mean(step_times)),
                                            epoch_seconds], dtype=np.float64))
            metrics = {
                "train_loss": g[:, 0].sum() / max(1.0, g[:, 1].sum()),
                "test_accuracy": g[:, 2].sum() / max(1.0, g[:, 3].sum()),
                "epoch_seconds": g[:, 5].max(),
                "samples_per_second": g[:, 1].sum() / max(1e-9, g[:, 5].max()),
                "step_seconds_max_rank": g[:, 4].max(),
                "step_seconds_min_rank": g[:, 4].min(),
            }
            result.history.append({"epoch": epoch, **{k: float(v) for k, v in metrics.items()}})
            tracker.log_metrics(metrics, step=epoch)
        result.total_seconds = time.perf_counter() - start
        result.test_accuracy = result.history[-1]["test_accuracy"]
        # Samples over wall time of the whole run (not a mean of per-epoch rates, which a slow first epoch, e.g.
        # TensorFlow tracing its graphs, would skew either way).
        samples = sum(h["samples_per_second"] * h["epoch_seconds"] for h in result.history)
        result.samples_per_second = samples / max(1e-9, result.total_seconds)
        result.wire = backend.wire.snapshot()
        result.allreduce_rounds = result.wire["tensors"] / max(1, backend.grad_tensors)
        result.param_spread = monitor.spread(backend.allgather(monitor.fingerprint(backend.parameters())))
        result.phase_seconds = backend.timer.summary()
        tracker.log_metrics({"final_test_accuracy": result.test_accuracy, "wire_bytes": result.wire["bytes"],
                             "allreduce_rounds": result.allreduce_rounds, "total_seconds": result.total_seconds},
                            step=cfg.train.epochs)
        tracker.finish("FINISHED")
        result.run_id = tracker.run_id
        return result
    except BaseException:
        tracker.finish("FAILED")
        raise
    finally:
        bar.close()


def fit_with(init: Callable, build: Callable, cfg=None, data: Dataset | None = None,
             before_step: Callable[[int, int], None] | None = None) -> FitResult:
    """What every adapter's ``fit`` does: ``init(cfg)`` the worker, load ``data`` (default: the dataset ``cfg.data``
    names), ``build(cfg, data)`` its backend and run :func:`fit_loop`. ``cfg`` defaults to ``Config()``."""
    from hvdsync.config import Config  # here, not at the top: hvdsync.config imports the core
    from hvdsync.core.data import load

    cfg = cfg or Config()
    init(cfg)
    data = data if data is not None else load(cfg.data, cfg.train.seed)
    return fit_loop(cfg, build(cfg, data), data, before_step=before_step)
