"""Runs inside each of 2 Horovod workers (sent by value): the tracked runs that tests/parallel/test_tracking.py
asserts on, several fits in one pair of workers (a Horovod start costs seconds).

The faults are injected from the test, through the public ``build`` / ``before_step`` hooks: a desynchronised rank
(rank 1 nudges one parameter before a given step, which no broadcast repairs) and a slow rank (rank 1 sleeps before
every step).
"""
import hashlib
import time


def fit_keeping_backend(cfg, before_step=None):
    """``hvdsync.torch.fit`` that also returns the backend (to read the model and to inject faults)."""
    from hvdlab.fitting import fit_with
    from hvdsync.torch import init
    from hvdsync.torch.train import build

    held = {}

    def build_and_keep(cfg, data):
        held["backend"] = build(cfg, data)
        return held["backend"]

    hook = (lambda epoch, step: before_step(held["backend"], epoch, step)) if before_step else None
    return fit_with(init, build_and_keep, cfg, before_step=hook), held["backend"]


def params_digest(backend) -> str:
    return hashlib.sha256(b"".join(p.tobytes() for p in backend.parameters())).hexdigest()


def faults(desync_step: int, slow_seconds: float):
    """A ``before_step`` for rank 1: sleep ``slow_seconds`` every step; nudge a weight before ``desync_step``."""

    def hook(backend, epoch, step):
        import torch

        if backend.rank != 1:
            return
        time.sleep(slow_seconds)
        if epoch == 0 and step == desync_step:
            with torch.no_grad():
                next(backend.model.parameters()).view(-1)[0] += 1e-3

    return hook


def run_job(clean: dict, faulty: dict, deterministic: dict, embedded: dict, desync_step: int, slow_seconds: float):
    """The clean run (tracked to the server, timeline on), the faulty run, and the same deterministic config twice:
    once tracked to the server, once to the embedded store. Returns each fit's result and parameter digest."""
    from hvdsync.config import Config

    out = {}
    for name, raw, hook in (("clean", clean, None), ("faulty", faulty, faults(desync_step, slow_seconds)),
                            ("det_server", deterministic, None), ("det_embedded", embedded, None)):
        result, backend = fit_keeping_backend(Config.from_dict(raw), hook)
        out[name] = {**result.to_dict(), "digest": params_digest(backend)}
    return out


def run_long(raw: dict, step_seconds: float):
    """One tracked fit whose steps take at least ``step_seconds`` (time for the test to kill the server mid-run)."""
    from hvdsync.config import Config

    start = time.perf_counter()
    result, _ = fit_keeping_backend(Config.from_dict(raw), lambda b, e, s: time.sleep(step_seconds))
    return {**result.to_dict(), "fit_seconds": time.perf_counter() - start}
