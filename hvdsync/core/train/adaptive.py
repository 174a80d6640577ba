"""The shared loop's adaptive parts: straggler-aware shares and the learning rate of a growing batch.

Both are :class:`~hvdsync.core.train.callbacks.Callback` objects that :func:`~hvdsync.core.train.loop.fit_loop` adds
when its settings ask (``LoopSettings.adaptive_shares``, a plan that grows its batch), so they work for every model, loss and step
source of either framework. The maths is in :mod:`hvdsync.core.train.shares` and :func:`hvdsync.core.train._scaling.grown_lr`.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from hvdsync.core.train.callbacks import Callback
from hvdsync.core.telemetry.profiling import PHASES
from hvdsync.core.train._scaling import grown_lr
from hvdsync.core.train.shares import balanced_shares

# Work = the phases whose time grows with the samples a rank reads (reading them; forward and backward). The
# all-reduce wait is left out (there a fast rank idles for a slow one), and so is the optimizer update, which costs
# the same whatever a rank's share: counting it would pull every estimate towards equal shares.
_WORK = [PHASES.index(p) for p in ("data", "compute")]
# A rank's throughput is the median over the steps of this many epochs (the last ones): one epoch's steps are few
# (tens) and on a shared machine a whole epoch can be disturbed, which made the shares swing between epochs
# (0.68 -> 0.45 -> 0.55 measured with rank 1 2x slower). A rank that really changes speed moves the median within
# two epochs.
RATE_EPOCHS = 3
# Only epochs that ran with shares within this distance (largest difference of one rank's share) of the last epoch's
# are pooled. Where ranks share a host, a rank's speed depends on the shares: with equal shares a fast rank waits
# half of each step and the slow one computes alone, with adaptive ones both compute at once (TensorFlow's cost per
# sample rose by 6-10% on average, docs/measurements/shares.md). Rates measured under other shares then pull the
# estimate back towards where it started (measured: 0.75 after the equal first epoch, 0.70 pooled, 0.64 at the end).
SHARE_TOLERANCE = 0.05


def window_rate(window, tolerance: float = SHARE_TOLERANCE) -> float:
    """The median of the per-step rates of the epochs in ``window`` (``(shares, rates)`` pairs, oldest first) that
    ran with shares within ``tolerance`` of the last epoch's; 0.0 when there is no rate.

    Example:
        >>> window_rate([((0.5, 0.5), [10.0, 10.0]), ((0.7, 0.3), [8.0, 7.0]), ((0.72, 0.28), [7.0])])
        7.0
    """
    last = np.asarray(window[-1][0], dtype=np.float64)
    pooled = [r for shares, rates in window if np.max(np.abs(np.asarray(shares) - last)) <= tolerance for r in rates]
    return float(np.median(pooled)) if pooled else 0.0


class AdaptiveShares(Callback):
    """Measures every rank's work per epoch and, with ``adapt``, re-divides the next epoch's global steps by it.

    At each epoch's end every rank all-gathers its throughput (one small all-gather; the phase timers give the
    work: data + compute, the phases that grow with a rank's samples; not the all-reduce wait, in which a fast rank
    idles for a slow one, nor the update, which costs the same whatever the share). The shares for the next epoch
    are :func:`~hvdsync.core.train.shares.balanced_shares` of those numbers, computed alike on every rank, and handed to
    the step source (``set_shares``). The epoch boundary is the re-weighting point because a ``DataLoader`` plans
    its batches when its iterator is made, once per epoch.
    The throughput is the *median* of samples per work second over the steps of the last :data:`RATE_EPOCHS`
    epochs: a step stretched by something else on the machine (a descheduled process, a collector) must not move a
    whole epoch's shares, nor one disturbed epoch the next. Epochs whose shares differ from the last epoch's by more
    than :data:`SHARE_TOLERANCE` are left out: the ranks' speeds were measured in another balance of work.

    It also records, per epoch, each rank's samples, throughput and share (``result.history``; MLflow
    ``rank/<r>/samples``, ``rank/<r>/share``), with ``adapt=False`` too (equal shares, measured for comparison).

    Args:
        adapt: re-divide the steps (``data.shares: adaptive``); False only measures.
    """

    def __init__(self, adapt: bool = True) -> None:
        self.adapt = adapt

    def on_train_begin(self, ctx) -> None:
        self.steps = ctx.steps
        self._window: deque[tuple[tuple[float, ...], list[float]]] = deque(maxlen=RATE_EPOCHS)  # (shares, rates) per epoch
        if self.adapt and not hasattr(self.steps, "set_shares"):
            raise ValueError(f"data.shares: 'adaptive' is not allowed with a step source of type "
                             f"{type(self.steps).__name__}; it needs set_shares(shares) (hvdsync's loaders and "
                             "samplers have it)")

    def on_epoch_begin(self, ctx) -> None:
        self._samples, self._rates, self._last = 0, [], np.asarray(ctx.backend.timer.snapshot())
        self._epoch_start = self._last

    def on_step_end(self, ctx) -> None:
        now = np.asarray(ctx.backend.timer.snapshot())
        work, self._last = float((now - self._last)[_WORK].sum()), now
        n = ctx.last_step.local_count
        self._samples += n
        if n and work > 0:
            self._rates.append(n / work)

    def on_epoch_end(self, ctx) -> None:
        # One second of work at the median rate: balanced_shares divides samples by seconds.
        used = ctx.plan.shares or (1.0 / ctx.size,) * ctx.size
        self._window.append((used, self._rates))
        rate = window_rate(self._window)
        phases = np.asarray(ctx.backend.timer.snapshot()) - self._epoch_start
        gathered = ctx.backend.allgather(np.array([self._samples, rate, 1.0 if rate else 0.0, *phases],
                                                  dtype=np.float64))
        # Each rank's seconds per phase in this epoch: where a share moved time (compute) and where it cannot
        # (the all-reduce, the update); benchmarks/shares.py prints them.
        record = {"rank_samples": gathered[:, 0].astype(int).tolist(), "rank_throughput": gathered[:, 1].tolist(),
                  "shares": list(used),
                  "rank_phase_seconds": [dict(zip(PHASES, row)) for row in gathered[:, 3:].tolist()]}
        if self.adapt:
            shares = balanced_shares(gathered[:, 1], gathered[:, 2], previous=used)
            self.steps.set_shares(shares)
            ctx.plan = ctx.plan.with_shares(shares)
        if ctx.result.history:
            ctx.result.history[-1].update(record)
        ctx.tracker.log_metrics({**{f"rank/{r}/samples": float(n) for r, n in enumerate(gathered[:, 0])},
                                 **{f"rank/{r}/share": s for r, s in enumerate(used)}}, step=ctx.epoch)


class GrowthLearningRate(Callback):
    """Sets the learning rate of each epoch for a growing batch (the plan's ``growth``) by ``rule``
    (:func:`~hvdsync.core.train._scaling.grown_lr` of the batch factor in force), through ``backend.scale_learning_rate``.

    Args:
        rule: how the learning rate follows the batch factor (``train.growth_lr``: ``sqrt``, ...).
    """

    def __init__(self, rule: str = "sqrt") -> None:
        self.rule = rule

    def on_epoch_begin(self, ctx) -> None:
        factor = ctx.plan.batch_size_at(ctx.epoch) / ctx.plan.batch_size
        ctx.backend.scale_learning_rate(grown_lr(1.0, factor, self.rule))
