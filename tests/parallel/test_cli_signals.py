"""A user stops a job: Ctrl-C (SIGINT to the terminal's whole process group) or SIGTERM to the launcher of a real
``hvdsync train`` with 2 Horovod workers and a real SQLite store. The workers are stopped (none of the launcher's
processes is left; an elastic job too), the MLflow run is ``KILLED``, the last line says "stopped by the user", and the exit status is
the convention's 128 + the signal (130, 143). And ``hvdsync runs ui`` stopped by SIGTERM leaves no process of its
server's group behind.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import psutil
import pytest

BIN = Path(sys.executable).parent
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _wait_for(check, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def _training(progress: Path) -> bool:
    """Rank 0 has reported a step (its progress file has a line after the header)."""
    try:
        return any("total" not in json.loads(line) for line in progress.read_text().splitlines())
    except (OSError, ValueError):
        return False


# An elastic job too: Horovod's elastic driver took the workers its stop event ended for failed hosts and waited for
# new ones, so before the launcher raised on the signal itself, SIGTERM never ended an elastic job.
ELASTIC = ["--elastic", "--min-np", "1", "--max-np", "2"]


@pytest.mark.parametrize("signum, to_group, more", [(signal.SIGINT, True, []), (signal.SIGTERM, False, []),
                                                    (signal.SIGTERM, False, ELASTIC)],
                         ids=["ctrl-c-to-the-group", "sigterm-to-the-launcher", "sigterm-to-an-elastic-launcher"])
def test_a_stopped_job_is_killed_not_failed(tmp_path, signum, to_group, more):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    launcher = subprocess.Popen([str(BIN / "hvdsync"), "train", "--np", "2", "--epochs", "200", "--tracking-uri", uri,
                                 "--log-dir", str(tmp_path / "run"), *more], cwd=tmp_path, env=ENV, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for(lambda: _training(tmp_path / "run" / "progress.jsonl"), "training step")
        family = {p: " ".join(p.cmdline()) for p in psutil.Process(launcher.pid).children(recursive=True)}
        assert len([p for p, cmd in family.items() if "spawn_main" in cmd]) >= 2  # Horovod's two workers
        if to_group:  # what a terminal does on Ctrl-C: every process of the foreground group gets SIGINT
            os.killpg(launcher.pid, signum)
        else:
            launcher.send_signal(signum)
        _out, err = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    lines = err.strip().splitlines()
    assert launcher.returncode == 128 + signum, err
    assert lines[-1] == f"hvdsync: stopped by the user ({signal.Signals(signum).name}); the workers were stopped", err
    assert "Traceback" not in err and "failed" not in err, err
    # The workers are gone at once; rank 0's tracking sender (hvdsync.core.telemetry.sender) delivers what rank 0
    # spooled, then exits by itself, as its parent is gone.
    senders = [p for p, cmd in family.items() if "hvdsync.core.telemetry.sender" in cmd]
    _gone, alive = psutil.wait_procs([p for p in family if p not in senders], timeout=10)
    assert alive == [], [family[p] for p in alive]
    _gone, alive = psutil.wait_procs(senders, timeout=60)
    assert alive == [], [family[p] for p in alive]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["KILLED"]


def test_runs_ui_stopped_leaves_nothing_of_its_group(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ui = subprocess.Popen([str(BIN / "hvdsync"), "runs", "ui", "--port", str(port), "--tracking-uri",
                           f"sqlite:///{tmp_path / 'mlflow.db'}"], env=ENV, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, start_new_session=True)
    try:
        def server_group() -> list[psutil.Process]:
            groups = []
            for child in psutil.Process(ui.pid).children(recursive=True):
                try:
                    groups.append((os.getpgid(child.pid), child))
                except OSError:
                    pass
            return [c for g, c in groups if g != os.getpgid(ui.pid)]

        # The link comes once the server answers; the server and its workers run in a group of their own.
        first = ui.stdout.readline()
        members = server_group()
        assert len(members) >= 2, first
        group = os.getpgid(members[0].pid)
        ui.send_signal(signal.SIGTERM)
        out, err = ui.communicate(timeout=30)
    finally:
        if ui.poll() is None:
            ui.kill()
    assert first.strip() == f"MLflow UI on http://127.0.0.1:{port} (Ctrl-C stops it)"   # an empty store: its root
    assert ui.returncode == 143 and err.strip().splitlines()[-1] == "hvdsync: stopped by the user (SIGTERM)", err
    left = [p for p in psutil.process_iter() if _group(p) == group]
    assert left == [], [p.cmdline() for p in left]


def _group(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None
