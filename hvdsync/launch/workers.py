"""Stop the worker processes of a launch that will not finish on its own: a timeout, an exception in the caller.

Horovod's launcher waits for its workers in *non-daemon* threads. If the caller gives up (a time limit raises in the
main thread, a test framework's timeout), the workers keep running, and the interpreter cannot exit until they do,
which for a hung job is never. So :mod:`hvdsync.launch.local` stops them itself: it first asks every worker for its Python
stacks (``faulthandler`` on :data:`STACKS_SIGNAL`, registered by the worker at start) so the log says where the job
hung, then sends SIGTERM, then SIGKILL to whatever is left.
"""
from __future__ import annotations

import signal
import time

import psutil

# A worker registers faulthandler for this signal (hvdsync.launch.worker.entry): it prints every thread's stack.
STACKS_SIGNAL = signal.SIGUSR1
# How Horovod's function launcher starts each worker (``python -m horovod.runner.run_task ADDR PORT``).
_WORKER_MODULE = "horovod.runner.run_task"


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _is_worker(proc: psutil.Process) -> bool:
    # The worker itself, not the ``/bin/sh -c "env ... python -m horovod.runner.run_task"`` that starts it.
    cmd = _cmdline(proc)
    return cmd[1:3] == ["-m", _WORKER_MODULE]


def _is_shared_helper(proc: psutil.Process) -> bool:
    # multiprocessing's resource tracker lives as long as this process and serves later launches too.
    return any("resource_tracker" in part for part in _cmdline(proc))


class Workers:
    """The processes started below this one after construction (a launch's middlemen, shells, workers and their
    DataLoader processes), to stop them when the launch is abandoned."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._before = {p.pid for p in self._me.children(recursive=True)}

    def started(self) -> list[psutil.Process]:
        """Descendants of this process that were not there at construction (and still exist)."""
        try:
            found = self._me.children(recursive=True)
        except psutil.Error:
            return []
        return [p for p in found if p.pid not in self._before and not _is_shared_helper(p)]

    def stop(self, grace: float = 5.0, stacks_wait: float = 1.5) -> int:
        """Ask the workers for their stacks, wait ``stacks_wait`` s for them to be written, terminate everything
        started since construction, kill what is left after ``grace`` s. Returns how many processes were stopped."""
        asked = 0
        for proc in self.started():
            if _is_worker(proc):
                try:
                    proc.send_signal(STACKS_SIGNAL)
                    asked += 1
                except psutil.Error:
                    pass
        if asked:
            time.sleep(stacks_wait)
        procs = self.started()
        # Workers first: their middlemen then see them exit and report it to Horovod's launcher threads.
        procs.sort(key=lambda p: not _is_worker(p))
        for proc in procs:
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace)
        return len(procs)
