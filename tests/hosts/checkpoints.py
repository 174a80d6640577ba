"""Watching an elastic job from outside, for the tests that take hosts or Ray nodes away while it runs: its durable
checkpoints on disk, and waiting for one to appear (tests/hosts/test_elastic.py, tests/ray/test_ray.py)."""
import json
import subprocess
import time
from pathlib import Path


def checkpoints(ckpt: Path) -> list[dict]:
    """The durable checkpoints on disk, oldest first: step, world size and when each was written."""
    found = []
    for manifest in ckpt.glob("ckpt-*/manifest.json"):
        try:
            meta = json.loads(manifest.read_text())["meta"]
            found.append({"step": meta["position"]["step"], "world_size": meta["world_size"],
                          "time": manifest.stat().st_mtime})
        except (OSError, ValueError, KeyError):
            continue  # written or pruned while we looked
    return sorted(found, key=lambda c: c["step"])


def newest(ckpt: Path, world_size: int, after: float = 0.0, step: int = 0) -> dict | None:
    """The newest checkpoint of ``world_size`` workers written after ``after`` at ``step`` or later, or None."""
    written = [c for c in checkpoints(ckpt) if c["world_size"] == world_size and c["time"] > after
               and c["step"] >= step]
    return written[-1] if written else None


def wait_for(condition, what: str, timeout: float, job: subprocess.Popen | None = None):
    """``condition()``'s first true value, polled every 0.1 s; fails after ``timeout`` s, or as soon as ``job`` (the
    job being watched) has ended."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert job is None or job.poll() is None, f"the job ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.1)
    return value
