"""A run's headline figures, from its whole-run totals after warm-up: what ``runs compare``, the sweep's parent and
MLflow's first chart section show.

The per-epoch ``samples_per_second`` of one run swings several-fold (TensorFlow traces its graphs in the first epoch, a
shared machine is busy in another), so the last epoch's value, or a mean of per-epoch rates, can point the wrong way
between two runs. The headline throughput here is samples over seconds summed over the epochs after warm-up, the median
and spread over those epochs say how steady it was, and the phase breakdown (compute, communication wait, ...) from
the same steps says *why* one run is faster.

Logged by rank 0's tracker at the end of the run, each once, under :data:`KEY` (``Key/...``): MLflow's UI puts prefixed
sections in alphabetical order before its unprefixed "Model metrics", and an upper-case letter sorts before every
other prefix, so these figures are the first section of a run's charts.
"""
from __future__ import annotations

import statistics
from typing import Iterable

from hvdsync.core.telemetry.profiling import PHASES

KEY = "Key/"
# Epochs left out at the start: the first one pays for graph tracing, allocator growth and cold caches.
WARMUP_EPOCHS = 1
# The figures, in the order ``runs compare`` shows them, with whether a larger value is better.
SHOWN = (("train_loss", False), ("test_accuracy", True), ("samples_per_second", True),
         ("samples_per_second_spread", False), ("step_seconds", False), ("seconds_after_warmup", False),
         *((f"{p}_seconds", False) for p in PHASES), ("comm_share", False))


def kept(epochs: list[dict]) -> list[dict]:
    """The epochs after warm-up (all of them when the run had no more than the warm-up)."""
    return epochs[WARMUP_EPOCHS:] if len(epochs) > WARMUP_EPOCHS else list(epochs)


def run_summary(epochs: list[dict], steps: Iterable[tuple[int, dict]] = ()) -> dict[str, float]:
    """The headline figures of a run, named without :data:`KEY`.

    Args:
        epochs: each epoch's metrics in order (``samples_per_second``, ``epoch_seconds``, ``step_seconds_max_rank``,
            ``train_loss``, ``test_accuracy``; missing ones are left out of the result).
        steps: ``(epoch, metrics)`` for each per-step record (``phase/<phase>_seconds``: per-step means over an
            interval), with the epoch it was logged in.
    """
    out: dict[str, float] = {}
    if not epochs:
        return out
    last = epochs[-1]
    for name in ("train_loss", "test_accuracy"):
        if name in last:
            out[name] = float(last[name])
    after = [e for e in kept(epochs) if e.get("epoch_seconds", 0) > 0 and "samples_per_second" in e]
    if after:
        seconds = sum(e["epoch_seconds"] for e in after)
        samples = sum(e["samples_per_second"] * e["epoch_seconds"] for e in after)
        rates = [e["samples_per_second"] for e in after]
        median = statistics.median(rates)
        out.update(samples_per_second=samples / seconds, samples_per_second_median=median,
                   samples_per_second_spread=(max(rates) - min(rates)) / median if median > 0 else 0.0,
                   seconds_after_warmup=seconds, samples_after_warmup=samples, warmup_epochs=float(
                       len(epochs) - len(after)))
    step_times = [e["step_seconds_max_rank"] for e in kept(epochs) if "step_seconds_max_rank" in e]
    if step_times:
        out["step_seconds"] = statistics.median(step_times)
        out["step_seconds_spread"] = (max(step_times) - min(step_times)) / out["step_seconds"] \
            if out["step_seconds"] > 0 else 0.0
    first = min(WARMUP_EPOCHS, len(epochs) - 1)
    intervals = [m for epoch, m in steps if epoch >= first and all(f"phase/{p}_seconds" in m for p in PHASES)]
    if intervals:
        phases = {p: statistics.fmean(m[f"phase/{p}_seconds"] for m in intervals) for p in PHASES}
        out.update({f"{p}_seconds": v for p, v in phases.items()})
        total = sum(phases.values())
        out["comm_share"] = phases["sync_wait"] / total if total > 0 else 0.0
    return out


class SummaryKeeper:
    """What the tracker keeps of the metrics it logs to make :func:`run_summary` at the end (a few numbers per epoch
    and per gathered interval: no per-rank figures)."""

    EPOCH_KEYS = ("samples_per_second", "epoch_seconds", "step_seconds_max_rank", "train_loss", "test_accuracy")

    def __init__(self) -> None:
        self.epochs: list[dict] = []
        self.steps: list[tuple[int, dict]] = []

    def add(self, metrics: dict[str, float]) -> None:
        if "epoch_seconds" in metrics:
            self.epochs.append({k: float(metrics[k]) for k in self.EPOCH_KEYS if k in metrics})
        phases = {k: float(v) for k, v in metrics.items() if k.startswith("phase/")}
        if phases:
            self.steps.append((len(self.epochs), phases))

    def summary(self) -> dict[str, float]:
        """:func:`run_summary` of what was kept, named with :data:`KEY`."""
        return {KEY + k: v for k, v in run_summary(self.epochs, self.steps).items()}
