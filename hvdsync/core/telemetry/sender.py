"""The sender: a separate, low-priority process that follows a run's spool and sends it to the MLflow store.

A process, not a thread: MLflow's client does its work in Python (entities, protobuf, JSON), and a thread doing it
would take the interpreter lock from the training loop on rank 0, making rank 0 slower than the others while it
logs (the monitor measured exactly that). The spool file is the only interface: the training process appends, the
sender reads what is new, sends it in batches with short timeouts and a few retries, and acknowledges it.

    python -m hvdsync.core.telemetry.sender SPOOL URI [--retries 3] [--probe-seconds 2]

It writes its state to ``<spool>.status`` (``{"state": "up" | "down", "error": ..., "earlier": n}``), which the
tracker reads to warn once when the store stops answering. It exits once the run's ``end`` record is acknowledged,
when the training process is gone and nothing more can come, or on SIGTERM (the tracker's flush time is up).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from hvdsync.core.telemetry.spool import (Spool, next_batch, pending_spools, push, remove_delivered_continuations,
                                          send)
from hvdsync.core.telemetry.store import StoreError, prepare_store


PARENT_ENV = "HVDSYNC_SENDER_PARENT"  # the pid of the training process that started the sender


class _Follower:
    """Reads the records a spool gained since the last call (complete lines only)."""

    def __init__(self, spool: Spool) -> None:
        self.spool, self.offset = spool, 0
        self.done = set(spool.acks())

    def new(self) -> list[dict]:
        with open(self.spool.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line being written stays for the next call
        self.offset += end
        records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return [r for r in records if r["seq"] not in self.done]


def _status(spool: Spool, **state) -> None:
    tmp = spool.path.with_suffix(".status.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, spool.path.with_suffix(".status"))


def open_client(uri: str, attempts: int = 5):
    """``MlflowClient(uri)`` on a store made ready first: a launcher has done that before the job started; under a
    user's own ``horovodrun`` the first sender does it (:func:`hvdsync.core.telemetry.store.prepare_store`: under a
    lock, in a copy put in place in one step, so a rank 0 killed meanwhile cannot leave a half-migrated store).
    Retried a few times on errors such as a database locked by another writer; a half-migrated store raises
    :class:`~hvdsync.core.telemetry.store.StoreError` at once (retrying cannot mend it)."""
    import mlflow

    for attempt in range(attempts):
        try:
            prepare_store(uri)
            return mlflow.MlflowClient(tracking_uri=uri)
        except StoreError:
            raise
        except Exception:  # noqa: BLE001 - a store that cannot be opened yet: try again, then give up loudly
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * 2**attempt)


def run(spool_path: str, uri: str, retries: int = 3, probe_seconds: float = 2.0) -> int:
    """Follow and send ``spool_path`` to ``uri`` until the run ends (see the module docstring)."""
    # The training process that started us, as it said (read here, our parent may already be gone: a job stopped
    # while this process was still importing would leave a sender waiting forever for a parent it never saw).
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    spool = Spool(spool_path)
    try:
        client = open_client(uri)
    except StoreError as exc:  # the tracker warns with this line; everything stays in the spool for `runs push`
        _status(spool, state="down", error=str(exc), earlier=0)
        return 1
    follower = _Follower(spool)
    queue: list[dict] = []
    state = {"state": "up", "earlier": 0}
    earlier_done = False

    def push_earlier() -> None:
        """Once this run exists in the store: send what earlier runs to the same store left in the folder."""
        nonlocal earlier_done
        if earlier_done or not spool.run_id():
            return
        earlier_done = True
        for old in pending_spools(spool.path.parent, uri, exclude=spool.path):
            try:
                state["earlier"] += push(old, client)["sent"]
            except Exception:  # noqa: BLE001 - locked by a live run, or refused: leave it for later
                continue
        remove_delivered_continuations(spool.path.parent, uri, exclude=spool.path)
        _status(spool, **state)

    while True:
        queue += follower.new()
        if not queue:
            push_earlier()
            if os.getppid() != parent:
                return 1  # the training process died: nothing more will come; the rest is for `runs push`
            time.sleep(0.2)
            continue
        batch = next_batch(queue)
        error = None
        for attempt in range(retries):
            try:
                send(client, spool, batch)
                error = None
                break
            except Exception as exc:  # noqa: BLE001 - any store error: keep the records, retry later
                error = exc
                time.sleep(0.2 * 2**attempt)
        if error is None:
            follower.done.update(r["seq"] for r in batch)
            del queue[:len(batch)]
            if state["state"] != "up":
                state = {**state, "state": "up"}
                _status(spool, **state)
            if batch[-1]["op"] == "end":
                push_earlier()
                return 0
            continue
        if state["state"] != "down":
            message = str(error).splitlines()[0][:200] if str(error) else ""
            state = {**state, "state": "down", "error": f"{type(error).__name__}: {message}"}
            _status(spool, **state)
        if os.getppid() != parent:
            return 1
        time.sleep(probe_seconds)


def command(spool: Path, uri: str, retries: int, probe_seconds: float) -> list[str]:
    """The command line that starts a sender for ``spool``."""
    return [sys.executable, "-m", "hvdsync.core.telemetry.sender", str(spool), uri, "--retries", str(retries),
            "--probe-seconds", str(probe_seconds)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvdsync.core.telemetry.sender")
    p.add_argument("spool")
    p.add_argument("uri")
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--probe-seconds", type=float, default=2.0)
    ns = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    try:
        os.nice(10)  # the training processes come first on a shared host
    except OSError:
        pass
    return run(ns.spool, ns.uri, ns.retries, ns.probe_seconds)


if __name__ == "__main__":
    sys.exit(main())
