"""What a run is, said in its name and tags, so that runs can be told apart in MLflow's table and searched.

A run's facts (framework, ranks, hosts, codec, mode, accumulation, elastic) are params already, but MLflow's runs
table shows names and tags first, and a random name (``sedate-perch-441``) says nothing. The launcher names the run
it creates from the config, rank 0's tracker completes the tags once the hosts are known, and a sweep puts its axes
first in each child's name. Every run of every launcher gets the same ``hvdsync.*`` tags (sweep children included).
"""
from __future__ import annotations

from typing import Any, Mapping

# Tag -> the flat param it comes from (the first one present).
FACTS = {
    "framework": ("train.framework",),
    "hvdsync.np": ("world_size", "train.np"),
    "hvdsync.hosts": ("hosts.count",),
    "hvdsync.compression": ("sync.compression",),
    "hvdsync.mode": ("sync.mode",),
    "hvdsync.accumulate": ("sync.accumulate",),
    "hvdsync.elastic": ("elastic.enabled",),
}
# The tag MLflow's UI reads the experiment's kind from: a model-training experiment opens on its runs, not on the
# GenAI "Overview" of traces (the UI's own values: custom_model_development, genai_development).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# The sweep's key, handed to its worker jobs: each child run is tagged with it as its job (after the run is made: the
# job tag at creation would make the children one run, see hvdsync.core.telemetry.spool.replay).
SWEEP_ENV = "HVDSYNC_SWEEP"


def facts(params: Mapping[str, Any]) -> dict[str, str]:
    """The ``FACTS`` tags that ``params`` (a flat config, with ``world_size`` / ``hosts.count`` when known) gives."""
    out = {}
    for tag, names in FACTS.items():
        for name in names:
            if params.get(name) not in (None, ""):
                out[tag] = str(params[name])
                break
    if "hvdsync.elastic" in out:
        out["hvdsync.elastic"] = out["hvdsync.elastic"].lower()
        if out["hvdsync.elastic"] == "true" and params.get("train.np"):  # the size it started at, not the current
            out["hvdsync.np"] = str(params["train.np"])
    return out


def run_name(tags: Mapping[str, str], axes: list[str] | None = None) -> str:
    """``torch x2 1host fp16 allreduce acc4`` (+ ``elastic``); a sweep child's ``axes`` (``["sync.compression=fp16",
    ...]``) come first, without their section, as they are what tells the children apart."""
    parts = [tags.get("framework", "")]
    if tags.get("hvdsync.np"):
        parts[0] += f" x{tags['hvdsync.np']}"
    if tags.get("hvdsync.hosts"):
        parts.append(f"{tags['hvdsync.hosts']}host" + ("s" if tags["hvdsync.hosts"] != "1" else ""))
    parts += [tags.get("hvdsync.compression", ""), tags.get("hvdsync.mode", "")]
    if tags.get("hvdsync.accumulate"):
        parts.append(f"acc{tags['hvdsync.accumulate']}")
    if tags.get("hvdsync.elastic") == "true":
        parts.append("elastic")
    name = " ".join(p for p in parts if p)
    if axes:
        name = " ".join(a.split(".", 1)[-1] for a in axes) + " | " + name
    return name


def source_tags() -> dict[str, str]:
    """MLflow's own tags for who ran what (its UI's "Created by" and "Source"): the user, the command that started
    the job and, inside a git repository, its commit."""
    import getpass
    from pathlib import Path

    from hvdsync.core.telemetry.record import command_line, git_commit

    tags = {"mlflow.source.type": "LOCAL"}
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container): MLflow shows "-" as before
        pass
    # The program and its subcommand (``hvdsync train``, ``train.py``): MLflow's UI shows the last path component of
    # the source, so a whole command line would show as the tail of its last path. The record has the command line.
    argv = command_line()
    if argv:
        path = Path(argv[0])
        program = path.name
        if program == "hvdsync" or path.parts[-3:] == ("hvdsync", "launch", "cli.py"):
            program = " ".join(["hvdsync", *[a for a in argv[1:] if not a.startswith("-")][:1]])
        tags["mlflow.source.name"] = program
    git = git_commit()
    if git:
        tags["mlflow.source.git.commit"] = git["commit"]
    return tags


# Params that configure the tracking itself, not the training: where the spool lives and how long the end waits.
TRACKING_OWN = ("tracking.spool_dir", "tracking.flush_seconds")


def applicable(params: Mapping[str, Any]) -> dict[str, Any]:
    """The params that apply to the run: without empty values (``""``, ``{}``, ``[]``), tracking's own settings,
    the synthetic data set's knobs on a real data set (and the image knobs on any but ``synthetic_images``), and
    the elastic knobs of a job that is not elastic. The record (``hvdsync/record.json``) keeps the whole config."""
    dataset = str(params.get("data.dataset", ""))
    elastic = str(params.get("elastic.enabled", "")).lower() == "true"

    def applies(key: str, value: Any) -> bool:
        if value is None or str(value) in ("", "{}", "[]") or key in TRACKING_OWN:
            return False
        if key.startswith("data.synthetic_") and "data.dataset" in params and not dataset.startswith("synthetic"):
            return False
        if key.startswith("data.image_") and "data.dataset" in params and dataset != "synthetic_images":
            return False
        return not (key.startswith("elastic.") and key != "elastic.enabled" and "elastic.enabled" in params
                    and not elastic)

    return {k: v for k, v in params.items() if applies(k, v)}


def dataset_input(params: Mapping[str, Any]) -> dict[str, str] | None:
    """The run's data set as an MLflow dataset input: its name, a digest of the data settings that make it (the
    same digest: the same samples in the same split), where it comes from and its profile; None without a
    ``data.dataset`` param (a user's own loop)."""
    import hashlib
    import json

    name = params.get("data.dataset")
    if not name:
        return None
    data = {k: str(v) for k, v in sorted(applicable(params).items()) if k.startswith("data.")}
    making = {k: v for k, v in data.items() if k not in ("data.batch_size", "data.shares", "data.shuffle")}
    making["train.seed"] = str(params.get("train.seed", ""))
    digest = hashlib.sha256(json.dumps(making, sort_keys=True).encode()).hexdigest()[:8]
    return {"name": str(name), "digest": digest, "source": json.dumps({"registry": "hvdsync", "dataset": str(name)}),
            "profile": json.dumps(data)}
