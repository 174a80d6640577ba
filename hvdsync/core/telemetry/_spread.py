"""Where :class:`StepSpread` is defined: a callback that compares every rank's parameters after every step. Its
public name is the adapters' (``hvdsync.torch.StepSpread``); hvdsync imports it from here, and
:mod:`hvdsync.core.telemetry.monitor` forwards it, warning, until 0.4.0. A private module rather than a renamed
``monitor``: the monitor's own parts (fingerprints, alarms) stay where they are, and do not warn.
"""
from __future__ import annotations

from hvdsync.core.telemetry.monitor import rank_spread
from hvdsync.core.train.callbacks import Callback


class StepSpread(Callback):
    """A callback that checks after every step that every rank holds the same parameters: the ranks all-gather
    their :func:`fingerprint` and :attr:`spreads` keeps the :func:`spread` of each step (0.0: identical). One small
    all-gather a step, on every rank; where a job should only be watched, ``monitor.every`` does it more cheaply.
    Its :meth:`report` is ``step_spread_max``: the largest spread after any step (None before a step).

    Example:
        >>> results = hvdsync.launch.train_many(cfgs, callbacks=[StepSpread()])   # doctest: +SKIP
        >>> assert all(r["step_spread_max"] == 0.0 for r in results)             # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.spreads: list[float] = []

    def on_step_end(self, ctx) -> None:
        self.spreads.append(rank_spread(ctx.backend))

    @property
    def max(self) -> float | None:
        return max(self.spreads) if self.spreads else None

    def report(self) -> dict:
        return {"step_spread_max": self.max}
