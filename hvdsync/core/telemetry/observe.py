"""What every rank measures during training, brought to rank 0 and recorded in the job's one MLflow run.

Every ``every`` steps (``monitor.every``) all ranks take part in one small all-gather of a fixed-size row: their loss, step
time, working time, phase times (:mod:`hvdsync.core.telemetry.profiling`), gradient norm, parameter fingerprint
(:mod:`hvdsync.core.telemetry.monitor`) and, from each node's first local rank, that node's system metrics
(:mod:`hvdsync.core.telemetry.sysmetrics`). Rank 0 records

* ``step/loss``, ``step/seconds``, ``step/samples_per_second``, ``step/comm_share`` and ``phase/<phase>_seconds``
  (means over the ranks),
* ``ranks/<figure>_min``, ``_median``, ``_max`` over the ranks of each rank's loss, step, working and phase times
  and comm share, with ``ranks/<time>_slowest_rank`` (the rank's id): a 64-rank run stays readable. Every rank's own
  values are in the ``ranks.csv`` artifact (``step,rank,loss,step_seconds,...``),
* ``monitor/loss_spread``, ``monitor/param_spread``, ``monitor/straggler_ratio``, ``monitor/grad_norm`` and,
  when a check fails, ``alarm/<kind>`` with an ``hvdsync.alarm.<kind>`` tag (:class:`~hvdsync.core.telemetry.monitor.Alarms`),
* ``system/<node>/...`` for every node,

and, as artifacts, the config (``hvdsync/config.yaml``), the reproducibility record (``hvdsync/record.json``,
:mod:`hvdsync.core.telemetry.record`), Horovod's timeline with its per-tensor chart when enabled, and a plot of the run.
An all-gather every N steps is the whole cost on the other ranks: they never talk to MLflow.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hvdsync.core.telemetry import placement, profiling, record, sysmetrics
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.telemetry.monitor import Alarms, fingerprint
from hvdsync.core.telemetry.profiling import PHASES

# The head of each gathered row; the system-metrics payload follows it.
ROW = ("loss", "samples", "step_seconds", "work_seconds", *(f"{p}_seconds" for p in PHASES), "grad_norm",
       "fp0", "fp1", "fp2")
# Each rank's own figures: summarised in the run as ranks/<figure>_min|_median|_max (and, for times, the slowest
# rank's id), every rank's value in the ranks.csv artifact.
RANK_FIGURES = ("loss", "step_seconds", "work_seconds", *(f"{p}_seconds" for p in PHASES), "comm_share")
RANKS_FILE = "ranks.csv"


def rank_spread(per_rank: dict[str, list[float]]) -> dict[str, float]:
    """``ranks/<figure>_min``, ``_median``, ``_max`` of each figure over the ranks, and ``ranks/<figure>_slowest_rank``
    (the rank with the largest value) for the times (``*_seconds``)."""
    out = {}
    for key, values in per_rank.items():
        v = np.asarray(values, dtype=np.float64)
        out.update({f"ranks/{key}_min": float(v.min()), f"ranks/{key}_median": float(np.median(v)),
                    f"ranks/{key}_max": float(v.max())})
        if key.endswith("_seconds"):
            out[f"ranks/{key}_slowest_rank"] = float(v.argmax())
    return out


def ranks_csv(history: list[dict], path: str | Path) -> Path:
    """Every rank's figures at every recorded step (``step,rank,<figure>...``) from the observer's history."""
    import csv

    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "rank", *RANK_FIGURES])
        for h in history:
            ranks = sorted({int(k.split("/")[1]) for k in h if k.startswith("rank/")})
            for r in ranks:
                out.writerow([h["step"], r, *(repr(h[f"rank/{r}/{k}"]) for k in RANK_FIGURES)])
    return Path(path)


@dataclass(frozen=True)
class ObserverSettings:
    """What the :class:`Observer` needs to know, as plain values; the layer above takes them from a config
    (:func:`hvdsync.fitting.observer_settings`).

    Attributes:
        every: steps between two all-gathers of the per-rank figures (``monitor.every``); 0: none.
        straggler_ratio, divergence_tolerance: the monitor's alarms (:class:`~hvdsync.core.telemetry.monitor.Alarms`).
        lockstep: the ranks hold equal parameters after every step (all-reduce); False for local SGD and gossip,
            which let them differ between averagings by design: no divergence alarm then.
        tracking: the job records a run (``tracking.enabled``): only then are hosts named and nodes sampled.
        system_metrics: sample each node's system metrics (``tracking.system_metrics``).
        config: the run's config as a dict (the artifact ``hvdsync/config.yaml`` and the record's ``config``).
        seed, deterministic: what the reproducibility record states (:func:`~hvdsync.core.telemetry.record.build_record`).
    """

    every: int = 10
    straggler_ratio: float = 3.0
    divergence_tolerance: float = 0.0
    lockstep: bool = True
    tracking: bool = False
    system_metrics: bool = True
    config: dict = field(default_factory=dict)
    seed: int = 0
    deterministic: bool = False


class Observer(Callback):
    """Per-step figures, checks and artifacts of one rank (rank 0 records them); the loop's first callback.

    Args:
        settings: its :class:`ObserverSettings` (None: their defaults).

    Reads from the :class:`~hvdsync.core.train._context.TrainContext`: ``tracker`` and ``backend`` (``rank``, ``size``,
    ``framework``, ``timer``, ``allgather``, ``parameters``; ``grad_norm()`` where the adapter has it).
    """

    def __init__(self, settings: ObserverSettings | None = None) -> None:
        self.settings = settings if settings is not None else ObserverSettings()
        self.step = 0
        self.messages: list[str] = []  # the alarms' warning lines
        self.history: list[dict] = []  # rank 0: what was recorded, for the end-of-run plot
        self.sampler = None

    # ---- the loop's hooks -----------------------------------------------------------------------------------
    def on_train_begin(self, ctx) -> None:
        s = self.settings
        self.backend, self.tracker = ctx.backend, ctx.tracker
        self.every = s.every
        self.alarms = Alarms(self.tracker, s.straggler_ratio, s.divergence_tolerance, check_divergence=s.lockstep)
        self.messages = self.alarms.messages
        # Samples only go to the job's run: without tracking, no sampler (it would import MLflow's monitors, ~2 s of
        # CPU on each node's first rank, and wake every second for figures nobody records).
        sampling = s.tracking and s.system_metrics and self.every > 0 and sysmetrics.samples_here()
        self.sampler = sysmetrics.NodeSampler() if sampling else None
        self.node = sysmetrics.node_id()
        b = self.backend
        # Every rank names its host (a collective: the condition is the settings', the same on every rank).
        hosts = [sysmetrics.row_text(r) for r in b.allgather(sysmetrics.text_row(placement.host_name(),
                                                                                 placement.HOST_BYTES))] \
            if s.tracking else []
        if b.rank == 0 and self.tracker.active:
            rec = record.build_record(s.config, b.framework, b.size, s.seed, s.deterministic)
            self.tracker.log_params({**record.record_params(rec), **placement.placement_params(hosts),
                                     **placement.slurm_params()})
            with tempfile.TemporaryDirectory() as tmp:
                for name, text in (("record.json", json.dumps(rec, indent=2)), ("config.yaml", _yaml(s.config))):
                    (Path(tmp) / name).write_text(text)
                    self.tracker.log_artifact(Path(tmp) / name, "hvdsync")
        self._reset()

    def on_step_end(self, ctx) -> None:
        """After each optimizer step: this rank's mean loss over its samples of the step."""
        samples = ctx.last_step.local_count if ctx.last_step is not None else 0
        self.step += 1
        self._loss += ctx.metrics.get("loss", 0.0) * samples
        self._samples += samples
        self._steps += 1
        if self.every and self.step % self.every == 0:
            self._gather()

    def on_train_end(self, ctx) -> None:
        """Final fingerprint (as metrics: a rerun can be compared bitwise), timeline and plots. No collective here:
        it also runs when training failed, when the other ranks may be gone."""
        if self.sampler is not None:
            self.sampler.close()
        if not hasattr(self, "backend") or self.backend.rank != 0 or not self.tracker.active:
            return
        fp = fingerprint(self.backend.parameters())
        self.tracker.log_metrics({f"final/param_fingerprint_{i}": float(v) for i, v in enumerate(fp)}, step=self.step)
        self._artifacts()

    # ---- the gathering ----------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._mark = time.perf_counter()
        self._phases = self.backend.timer.snapshot()
        self._loss, self._samples, self._steps = 0.0, 0, 0

    def _row(self) -> np.ndarray:
        n = max(1, self._steps)
        wall = (time.perf_counter() - self._mark) / n
        phases = [(a - b) / n for a, b in zip(self.backend.timer.snapshot(), self._phases)]
        sync = phases[PHASES.index("sync_wait")]
        grad_norm = getattr(self.backend, "grad_norm", None)
        head = [self._loss / max(1, self._samples), self._samples, wall, wall - sync, *phases,
                float(grad_norm()) if grad_norm else math.nan, *fingerprint(self.backend.parameters())]
        system = sysmetrics.encode(self.sampler.take(), self.node) if self.sampler is not None else \
            sysmetrics.encode(None)
        return np.concatenate([np.asarray(head, dtype=np.float64), system])

    def _gather(self) -> None:
        g = self.backend.allgather(self._row())
        if self.backend.rank == 0:
            self._record(g)
        self._reset()  # after the all-gather: its own wait is not charged to the next interval's steps

    def _record(self, g: np.ndarray) -> None:
        col = {name: g[:, i] for i, name in enumerate(ROW)}
        size = len(g)
        step_seconds = float(col["step_seconds"].max())
        metrics = {
            "step/loss": float((col["loss"] * col["samples"]).sum() / max(1.0, col["samples"].sum())),
            "step/seconds": step_seconds,
            "step/samples_per_second": float(col["samples"].sum() / max(1e-9, step_seconds * self._steps)),
            "monitor/loss_spread": float(col["loss"].max() - col["loss"].min()),
        }
        phase_means = {p: float(col[f"{p}_seconds"].mean()) for p in PHASES}
        metrics.update({f"phase/{p}_seconds": v for p, v in phase_means.items()})
        metrics["step/comm_share"] = profiling.comm_share(phase_means)
        if not math.isnan(col["grad_norm"][0]):
            metrics["monitor/grad_norm"] = float(col["grad_norm"][0])
        # Every rank's own figures stay here (the plot, ranks.csv at the end); the run gets their spread: a key per
        # rank and figure would be hundreds of charts and columns at 64 ranks.
        per_rank = {k: [float(col[k][r]) for r in range(size)] for k in RANK_FIGURES if k != "comm_share"}
        per_rank["comm_share"] = [profiling.comm_share({p: per_rank[f"{p}_seconds"][r] for p in PHASES})
                                  for r in range(size)]
        metrics.update(rank_spread(per_rank))
        metrics.update(self.alarms.check(self.step, g[:, ROW.index("fp0"):ROW.index("fp2") + 1], col["work_seconds"]))
        for row in g[:, len(ROW):]:
            metrics.update(sysmetrics.decode(row))
        self.tracker.log_metrics(metrics, step=self.step)
        self.history.append({"step": self.step, **metrics,
                             **{f"rank/{r}/{k}": v[r] for k, v in per_rank.items() for r in range(size)}})

    # ---- artifacts at the end -------------------------------------------------------------------------------
    def _artifacts(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            timeline = os.environ.get("HOROVOD_TIMELINE")
            if timeline and Path(timeline).is_file():
                self.tracker.log_artifact(timeline, "horovod")
                parts = profiling.parse_timeline(timeline)
                if parts:
                    (Path(tmp) / "timeline_tensors.json").write_text(json.dumps(parts, indent=2))
                    self.tracker.log_artifact(Path(tmp) / "timeline_tensors.json", "horovod")
                    chart = profiling.timeline_chart(parts, Path(tmp) / "timeline.png")
                    # At the root too: MLflow's compare view shows only artifacts at the same path in every run.
                    self.tracker.log_artifact(chart, "horovod")
                    self.tracker.log_artifact(chart)
            if self.history:
                self.tracker.log_artifact(plot_history(self.history, Path(tmp) / "training.png"))
                self.tracker.log_artifact(ranks_csv(self.history, Path(tmp) / RANKS_FILE))


def plot_history(history: list[dict], path: str | Path) -> Path:
    """Loss per step, each rank's phase times and the step's comm-wait share, as one PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    ranks = sorted({int(k.split("/")[1]) for h in history for k in h if k.startswith("rank/")})
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for r in ranks:
        axes[0].plot(steps, [h[f"rank/{r}/loss"] for h in history], label=f"rank {r}")
    axes[0].set(title="loss per rank", xlabel="step")
    last = history[-1]
    bottom = np.zeros(len(ranks))
    for p in PHASES:
        ms = np.array([1e3 * last[f"rank/{r}/{p}_seconds"] for r in ranks])
        axes[1].bar([str(r) for r in ranks], ms, bottom=bottom, label=p)
        bottom += ms
    axes[1].set(title=f"ms per step by phase (step {last['step']})", xlabel="rank")
    axes[2].plot(steps, [h["step/comm_share"] for h in history])
    axes[2].set(title="share of the step waiting on communication", xlabel="step", ylim=(0, 1))
    for ax in axes[:2]:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def prepare_timeline(enabled: bool, spool_dir: str | None = None) -> str | None:
    """When ``enabled`` (``tracking.timeline``), point ``HOROVOD_TIMELINE`` (read by ``hvd.init``: call this before
    it) at a file in ``timelines/`` of the spool folder (``spool_dir``, default
    :func:`~hvdsync.core.telemetry.spool.default_spool_dir`), unless the user set it; returns the timeline's path, if
    any. Only the coordinator (rank 0) writes it; the run records a copy and its per-tensor chart."""
    if enabled and not os.environ.get("HOROVOD_TIMELINE"):
        from hvdsync.core.telemetry.spool import default_spool_dir

        folder = Path(spool_dir or default_spool_dir()) / "timelines"
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["HOROVOD_TIMELINE"] = str(folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json")
    return os.environ.get("HOROVOD_TIMELINE")
