"""``hvdsync runs list|compare|push|ui|reproduce`` and ``hvdsync sweep``: working with the recorded runs.

    hvdsync runs list [--experiment NAME]                       # newest first: params that matter, final metrics
    hvdsync runs compare [RUN_ID RUN_ID ...] [--baseline ID] [--out compare.png]   # default: the newest two
    hvdsync runs push SPOOL_OR_FOLDER ...                       # send what a dead store did not get
    hvdsync runs ui [--port 5000]                               # MLflow's UI on 127.0.0.1 for the store
    hvdsync runs reproduce RUN_ID                               # rerun from its record, compare the final metrics
    hvdsync sweep --set sync.compression=none,fp16 --set sync.accumulate=1,4 [train options]

Every command reads the store from ``--tracking-uri`` (default: ``MLFLOW_TRACKING_URI``, else MLflow's default).
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvdsync.config import Config, ConfigError
from hvdsync.core.telemetry.tracking import FINAL_METRICS, resolve_uri
from hvdsync.launch import runs_compare
from hvdsync.launch.options import train_options
from hvdsync.launch.runs_checks import (spool_target, stop_group, store_error, check_port, check_store,
                                        wait_until_up)

# The final figures ``runs list`` shows (the first three) and ``--json`` callers read.
SHOWN_METRICS = ("final_test_accuracy", "train_loss", "Key/samples_per_second", "total_seconds", "wire_bytes")


def _client(uri: str, must_exist: bool = False):
    import mlflow

    uri = resolve_uri(uri)
    check_store(uri, must_exist)
    return mlflow.MlflowClient(tracking_uri=uri)


def _experiment_ids(client, name: str | None) -> list[str]:
    if name:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise ConfigError(f"--experiment: {name!r} does not exist in this store")
        return [exp.experiment_id]
    return [e.experiment_id for e in client.search_experiments()]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


# ---- list -------------------------------------------------------------------------------------------------------
def list_runs(uri: str = "", experiment: str | None = None, limit: int = 20) -> list:
    """The newest ``limit`` runs (``mlflow.entities.Run``) of ``experiment`` (all experiments if None)."""
    client = _client(uri)
    return client.search_runs(_experiment_ids(client, experiment), order_by=["attributes.start_time DESC"],
                              max_results=limit)


def _cmd_list(ns) -> int:
    from hvdsync.core.telemetry.jobrun import end_abandoned

    if ns.limit < 1:
        raise ConfigError(f"--limit: {ns.limit} is not allowed; expected an integer >= 1 (the newest runs shown)")
    _client(ns.tracking_uri, must_exist=True)  # checked first: the store is named when it cannot be read
    # A job killed whole (launcher included) left its run RUNNING: end it as KILLED before showing it.
    end_abandoned(uri=resolve_uri(ns.tracking_uri))
    runs = list_runs(ns.tracking_uri, ns.experiment, ns.limit)
    rows = [["run id", "name", "status", "framework", "np", "compression", "accumulate", *SHOWN_METRICS[:2], "samples/s"]]
    for r in runs:
        p, m = r.data.params, r.data.metrics
        rows.append([r.info.run_id, r.info.run_name, r.info.status, r.data.tags.get("framework", "-"),
                     p.get("world_size", "-"), p.get("sync.compression", "-"), p.get("sync.accumulate", "-"),
                     *(_fmt(m.get(k)) for k in SHOWN_METRICS[:3])])
    print(_table(rows) if runs else "no runs")
    return 0


# ---- compare (hvdsync.launch.runs_compare) -----------------------------------------------------------------------
def compare(run_ids: list[str], uri: str = "", baseline: str | None = None, out: str | Path | None = None) -> dict:
    """:func:`hvdsync.launch.runs_compare.compare` on the store ``uri``."""
    return runs_compare.compare(_client(uri, must_exist=True), run_ids, baseline, out)


def _cmd_compare(ns) -> int:
    if ns.run_ids and ns.runs:
        raise ConfigError("runs compare: give the run ids either as arguments or after --runs, not both")
    from hvdsync.launch.base import unwritable

    if ns.out and unwritable(ns.out, "file"):
        raise ConfigError(f"--out: {unwritable(ns.out, 'file')}; give a PNG path this user can write")
    given = ns.run_ids or ns.runs
    run_ids = given or [r.info.run_id for r in list_runs(ns.tracking_uri, ns.experiment, 2)][::-1]
    if len(run_ids) < 2:
        raise ConfigError(f"runs compare: {len(run_ids)} run id(s) given or found; at least two runs are needed, "
                          "e.g. `hvdsync runs compare RUN_A RUN_B`")
    report = compare(run_ids, ns.tracking_uri, ns.baseline, ns.out)
    if ns.json:
        print(json.dumps(report, indent=2))
        return 0
    print("params that differ:" if report["differing"] else "params: all equal")
    if report["differing"]:
        print(_table([["param", *(r[:8] for r in run_ids)], *([k, *map(str, v)] for k, v in report["differing"].items())]))
    print(f"\nwhole-run figures after warm-up (ratio to {report['baseline'][:8]}):")
    print(_table(runs_compare.table_rows(report, run_ids)))
    if report["fastest"]:
        print(f"\nfastest: {report['fastest'][:8]} (samples/s over the epochs after warm-up; *_seconds: per step, "
              "means over the ranks; comm_share: sync_wait of all phases)")
    if report["png"]:
        print(f"\ncurves: {report['png']}")
    return 0


# ---- push -------------------------------------------------------------------------------------------------------
def _cmd_push(ns) -> int:
    from hvdsync.core.telemetry.jobrun import end_abandoned
    from hvdsync.core.telemetry.spool import Spool, push

    paths, folders = [], []
    for p in map(Path, ns.spools):
        if p.is_dir():
            paths += sorted(p.glob("*.jsonl"))
            folders.append(p)
        elif p.is_file():
            if spool_target(p) is None:
                raise ConfigError(f"spool: {str(p)!r} is not a spool file (no record naming its store); give a "
                                  ".jsonl file of hvdsync's spool folder, or the folder")
            paths.append(p)
            folders.append(p.parent)
        else:
            raise ConfigError(f"spool: {str(p)!r} does not exist")
    # Jobs killed whole (launcher included) whose runs are still RUNNING: ended as KILLED first; what their rank 0
    # spooled lands in them below.
    ended = [run_id for folder in dict.fromkeys(folders) for run_id in end_abandoned(folder)]
    for run_id in ended:
        print(f"run {run_id}: its job was killed; ended as KILLED")
    if not paths and not ended:
        raise ConfigError(f"spool: nothing to push in {', '.join(ns.spools)}")
    failed = 0
    for path in paths:
        try:
            done = push(Spool(path))
            print(f"{path.name}: sent {done['sent']} records to run {done['run_id']}")
        except Exception as exc:  # noqa: BLE001 - report and go on with the next spool
            failed += 1
            print(f"{path.name}: not sent ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})", file=sys.stderr)
    return 1 if failed else 0


# ---- ui ---------------------------------------------------------------------------------------------------------
def ui_command(uri: str = "", port: int = 5000, artifacts: str | None = None) -> list[str]:
    """The ``mlflow server`` command that serves the store ``uri`` (and its UI) on 127.0.0.1:``port``."""
    uri = resolve_uri(uri)
    if uri.startswith(("http://", "https://", "databricks")):
        raise ConfigError(f"--tracking-uri: {uri!r} is a server already; open it in a browser")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    return cmd + (["--artifacts-destination", artifacts] if artifacts else [])


def _cmd_ui(ns) -> int:
    check_port(ns.port)
    cmd = ui_command(ns.tracking_uri, ns.port, ns.artifacts_destination)
    # The server in a process group of its own: a stop (Ctrl-C, SIGTERM) reaches all of it, its workers included,
    # and the command waits until they are gone.
    # Its own lines go to stderr: stdout carries the link alone (scripts read it).
    server = subprocess.Popen(cmd, start_new_session=True, stdout=sys.stderr.fileno())
    try:
        if not wait_until_up(server, ns.port):
            code = server.wait()
            print(f"hvdsync: the MLflow server stopped before it answered on 127.0.0.1:{ns.port} (exit code {code}); "
                  "its own lines above say why", file=sys.stderr)
            return code or 1
        print(f"MLflow UI on {runs_url(ns.tracking_uri, ns.port, ns.experiment)} (Ctrl-C stops it)", flush=True)
        return server.wait()
    except KeyboardInterrupt:
        stop_group(server)
        raise


def runs_url(uri: str, port: int, experiment: str | None = None) -> str:
    """The UI's page of the runs of ``experiment`` (default: the experiment of the newest run), as a model-training
    experiment (``workflowType=machine_learning``: MLflow 3's UI otherwise opens on its GenAI overview)."""
    root = f"http://127.0.0.1:{port}"
    try:
        client = _client(uri)
        if experiment:
            exp = client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp else None
        else:
            newest = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                        order_by=["attributes.start_time DESC"], max_results=1)
            exp_id = newest[0].info.experiment_id if newest else None
    except Exception:  # noqa: BLE001 - the server serves the store all the same: its root page then
        exp_id = None
    return f"{root}/#/experiments/{exp_id}?workflowType=machine_learning" if exp_id else root


