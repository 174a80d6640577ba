"""The elastic jobs the torch and TensorFlow elastic tests share (one of each kind per framework).

* :func:`shrink_and_grow`: two local hosts; the worker on the second SIGKILLs itself before step 7 (a real signal
  at a known step); once the survivor has recovered, a third host appears in the discovery script.
* :func:`kill_and_resume`: an uninterrupted run; the same run with every worker SIGKILLed after its third checkpoint
  (the launcher is told the job failed); the newest checkpoint damaged on purpose; then ``resume``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

from hvdlab import faults
from hvdsync.launch import elastic as elastic_launch
from hvdsync.config import Config
from hvdsync.core.elastic._ledger import SampleLedger
from hvdsync.launch.local import WorkerError

HOSTS = elastic_launch.local_hosts()

# Small and slow enough to watch: 2 epochs of digits, batch 16, 30 ms per step (fault injection "slow").
BASE = {"data": {"batch_size": 16}, "train": {"epochs": 2, "np": 2, "lr": 0.05},
        "tracking": {"enabled": False},
        "elastic": {"enabled": True, "min_np": 1, "max_np": 3, "commit_every": 2, "timeout_s": 30}}


def config(framework: str = "torch", **sections) -> Config:
    raw = json.loads(json.dumps(BASE))
    raw["train"]["framework"] = framework
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return Config.from_dict(raw)


def wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def kill_whole(proc, logs: Path) -> None:
    """SIGKILL a launcher started in a session of its own and each of its workers (their pids from its log folder),
    as a machine's crash would end a job."""
    pids = elastic_launch.worker_pids(logs)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def _bars(run_dir: Path) -> int:
    """How many times rank 0 (re-)entered the training function: each entry starts a progress bar."""
    path = run_dir / "progress.jsonl"
    return sum('"total"' in line for line in path.read_text().splitlines()) if path.exists() else 0


def _in_background(fn) -> dict:
    # Horovod's elastic driver installs signal handlers, so the job runs in the main thread; helpers do not.
    seen: dict = {}

    def target():
        try:
            fn()
            seen["done"] = True
        except AssertionError as exc:
            seen["error"] = exc

    threading.Thread(target=target, daemon=True).start()
    return seen


def shrink_and_grow(framework: str, run_dir: Path, **sections):
    """Kill the second host's worker at step 7, add a third host after the recovery; returns the ElasticResult."""

    def grow():
        wait_for(lambda: (run_dir / "fault-1.fired").exists(), "the injected kill")
        wait_for(lambda: _bars(run_dir) >= 2, "recovery")
        elastic_launch.set_hosts(run_dir, HOSTS[:3])

    seen = _in_background(grow)
    with faults.armed(f"slow@30,kill@6:{HOSTS[1]}"):
        result = elastic_launch.train(faults.enable(config(framework, **sections)), log_dir=run_dir,
                                      callbacks=[SampleLedger()], hosts=HOSTS[:2])
    assert seen.get("done"), seen
    return result


def kill_and_resume(framework: str, tmp: Path, capsys=None):
    """Returns (uninterrupted result, resumed result, the resumed run's reports, checkpoint steps, damaged file)."""
    sections = {"train": {"deterministic": True}, "elastic": {"commit_every": 4}}
    whole = elastic_launch.train(config(framework, elastic={"commit_every": 4, "checkpoint_dir": str(tmp / "c0")},
                                        train={"deterministic": True}), log_dir=tmp / "whole", progress=False)
    ckpt, run_dir = tmp / "c1", tmp / "killed"
    cfg = faults.enable(config(framework, elastic={**sections["elastic"], "checkpoint_dir": str(ckpt)},
                               train=sections["train"]))

    def kill_every_worker():
        wait_for(lambda: len(list(ckpt.glob("ckpt-*"))) >= 3, "three checkpoints")
        for pid in elastic_launch.worker_pids(run_dir).values():
            os.kill(pid, signal.SIGKILL)

    _in_background(kill_every_worker)
    try:
        with faults.armed("slow@30"):
            elastic_launch.train(cfg, log_dir=run_dir, progress=False)
        raise AssertionError("the job was not killed")
    except WorkerError:
        pass
    steps = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("ckpt-*"))
    newest = max(ckpt.glob("ckpt-*"))
    payload = next(p for p in newest.iterdir() if p.name != "manifest.json")
    blob = bytearray(payload.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    payload.write_bytes(bytes(blob))
    resume_dir = tmp / "resumed"
    resumed = elastic_launch.train(cfg.replace(elastic={"resume": True}), log_dir=resume_dir, progress=False)
    reports = (resume_dir / "workers.log").read_text(errors="replace")
    return whole, resumed, reports, steps, payload
