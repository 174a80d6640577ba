"""Horovod's own elastic API (no hvdsync) under real ``horovodrun --host-discovery-script`` jobs, 2 ranks, Gloo on
loopback: a discovery script written here prints the lines of a hosts file that the test rewrites mid-run.

* ``localhost:2`` (one machine, two slots) trains; an unpatched 0.28.1 waited for a second host until
  ``--elastic-timeout`` with no worker started (scripts/horovod-patches/0010-elastic-one-host-slots.patch). The
  job then shrinks to ``localhost:1``.
* ``hvd.elastic.TensorFlowKerasState`` with a Keras 3 model and optimizer (0009-tensorflow-keras3-elastic-state),
  and ``hvd.elastic.TorchState``: a worker exits at a chosen step; the survivor rolls back to its last commit
  (model, momentum, Keras's ``iterations``).
* ``hvd.elastic.ElasticSampler`` in ``TorchState``: after a worker fails, the survivor reads exactly the samples
  the last commit had not covered.
* examples/plain/horovod_elastic_keras.py (``model.fit`` with ``KerasState`` and the three callbacks) grows from
  one worker to two.

Every step of the worker script draws the same batch on every rank, so whatever the resets, the final parameters
equal a one-process run (numpy, float64) when each reset restored the committed state; the tolerance 2e-5 is float32
rounding over 30 steps (measured 2e-7). A reset that kept an uncommitted step, or lost the momentum, moves them by
more than 1e-3.
"""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.parallel import horovod_elastic_workers as workers

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WORKERS = Path(workers.__file__)
TOL = 2e-5


def _discovery(tmp_path, hosts):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    return script, hosts_file


