"""Cross-rank checks: are all ranks still training the same model, and is one of them holding the others back?

* A parameter fingerprint is a few float64 numbers per rank (sum, sum of squares, a position-weighted sum over every
  parameter). Under synchronous training every rank applies the same averaged gradient to the same parameters, so
  the fingerprints are bitwise equal; any difference means a rank diverged (a missed broadcast, a codec bug, a
  rank that skipped an update, memory corruption).
* A straggler is a rank whose *working* time per step (its step time minus its wait in the all-reduce) is far above
  the others'. Plain step time cannot show it: in lock-step training every rank's step takes as long as the
  slowest one's, the fast ranks just spend the difference waiting in the all-reduce.
* The loss spread (largest minus smallest per-rank loss) and the gradient norm are recorded as they are.

:mod:`hvdsync.core.telemetry.observe` gathers the figures every ``monitor.every`` steps; :class:`Alarms` turns the checks into
an MLflow tag and metric and one warning line naming the rank.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from hvdsync.core._moved import to_adapters


# Checks whose working times are summed for the straggler ratio.
WINDOW = 5


class MonitorWarning(UserWarning):
    """A rank diverged or straggles."""


def fingerprint(params: Iterable[np.ndarray]) -> np.ndarray:
    """``[sum, sum of squares, position-weighted sum]`` over all parameters, in float64."""
    total = np.zeros(3, dtype=np.float64)
    offset = 0
    for p in params:
        flat = np.asarray(p, dtype=np.float64).ravel()
        weights = np.arange(offset + 1, offset + flat.size + 1, dtype=np.float64) / 1e6
        total += (flat.sum(), np.square(flat).sum(), (flat * weights).sum())
        offset += flat.size
    return total


def spread(gathered: np.ndarray) -> float:
    """Largest difference between any two ranks' rows of an all-gathered ``(world_size, ...)`` array."""
    gathered = np.asarray(gathered, dtype=np.float64)
    return float(np.max(gathered.max(axis=0) - gathered.min(axis=0))) if gathered.size else 0.0


def rank_spread(backend) -> float:
    """How far apart the ranks' parameters are now: every rank's :func:`fingerprint`, all-gathered by ``backend``
    (a collective: every rank calls it at the same point), then their :func:`spread`."""
    return spread(backend.allgather(fingerprint(backend.parameters())))


def diverged_ranks(fingerprints: np.ndarray, tolerance: float = 0.0) -> list[int]:
    """Ranks whose fingerprint differs from rank 0's (rank 0's state is what every rank started from) by more
    than ``tolerance``."""
    fp = np.asarray(fingerprints, dtype=np.float64)
    return [r for r in range(1, len(fp)) if float(np.max(np.abs(fp[r] - fp[0]))) > tolerance]


def straggler(work_seconds: Iterable[float]) -> tuple[int, float]:
    """The slowest rank and how many times the median of the *other* ranks' working time it took.

    The median of the others (not of all) so that 2 workers work too: with one rank 10x slower, the median of
    both would be half the slow one's time and the ratio could never exceed 2.
    """
    work = np.asarray(list(work_seconds), dtype=np.float64)
    if len(work) < 2:
        return 0, 1.0
    slow = int(np.argmax(work))
    others = float(np.median(np.delete(work, slow)))
    return slow, float(work[slow] / others) if others > 0 else float("inf")


@dataclass
class Alarms:
    """Raises each kind of alarm once per run: an MLflow tag and metric, and one warning naming the rank.

    Args:
        tracker: where the tag and metric go (the no-op tracker on ranks other than 0).
        straggler_ratio: the :func:`straggler` ratio beyond which the slowest rank is a straggler.
        divergence_tolerance: see :func:`diverged_ranks`.
        check_divergence: False where ranks differ by design between synchronisations (``sync.mode`` local SGD,
            gossip); the spread is still recorded.
    """

    tracker: object
    straggler_ratio: float = 3.0
    divergence_tolerance: float = 0.0
    check_divergence: bool = True

    def __post_init__(self) -> None:
        self.raised: dict[str, dict] = {}
        self.messages: list[str] = []
        self._checks = 0
        self._slow: tuple[int, int] = (-1, 0)  # (rank, consecutive checks over the threshold)
        self._window: list[np.ndarray] = []    # working time per rank of the last WINDOW checks

    def check(self, step: int, fingerprints: np.ndarray, work_seconds: Iterable[float]) -> dict[str, float]:
        """Run both checks on one gathering; returns the monitor metrics to record (alarms included).

        A divergence is an alarm at once (the parameters must be bitwise equal at every step). A straggler is
        judged on the working time summed over the last :data:`WINDOW` checks (a full window, the first check of
        the run left out) and must be the same rank over the threshold in two checks in a row, so the earliest
        straggler alarm comes at check ``WINDOW + 2``: the first steps carry one-off costs (lazy initialisation,
        rank 0 starting the run record and its sender), and on a shared machine a rank descheduled for a moment is
        not a straggler."""
        self._checks += 1
        bad = diverged_ranks(fingerprints, self.divergence_tolerance) if self.check_divergence else []
        if self._checks > 1:
            work = np.asarray(list(work_seconds), dtype=np.float64)
            if self._window and len(self._window[-1]) != len(work):
                self._window = []  # the world size changed (elastic): start the window again
            self._window = [*self._window[-(WINDOW - 1):], work]
        slow, ratio = straggler(np.sum(self._window, axis=0)) if self._window else (0, 1.0)
        metrics = {"monitor/param_spread": spread(fingerprints), "monitor/straggler_ratio": ratio}
        over = ratio > self.straggler_ratio and len(self._window) == WINDOW
        self._slow = (slow, self._slow[1] + 1 if self._slow[0] == slow else 1) if over else (-1, 0)
        if bad:
            metrics["alarm/divergence"] = 1.0
            self._raise("divergence", step, bad[0],
                        f"rank {bad[0]}'s parameters differ from rank 0's at step {step} (fingerprint spread "
                        f"{metrics['monitor/param_spread']:.3g}); the ranks no longer train the same model")
        if self._slow[1] >= 2:
            metrics["alarm/straggler"] = 1.0
            self._raise("straggler", step, slow,
                        f"rank {slow} is a straggler at step {step}: it works {ratio:.1f}x as long per step as the "
                        f"median of the other ranks (threshold {self.straggler_ratio:g}); the others wait for it")
        return metrics

    def _raise(self, kind: str, step: int, rank: int, message: str) -> None:
        if kind in self.raised:
            return
        self.raised[kind] = {"step": step, "rank": rank, "message": message}
        self.messages.append(message)
        self.tracker.set_tags({f"hvdsync.alarm.{kind}": message, f"hvdsync.alarm.{kind}.rank": rank})
        warn_line(message, MonitorWarning)


def warn_line(message: str, category: type[Warning]) -> None:
    """One warning line, ``hvdsync:0: <Category>: <message>`` (no source line under it: it would be noise)."""
    warnings.warn_explicit(message, category, filename="hvdsync", lineno=0, module="hvdsync", registry={})


# StepSpread is the adapters' public name; its definition lives in the private _spread (which hvdsync imports), so this
# path warns for it, naming the adapter, until 0.4.0. Everything else here is the core's own and does not warn.
__getattr__ = to_adapters(__name__, {"StepSpread": "hvdsync.core.telemetry._spread"}, until="0.4.0")
