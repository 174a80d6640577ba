"""What a run records about its model at the end: a summary always, the model itself when asked.

The summary (``model_summary.txt`` at the artifact root, beside ``training.png``, so MLflow's compare view shows two
runs' summaries side by side) lists every tensor with its shape, dtype and bytes, and the parameter count: cheap, and
what tells two runs' models apart. The model itself (``tracking.log_model``, off by default: see
:class:`~hvdsync.config.TrackingConfig`) is saved in MLflow's model format by the adapter (``mlflow.pytorch`` or
``mlflow.keras``: this module imports neither a framework nor an MLflow flavour) and goes through the run's spool
like every other artifact, under ``model/``: a store that is down when the run ends gets it later, and
``mlflow.pytorch.load_model("runs:/<run id>/model")`` (or ``mlflow.keras``'s) loads it.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

from hvdsync.core.train.callbacks import Callback

SUMMARY_FILE = "model_summary.txt"
MODEL_PATH = "model"


class TensorRow(NamedTuple):
    """One tensor of the model, as the adapter reads it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    trainable: bool


def summary_text(title: str, rows: Iterable[TensorRow]) -> str:
    """The summary: the counts first, then one line per tensor (a buffer or a frozen weight marked ``frozen``)."""
    rows = list(rows)
    trainable = sum(_count(r.shape) for r in rows if r.trainable)
    total = sum(_count(r.shape) for r in rows)
    width = max([len(r.name) for r in rows] + [6])
    lines = [title,
             f"parameters: {trainable:,} trainable of {total:,} in {len(rows)} tensors, "
             f"{sum(r.bytes for r in rows):,} bytes", "",
             f"{'tensor':<{width}}  {'shape':<20} {'dtype':<9} {'bytes':>13}"]
    for r in rows:
        shape = "x".join(str(d) for d in r.shape) or "scalar"
        lines.append(f"{r.name:<{width}}  {shape:<20} {r.dtype:<9} {r.bytes:>13,}" + ("" if r.trainable else "  frozen"))
    return "\n".join(lines) + "\n"


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class ModelRecord(Callback):
    """At the end of training, on rank 0 of a tracked run: the summary, and the saved model when ``save`` is given
    and training finished (a failed run's weights are in its checkpoints, not worth a model).

    Args:
        title: the summary's first line (the model's class).
        rows: returns the model's tensors (called once, at the end: the weights are final).
        save: ``save(folder)`` writes the model there in MLflow's model format; None: the model is not logged.
    """

    def __init__(self, title: str, rows: Callable[[], Iterable[TensorRow]],
                 save: Callable[[Path], None] | None = None) -> None:
        self.title, self.rows, self.save = title, rows, save

    def on_train_end(self, ctx) -> None:
        if ctx.rank != 0 or not ctx.tracker.active:
            return
        with tempfile.TemporaryDirectory() as tmp:
            summary = Path(tmp) / SUMMARY_FILE
            summary.write_text(summary_text(self.title, self.rows()))
            ctx.tracker.log_artifact(summary)
            if self.save is None or ctx.status != "FINISHED":
                return
            folder = Path(tmp) / MODEL_PATH
            # MLflow's warnings here are not the user's business at the end of every run (no signature: the model's
            # inputs are the user's; pickle's caution: said in docs/tracking.md); its errors still show.
            quiet = logging.getLogger("mlflow")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                self.save(folder)
            finally:
                quiet.setLevel(level)
            # The spool takes files: each goes to its place under model/ (MLmodel, the weights, the environment).
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                parent = path.parent.relative_to(folder)
                ctx.tracker.log_artifact(path, str(Path(MODEL_PATH) / parent) if parent.parts else MODEL_PATH)
