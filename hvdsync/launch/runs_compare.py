"""``hvdsync runs compare``: the params that differ between runs, their headline figures side by side with ratios, and
their curves.

The figures are each run's whole-run totals after warm-up (:mod:`hvdsync.core.telemetry.runsummary`, logged as
``Key/...`` at the end of the run): samples/s over the epochs after the first, with the median and spread over those
epochs, the step time, and beside them the phase breakdown (data, compute, communication wait, update) and the
communication share, so that the table says which run is faster and why. A run recorded before these figures existed
gets them computed here from its metric history, the same way.
"""
from __future__ import annotations

from pathlib import Path

from hvdsync.config import ConfigError
from hvdsync.core.telemetry.runsummary import KEY, SHOWN, SummaryKeeper

# Params that name or place a run rather than configure its training: never listed as a difference.
NOT_SETTINGS = ("tracking.run_name", "tracking.parent_run_id", "tracking.spool_dir", "tracking.flush_seconds")
# The figures shown, each with whether a larger value is better, plus what else a run's totals say.
FIGURES = (*SHOWN, ("wire_bytes", False), ("total_seconds", False))
# The curves ``compare`` plots: (per-step metric, per-epoch metric, title), the per-step one when the run has it.
CURVES = (("step/loss", "train_loss", "loss"), ("test_accuracy", "test_accuracy", "test accuracy"),
          ("step/samples_per_second", "samples_per_second", "samples/s"))


def figures(client, run) -> dict[str, float | None]:
    """The run's :data:`FIGURES`: its ``Key/`` metrics, or (a run without them) the same computed from its history."""
    m = run.data.metrics
    if not any(k.startswith(KEY) for k in m):
        keeper = SummaryKeeper()
        rows: dict[int, dict] = {}
        for key in SummaryKeeper.EPOCH_KEYS:
            for point in client.get_metric_history(run.info.run_id, key) if key in m else []:
                rows.setdefault(point.step, {})[key] = point.value
        for step in sorted(rows):
            keeper.add({"epoch_seconds": 0.0, **rows[step]})
        m = {**m, **keeper.summary()}
    return {name: m.get(KEY + name, m.get(name)) for name, _better in FIGURES}


def compare(client, run_ids: list[str], baseline: str | None = None, out: str | Path | None = None) -> dict:
    """The params that differ between ``run_ids``, their :data:`FIGURES` with ratios to ``baseline`` (default: the
    first run), the fastest run, and a PNG of their curves at ``out`` (loss, accuracy, samples/s, one line per run).

    Only params that every run has can differ (a param one run lacks is no setting of it).

    Returns ``{"differing": {param: [value per run]}, "metrics": {run_id: {figure: value}},
    "ratios": {run_id: {figure: ratio}}, "baseline": id, "fastest": id, "png": path}``.
    """
    runs = [client.get_run(r) for r in run_ids]
    baseline = baseline or run_ids[0]
    if baseline not in run_ids:
        raise ConfigError(f"--baseline: {baseline!r} is not one of the compared runs")
    # Params every run has: a sweep's parent (its axes only) against a child is not 80 differences of "None".
    keys = sorted(set.intersection(*(set(r.data.params) for r in runs)))
    differing = {k: [r.data.params.get(k) for r in runs] for k in keys
                 if k not in NOT_SETTINGS and len({r.data.params.get(k) for r in runs}) > 1}
    metrics = {r.info.run_id: figures(client, r) for r in runs}
    base = metrics[baseline]
    ratios = {rid: {k: (v / base[k] if v is not None and base.get(k) else None) for k, v in m.items()}
              for rid, m in metrics.items()}
    speeds = {rid: m["samples_per_second"] for rid, m in metrics.items() if m["samples_per_second"]}
    report = {"differing": differing, "metrics": metrics, "ratios": ratios, "baseline": baseline,
              "fastest": max(speeds, key=speeds.get) if speeds else None, "png": None}
    if out:
        report["png"] = str(plot_curves(client, runs, differing, Path(out)))
    return report


def table(rows: list[list[str]]) -> str:
    """``rows`` as left-aligned columns (the first row the header)."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def table_rows(report: dict, run_ids: list[str]) -> list[list[str]]:
    """The figures table: one row per figure, ``value (ratio)`` per run."""
    rows = [["figure (after warm-up)", *(r[:8] for r in run_ids)]]
    for name, _better in FIGURES:
        values = [report["metrics"][r][name] for r in run_ids]
        if all(v is None for v in values):
            continue
        rows.append([name, *(f"{fmt(report['metrics'][r][name])} ({fmt(report['ratios'][r][name])})"
                             for r in run_ids)])
    return rows


def label(run, differing: dict) -> str:
    return ", ".join(f"{k}={run.data.params.get(k)}" for k in differing) or run.info.run_name or run.info.run_id[:8]


def plot_curves(client, runs, differing: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 3.5))
    for ax, (step_key, epoch_key, title) in zip(axes, CURVES):
        for run in runs:
            key = step_key if step_key in run.data.metrics else epoch_key
            history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
            ax.plot([m.step for m in history], [m.value for m in history], marker=".", label=label(run, differing))
        ax.set(title=title, xlabel="step" if step_key.startswith("step/") else "step or epoch")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