# ---- reproduce --------------------------------------------------------------------------------------------------
def reproduce(run_id: str, uri: str = "", quiet: bool = True) -> dict:
    """Rerun ``run_id`` from its record (``hvdsync/record.json``) and compare the final metrics.

    Returns ``{"run_id": new id, "versions_changed": {...}, "metrics": {name: (recorded, rerun)},
    "identical": bool}`` (identical: every final metric, the parameter fingerprint included, bit for bit)."""
    from hvdsync import launch
    from hvdsync.core.telemetry.record import versions

    client = _client(uri, must_exist=True)
    client.get_run(run_id)  # an unknown id: one line naming it, before the record is looked for
    with tempfile.TemporaryDirectory() as tmp:
        rec = json.loads(Path(client.download_artifacts(run_id, "hvdsync/record.json", tmp)).read_text())
    raw = rec["config"]
    raw["tracking"].update(tracking_uri=resolve_uri(uri), run_name=f"reproduce-{run_id[:8]}", parent_run_id="")
    cfg = Config.from_dict(raw)
    changed = {k: (v, versions().get(k)) for k, v in rec["versions"].items() if versions().get(k) != v}
    result = launch.train(cfg, quiet=quiet)
    old, new = client.get_run(run_id).data.metrics, client.get_run(result.run_id).data.metrics if result.run_id else {}
    keys = sorted(k for k in old if k.startswith("final") or k in FINAL_METRICS[:1] or k == "train_loss")
    pairs = {k: (old[k], new.get(k)) for k in keys}
    if result.run_id:
        client.set_tag(result.run_id, "hvdsync.reproduces", run_id)
    return {"run_id": result.run_id, "versions_changed": changed, "metrics": pairs,
            "identical": bool(pairs) and all(a == b for a, b in pairs.values())}


