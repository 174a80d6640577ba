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
from pathlib import Path

from hvdsync.config import Config, ConfigError
from hvdsync.core.telemetry.tracking import FINAL_METRICS, resolve_uri
from hvdsync.launch.options import train_options
from hvdsync.launch.runs_checks import spool_target, stop_group, store_error, check_port, check_store

# The final figures ``list`` and ``compare`` show (higher is better for all but the times and the loss).
SHOWN_METRICS = ("final_test_accuracy", "train_loss", "samples_per_second", "total_seconds", "wire_bytes")
# Params that name or place a run rather than configure its training: never listed as a difference.
NOT_SETTINGS = ("tracking.run_name", "tracking.parent_run_id", "tracking.spool_dir")
# The curves ``compare`` plots: (metric, title), the per-step one when the run has it.
CURVES = (("step/loss", "train_loss", "loss"), ("test_accuracy", "test_accuracy", "test accuracy"),
          ("step/samples_per_second", "samples_per_second", "samples/s"))


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
    rows = [["run id", "name", "status", "framework", "np", "compression", "accumulate", *SHOWN_METRICS[:2]]]
    for r in runs:
        p, m = r.data.params, r.data.metrics
        rows.append([r.info.run_id, r.info.run_name, r.info.status, r.data.tags.get("framework", "-"),
                     p.get("world_size", "-"), p.get("sync.compression", "-"), p.get("sync.accumulate", "-"),
                     *(_fmt(m.get(k)) for k in SHOWN_METRICS[:2])])
    print(_table(rows) if runs else "no runs")
    return 0


# ---- compare ----------------------------------------------------------------------------------------------------
def compare(run_ids: list[str], uri: str = "", baseline: str | None = None, out: str | Path | None = None) -> dict:
    """The params that differ between ``run_ids``, their final metrics with ratios to ``baseline`` (default: the
    first run), and a PNG of their curves at ``out`` (loss, accuracy, samples/s, one line per run).

    Returns ``{"differing": {param: [value per run]}, "metrics": {run_id: {metric: value}},
    "ratios": {run_id: {metric: ratio}}, "png": path}``.
    """
    client = _client(uri, must_exist=True)
    runs = [client.get_run(r) for r in run_ids]
    baseline = baseline or run_ids[0]
    if baseline not in run_ids:
        raise ConfigError(f"--baseline: {baseline!r} is not one of the compared runs")
    keys = sorted(set().union(*(r.data.params for r in runs)))
    differing = {k: [r.data.params.get(k) for r in runs] for k in keys
                 if k not in NOT_SETTINGS and len({r.data.params.get(k) for r in runs}) > 1}
    metrics = {r.info.run_id: {k: r.data.metrics.get(k) for k in SHOWN_METRICS} for r in runs}
    base = metrics[baseline]
    ratios = {rid: {k: (v / base[k] if v is not None and base.get(k) else None) for k, v in m.items()}
              for rid, m in metrics.items()}
    report = {"differing": differing, "metrics": metrics, "ratios": ratios, "baseline": baseline, "png": None}
    if out:
        report["png"] = str(_plot_curves(client, runs, differing, Path(out)))
    return report


def _label(run, differing: dict) -> str:
    return ", ".join(f"{k}={run.data.params.get(k)}" for k in differing) or run.info.run_id[:8]


def _plot_curves(client, runs, differing: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 3.5))
    for ax, (step_key, epoch_key, title) in zip(axes, CURVES):
        for run in runs:
            key = step_key if step_key in run.data.metrics else epoch_key
            history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
            ax.plot([m.step for m in history], [m.value for m in history], marker=".", label=_label(run, differing))
        ax.set(title=title, xlabel="step" if step_key.startswith("step/") else "step or epoch")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


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
    print(f"\nfinal metrics (ratio to {report['baseline'][:8]}):")
    rows = [["metric", *(r[:8] for r in run_ids)]]
    for k in SHOWN_METRICS:
        rows.append([k, *(f"{_fmt(report['metrics'][r][k])} ({_fmt(report['ratios'][r][k])})" for r in run_ids)])
    print(_table(rows))
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
    server = subprocess.Popen(cmd, start_new_session=True)
    print(f"MLflow UI on http://127.0.0.1:{ns.port} (Ctrl-C stops it)", flush=True)
    try:
        return server.wait()
    except KeyboardInterrupt:
        stop_group(server)
        raise


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
    workers and Horovod's knobs run in one worker job. Returns ``{"parent": id, "children": [(overrides,
    FitResult dict)]}``."""
    combos = grid(sweeps)
    base_raw = base.to_dict()
    configs = []
    for combo in combos:
        raw = json.loads(json.dumps(base_raw))
        from hvdsync.config import apply_override

        for item in combo:
            apply_override(raw, item)
        configs.append(Config.from_dict(raw))
    parent = _parent_run(base, combos) if base.tracking.enabled else None
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
    if parent:
        _client(base.tracking.tracking_uri).set_terminated(parent)
    return {"parent": parent, "children": list(zip(combos, results))}


def _run_groups(configs, combos, groups, parent, results, quiet) -> None:
    """Each group of configs that can share workers, in one worker job; results filled in by index."""
    from hvdsync import launch
    from hvdsync.launch import worker

    for idx in groups.values():
        dicts = [configs[i].replace(tracking={"parent_run_id": parent or "",
                                              "run_name": ",".join(combos[i])}).to_dict() for i in idx]
        launch.preflight(configs[idx[0]])
        ranks = launch.run(worker.fit_many, args=(dicts,), np=configs[idx[0]].train.np, sync=configs[idx[0]].sync,
                           quiet=quiet)
        for i, res in zip(idx, ranks[0]):
            results[i] = res


def _parent_run(base: Config, combos: list[list[str]]) -> str | None:
    try:
        client = _client(base.tracking.tracking_uri)
        exp = client.get_experiment_by_name(base.tracking.experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(base.tracking.experiment)
        run = client.create_run(exp_id, run_name=base.tracking.run_name or "sweep",
                                tags={"hvdsync.sweep": json.dumps(combos)})
        return run.info.run_id
    except Exception as exc:  # noqa: BLE001 - a sweep still trains without its parent run
        print(f"hvdsync: no parent run for the sweep ({exc}); the runs are recorded on their own", file=sys.stderr)
        return None


def _cmd_sweep(ns, base: Config) -> int:
    out = sweep(base, ns.sweeps, quiet=not ns.verbose)
    rows = [["overrides", "test accuracy", "samples/s", "run id"]]
    for combo, res in out["children"]:
        rows.append([" ".join(combo), f"{res['test_accuracy']:.4f}", f"{res['samples_per_second']:.0f}",
                     res.get("run_id") or "-"])
    print(_table(rows))
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