def _horovodrun(tmp_path, discovery, np_, argv, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    cmd = [str(BIN / "horovodrun"), "-np", str(np_), "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discovery), "--elastic-timeout", "60", "--gloo", sys.executable, *argv]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    return out, time.monotonic() - t0


def _rewrite_when(events, hosts_file, mark, hosts):
    """Rewrite the discovery's hosts file once rank 0 has logged `mark` (the test's side of a scale event)."""
    def watch():
        for _ in range(3000):
            if events.exists() and mark in events.read_text():
                hosts_file.write_text(hosts)
                return
            time.sleep(0.05)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _diff(params, ref):
    return max(float(np.abs(np.asarray(p) - r).max()) for p, r in zip(params, ref, strict=True))


def test_localhost_2_discovery_trains_then_shrinks_to_one_slot(tmp_path):
    discovery, hosts_file = _discovery(tmp_path, "localhost:2\n")
    events = tmp_path / "events.jsonl"
    _rewrite_when(events, hosts_file, '"step": 10,', "localhost:1\n")
    out, wall = _horovodrun(tmp_path, discovery, 2, [str(WORKERS), "torch", "--steps", "30", "--commit-every", "3",
                                                     "--step-sleep", "0.2", "--events", str(events)])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # one line, at start, saying what was chosen and what a later remote host needs
    assert ("every discovered host is local (localhost): the workers use the loopback interface lo; "
            "a remote host discovered later needs --network-interface.") in out.stderr
    log = _events(events)
    steps = [e for e in log if e["event"] == "step"]
    resets = [e for e in log if e["event"] == "reset"]
    done = log[-1]
    assert steps[0]["size"] == 2 and steps[-1]["size"] == 1          # it started on two slots and shrank
    assert len(resets) == 1 and resets[0]["size"] == 1
    assert resets[0]["step"] % 3 == 0 and resets[0]["step"] >= 9     # resumed from a commit after the rewrite
    assert done["event"] == "done" and done["step"] == 30
    assert _diff(done["params"], workers.reference(30)) < TOL
    assert _diff(done["params"], workers.reference(29)) > 1e-3       # one step more or less shows


@pytest.mark.parametrize("framework", ["keras", "torch"])
def test_state_restores_the_commit_after_a_worker_fails(tmp_path, framework):
    # two "hosts" for one machine: the failed worker's host is blacklisted, the other keeps its slot
    discovery, _ = _discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    events = tmp_path / "events.jsonl"
    out, wall = _horovodrun(tmp_path, discovery, 2, [
        str(WORKERS), framework, "--steps", "30", "--commit-every", "3", "--step-sleep", "0.05",
        "--events", str(events), "--exit-rank", "1", "--exit-step", "8", "--exit-flag", str(tmp_path / "exited")])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Exit code: 3" not in out.stderr and (tmp_path / "exited").exists()
    log = _events(events)
    resets = [e for e in log if e["event"] == "reset"]
    done = log[-1]
    # rank 1 exits before the step from 8 to 9; rank 0 fails in that step's all-reduce, rolls back to its last
    # commit (6) and redoes 7 and 8 alone
    assert [(r["step"], r["size"]) for r in resets] == [(6, 1)]
    assert [e["step"] for e in log if e["event"] == "step"][:10] == [1, 2, 3, 4, 5, 6, 7, 8, 7, 8]
    assert done["step"] == 30
    if framework == "keras":
        assert done["optimizer_iterations"] == 30                    # Keras 3's `iterations` was restored (not 32)
    assert _diff(done["params"], workers.reference(30)) < TOL         # and the momentum (else > 1e-3)


def test_plain_elastic_keras_example_grows_from_one_worker_to_two(tmp_path):
    discovery, hosts_file = _discovery(tmp_path, "localhost:1\n")
    out_prefix = tmp_path / "final"
    history = tmp_path / "history.jsonl"
    _rewrite_when(history, hosts_file, '"epoch": 1,', "localhost:2\n")
    out, wall = _horovodrun(tmp_path, discovery, 1, [
        str(ROOT / "examples/plain/horovod_elastic_keras.py"), "--epochs", "12", "--results", str(out_prefix),
        "--history", str(history)])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r0, r1 = (json.loads(Path(f"{out_prefix}.rank{r}.json").read_text()) for r in (0, 1))
    assert r0["size"] == r1["size"] == 2 and r0["epoch"] == r1["epoch"] == 12
    # the newcomer got the committed state: its first epoch is the survivor's, not 0
    assert r1["first_epoch"] >= 1 and r0["first_epoch"] == 0
    assert r0["iterations"] == r1["iterations"]
    assert _diff(r0["params"], [np.asarray(p) for p in r1["params"]]) == 0.0   # one model, bit for bit
    hist = _events(history)
    assert [h["size"] for h in hist][0] == 1 and hist[-1]["size"] == 2 and hist[-1]["epoch"] == 12
    assert r0["loss"] < 0.5 * hist[0]["loss"]


def test_elastic_sampler_resumes_from_the_committed_samples_after_a_worker_fails(tmp_path):
    # hvd.elastic.ElasticSampler in TorchState, 96 samples, 4 a batch, a commit every 2 batches; rank 1 exits
    # before its batch 5: batches 0-3 of both ranks (32 samples) are committed, batch 4 is rolled back
    discovery, _ = _discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    events = tmp_path / "sampler.jsonl"
    out, wall = _horovodrun(tmp_path, discovery, 2, [
        str(WORKERS), "torch-sampler", "--commit-every", "2", "--step-sleep", "0.05", "--events", str(events),
        "--exit-rank", "1", "--exit-step", "5", "--exit-flag", str(tmp_path / "exited")])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r0 = _events(Path(f"{events}.rank0"))
    r1 = _events(Path(f"{events}.rank1"))
    [reset] = [e for e in r0 if e["event"] == "reset"]
    assert (reset["processed"], reset["size"]) == (32, 1)
    before = [e for e in r0 + r1 if e["event"] == "batch" and e["size"] == 2]
    after = [e for e in r0 if e["event"] == "batch" and e["size"] == 1]
    assert {e["batch"] for e in before if e["rank"] == 1} == {0, 1, 2, 3, 4}       # rank 1 did batch 4, then left
    committed = sorted(i for e in before if e["batch"] < 4 for i in e["indices"])
    resumed = [i for e in after for i in e["indices"]]
    assert committed == list(range(32))               # the two ranks' shares, strided, up to the commit
    assert resumed == list(range(32, 96))             # the survivor reads the rest, each sample once