def _cmd_reproduce(ns) -> int:
    out = reproduce(ns.run_id, ns.tracking_uri, quiet=not ns.verbose)
    for k, (was, now) in out["versions_changed"].items():
        print(f"version changed: {k} {was} -> {now}")
    print(_table([["metric", "recorded", "rerun", "equal"],
                  *([k, repr(a), repr(b), "yes" if a == b else "NO"] for k, (a, b) in out["metrics"].items())]))
    print(f"rerun {out['run_id']}: {'bitwise identical' if out['identical'] else 'differs'}")
    return 0 if out["identical"] else 1


# ---- sweep ------------------------------------------------------------------------------------------------------
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


def _cmd_sweep(ns, base: Config) -> int:
    out = sweep(base, ns.sweeps, quiet=not ns.verbose)
    rows = [["overrides", "test accuracy", "samples/s", "run id"]]
    for combo, res in out["children"]:
        rows.append([" ".join(combo), f"{res['test_accuracy']:.4f}", f"{res['samples_per_second']:.0f}",
                     res.get("run_id") or "-"])
    print(_table(rows))
    if out.get("best"):
        print(f"best: {' '.join(out['best']['overrides'])} (test accuracy {out['best']['test_accuracy']:.4f}, run "
              f"{out['best']['run_id']})")
    if out["parent"]:
        print(f"parent run {out['parent']}: `hvdsync runs compare RUN_ID RUN_ID ...` or MLflow's compare view")
    return 0


