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
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hvdsync.config import Config, ConfigError
from hvdsync.core.telemetry.tracking import FINAL_METRICS, resolve_uri
from hvdsync.launch import runs_compare
from hvdsync.launch.options import train_options
from hvdsync.launch.runs_checks import (spool_target, stop_group, store_error, check_port, wait_until_up,
                                        store_client as _client)
from hvdsync.launch.runs_compare import fmt as _fmt, table as _table

# The final figures ``runs list`` shows (the first three) and ``--json`` callers read.
SHOWN_METRICS = ("final_test_accuracy", "train_loss", "Key/samples_per_second", "total_seconds", "wire_bytes")


def _experiment_ids(client, name: str | None) -> list[str]:
    if name:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise ConfigError(f"--experiment: {name!r} does not exist in this store")
        return [exp.experiment_id]
    return [e.experiment_id for e in client.search_experiments()]


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


# ---- sweep (hvdsync.launch.runs_sweep) -------------------------------------------------------------------------
from hvdsync.launch.runs_sweep import cmd_sweep, grid, sweep  # noqa: E402,F401 - `hvdsync.launch.runs.sweep` as before


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
        return cmd_sweep(ns, base)
    try:
        return ns.handler(ns)
    except Exception as exc:
        line = store_error(exc, getattr(ns, "tracking_uri", ""))
        if line is None:
            raise
        raise line from exc
