"""``hvdsync sweep``: a grid of configs as child runs of one MLflow run.

Every config is built and checked before anything starts; configs that share the framework, the worker count and
Horovod's knobs run in one worker job. Each child is named for its axes first (``compression=fp16 accumulate=4 | torch
x2 ...``) and tagged with the sweep as its job and launcher; the parent run holds the axes as params and, at the end,
each child's key figures and the best child.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import sys
import time

from hvdsync.config import Config, ConfigError
from hvdsync.launch import runs_compare
from hvdsync.launch.runs_checks import store_client as _client
from hvdsync.launch.runs_compare import table as _table


def grid(sweeps: list[str]) -> list[list[str]]:
    """``["sync.compression=none,fp16", "sync.accumulate=1,4"]`` -> the 4 override lists of the grid."""
    axes, keys = [], {}
    for item in sweeps:
        if "=" not in item:
            raise ConfigError(f"--set: {item!r} is not allowed; expected section.field=v1,v2,...")
        key, values = item.split("=", 1)
        if key.strip() in keys:  # the grid would hold both, and the later value would silently win in every run
            raise ConfigError(f"--set: {key.strip()} is swept twice ({keys[key.strip()]!r} and {item!r}); give its "
                              "values once, e.g. --set sync.accumulate=1,2,4")
        keys[key.strip()] = item
        axes.append([f"{key}={v.strip()}" for v in values.split(",")])
    return [list(combo) for combo in itertools.product(*axes)]


def sweep(base: Config, sweeps: list[str], quiet: bool = True) -> dict:
    """Run the grid of ``sweeps`` over ``base`` as child runs of one parent MLflow run.

    Every config is built (and validated) before anything starts. Configs that share the framework, the number of
    workers and Horovod's knobs run in one worker job. Each child is named for its axes first; the parent holds the
    axes as params and, at the end, each child's key metrics and the best child. Returns ``{"parent": id,
    "children": [(overrides, FitResult dict)], "best": {"run_id", "overrides", "test_accuracy"} or {}}``."""
    combos = grid(sweeps)
    base_raw = base.to_dict()
    configs = []
    for combo in combos:
        raw = json.loads(json.dumps(base_raw))
        from hvdsync.config import apply_override

        for item in combo:
            apply_override(raw, item)
        configs.append(Config.from_dict(raw))
    parent = _parent_run(base, sweeps, combos) if base.tracking.enabled else None
    groups: dict[tuple, list[int]] = {}
    for i, cfg in enumerate(configs):
        key = (cfg.train.framework, cfg.train.np, tuple(sorted(cfg.sync.horovod_env().items())))
        groups.setdefault(key, []).append(i)
    results: list[dict | None] = [None] * len(configs)
    try:
        _run_groups(configs, combos, groups, parent, results, quiet)
    except BaseException as exc:
        if parent:  # stopped by the user (KILLED) or a worker failed (FAILED): the parent says so too
            from hvdsync.core.telemetry.jobrun import status_for

            with contextlib.suppress(Exception):
                _client(base.tracking.tracking_uri).set_terminated(parent, status=status_for(exc))
        raise
    best = {}
    if parent:
        client = _client(base.tracking.tracking_uri)
        try:
            best = _summarise(client, parent, combos, results)
        except Exception as exc:  # noqa: BLE001 - the children are recorded; only the parent's summary is missing
            print(f"hvdsync: the sweep's parent run got no summary ({exc})", file=sys.stderr)
        client.set_terminated(parent)
    return {"parent": parent, "children": list(zip(combos, results)), "best": best}


def _run_groups(configs, combos, groups, parent, results, quiet) -> None:
    """Each group of configs that can share workers, in one worker job; results filled in by index."""
    from hvdsync import launch
    from hvdsync.core.telemetry import runlabel
    from hvdsync.launch import worker

    # The sweep's key: every child is tagged with it as its job (hvdsync.core.telemetry.tracking).
    env = {runlabel.SWEEP_ENV: parent} if parent else {}
    for idx in groups.values():
        dicts = [configs[i].replace(tracking={"parent_run_id": parent or "", "run_name": configs[i].tracking.run_name
                                              or runlabel.run_name(runlabel.facts(configs[i].flat()), combos[i])}
                                    ).to_dict() for i in idx]
        launch.preflight(configs[idx[0]])
        ranks = launch.run(worker.fit_many, args=(dicts,), np=configs[idx[0]].train.np, sync=configs[idx[0]].sync,
                           quiet=quiet, env=env)
        for i, res in zip(idx, ranks[0]):
            results[i] = res


def _parent_run(base: Config, sweeps: list[str], combos: list[list[str]]) -> str | None:
    """The sweep's parent run: its axes as params (``sweep.<field>``: the values swept), the base config's facts as
    tags and the grid as the ``hvdsync.sweep`` tag."""
    from hvdsync.core.telemetry import runlabel
    from hvdsync.core.telemetry.spool import experiment_id

    try:
        client = _client(base.tracking.tracking_uri)
        exp_id = experiment_id(client, base.tracking.experiment)
        axes = {f"sweep.{k.strip()}": v.strip() for k, v in (item.split("=", 1) for item in sweeps)}
        # The facts the children share: a swept one differs between them and is the axis, not a tag of the parent.
        facts = {tag: value for tag, value in runlabel.facts(base.flat()).items()
                 if not any(f"sweep.{name}" in axes for name in runlabel.FACTS[tag])}
        name = base.tracking.run_name or "sweep " + " x ".join(k.split(".")[-1] for k in axes)
        run = client.create_run(exp_id, run_name=name, tags={**facts, "hvdsync.launcher": "sweep",
                                                             "hvdsync.sweep": json.dumps(combos)})
        from mlflow.entities import Param

        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in axes.items()])
        return run.info.run_id
    except Exception as exc:  # noqa: BLE001 - a sweep still trains without its parent run
        print(f"hvdsync: no parent run for the sweep ({exc}); the runs are recorded on their own", file=sys.stderr)
        return None


def _summarise(client, parent: str, combos: list[list[str]], results: list[dict | None]) -> dict:
    """The parent's summary: each child's key metric (``child.<n>.test_accuracy``, ``child.<n>.samples_per_second``
    after warm-up, as metrics) and the best child by test accuracy (tags ``hvdsync.best_run`` / ``.best``)."""
    from mlflow.entities import Metric

    now, metrics, best = int(time.time() * 1000), [], None
    for n, (combo, res) in enumerate(zip(combos, results)):
        if not res or not res.get("run_id"):
            continue
        figures = runs_compare.figures(client, client.get_run(res["run_id"]))
        res["figures"] = figures  # the sweep's table shows the same figures as runs compare
        for key in ("test_accuracy", "samples_per_second"):
            if figures.get(key) is not None:
                metrics.append(Metric(f"child.{n}.{key}", float(figures[key]), now, 0))
        acc = figures.get("test_accuracy")
        if acc is not None and (best is None or acc > best[0]):
            best = (acc, res["run_id"], combo, figures.get("samples_per_second"))
    if metrics:
        client.log_batch(parent, metrics=metrics)
    if best is None:
        return {}
    client.log_batch(parent, metrics=[Metric("Key/best_test_accuracy", best[0], now, 0)] + (
        [Metric("Key/best_samples_per_second", best[3], now, 0)] if best[3] is not None else []))
    from mlflow.entities import RunTag

    client.log_batch(parent, tags=[RunTag("hvdsync.best_run", best[1]), RunTag("hvdsync.best", " ".join(best[2]))])
    return {"run_id": best[1], "overrides": best[2], "test_accuracy": best[0]}


def cmd_sweep(ns, base: Config) -> int:
    """``hvdsync sweep``: run the grid, print each child's figures and the best child."""
    out = sweep(base, ns.sweeps, quiet=not ns.verbose)
    rows = [["overrides", "test accuracy", "samples/s", "run id"]]
    for combo, res in out["children"]:
        # The run's whole-run figure after warm-up (as runs compare shows it); without a run, the job's own.
        speed = (res.get("figures") or {}).get("samples_per_second") or res["samples_per_second"]
        rows.append([" ".join(combo), f"{res['test_accuracy']:.4f}", f"{speed:.0f}", res.get("run_id") or "-"])
    print(_table(rows))
    if out.get("best"):
        print(f"best: {' '.join(out['best']['overrides'])} (test accuracy {out['best']['test_accuracy']:.4f}, run "
              f"{out['best']['run_id']})")
    if out["parent"]:
        print(f"parent run {out['parent']}: `hvdsync runs compare RUN_ID RUN_ID ...` or MLflow's compare view")
    return 0