# ---- argument parsing (called from hvdsync.launch.cli) ---------------------------------------------------------
def add_parsers(sub) -> None:
    """Add ``runs`` and ``sweep`` to the ``hvdsync`` command's subparsers."""
    runs = sub.add_parser("runs", help="list, compare, push, open the UI for, or reproduce recorded runs")
    rsub = runs.add_subparsers(dest="runs_command", required=True)

    def common(p):
        p.add_argument("--tracking-uri", default="", help="MLflow store (default: MLFLOW_TRACKING_URI or MLflow's)")
        return p

    runs.set_defaults(subparsers=rsub)
    p = common(rsub.add_parser("list", help="the newest runs"))
    p.add_argument("--experiment")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(handler=_cmd_list)
    p = common(rsub.add_parser("compare", help="differing params, final metrics and curves of runs"))
    p.add_argument("--experiment")
    p.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to compare (default: the newest two)")
    # The earlier spelling, kept so scripts written for it still work.
    p.add_argument("--runs", nargs="+", metavar="RUN_ID", help="the same as the RUN_ID arguments")
    p.add_argument("--baseline", metavar="RUN_ID", help="the run the ratios are relative to (default: the first)")
    p.add_argument("--out", default="runs-compare.png", help="PNG of the curves")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_compare)
    p = rsub.add_parser("push", help="send spooled records a store did not get")
    p.add_argument("spools", nargs="+", metavar="SPOOL", help="a spool file (.jsonl) or a folder of them")
    p.set_defaults(handler=_cmd_push)
    p = common(rsub.add_parser("ui", help="MLflow's UI on 127.0.0.1 for the store"))
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--artifacts-destination", help="where the server keeps artifacts it receives")
    p.add_argument("--experiment", help="the experiment whose runs the printed link opens (default: the newest run's)")
    p.set_defaults(handler=_cmd_ui)
    p = common(rsub.add_parser("reproduce", help="rerun a run from its record and compare final metrics"))
    p.add_argument("run_id")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(handler=_cmd_reproduce)

    s = sub.add_parser("sweep", help="train a grid of configs (--set field=v1,v2) as child runs of one MLflow run")
    train_options(s)


def subcommands(sub) -> list[argparse.ArgumentParser]:
    """The parsers of ``runs list``, ``runs compare``, ... (for options every command shares, such as --debug)."""
    rsub = sub.choices["runs"].get_default("subparsers")
    return list(rsub.choices.values())


# What a ``runs`` command waits for a server that takes the connection and never answers (MLflow's default is 120 s
# per try, 7 tries): it reads, so a few seconds say enough. A job's own tracking keeps HTTP_ENV's longer timeout.
RUNS_HTTP_TIMEOUT_S = "5"


def main(ns: argparse.Namespace, base: Config | None = None) -> int:
    """Dispatch a parsed ``runs`` or ``sweep`` command."""
    from hvdsync.core.telemetry.tracking import HTTP_ENV

    # A dead server fails these commands in seconds, not after MLflow's minutes of retries; and no "View run"
    # lines between our own output.
    if ns.command == "runs":
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", RUNS_HTTP_TIMEOUT_S)
    for key, value in HTTP_ENV.items():
        os.environ.setdefault(key, value)
    if ns.command == "sweep":
        return _cmd_sweep(ns, base)
    try:
        return ns.handler(ns)
    except Exception as exc:
        line = store_error(exc, getattr(ns, "tracking_uri", ""))
        if line is None:
            raise
        raise line from exc
